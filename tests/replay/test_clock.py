"""The synchronized clock: reports identical whatever the process layout, run after run; the wall
clock measures every event's lag; zero lookahead still works."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import Clock, Straggler
from emu.replay.host.lag import LagHistogram
from emu.replay.plan.hosts import host_layout
from emu.traces import load_trace, sample_path
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective
from tests import golden

# everything that depends on the machine, not on the emulation
_MACHINE = {"wall_s", "cpu_percent", "processes", "run_s", "events", "real_bytes"}


def exact_part(report) -> dict[str, Any]:
    doc = report.to_dict()
    doc["emulator"] = {k: v for k, v in doc["emulator"].items() if k not in _MACHINE}
    doc["config"] = {k: v for k, v in doc["config"].items() if k != "processes"}
    return doc


@pytest.fixture(scope="module")
def mlp():
    return load_trace(sample_path("mlp"))


@pytest.mark.parametrize("fabric", [pytest.param("ina", marks=pytest.mark.slow), "ring",
                                    pytest.param("ps", marks=pytest.mark.slow)])
def test_identical_across_process_layouts(mlp, fabric: str, no_children) -> None:
    """Loss, jitter and stragglers on: every random draw is keyed by what it is about, and every
    link sees its packets in emulated-time order, so 1, 2 and 4 host processes agree exactly, and
    a parameter server's shards on one host or two (``ReplayConfig.shard_hosts``: two beside 4)."""
    link = LinkSpec(bandwidth_bps=25e9, latency_us=2.0, loss=0.01, jitter_us=1.0)
    config = ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=64, link=link,
                          stragglers=(Straggler.parse("lognormal:0.1"),))
    reports = [replay(mlp, replace(config, processes=p)) for p in (1, 2, 4, 0)]
    servers = [(1, 1, 2)[i] if fabric == "ps" else 0 for i in range(3)]  # the shards' host processes
    first = exact_part(reports[0])
    assert first["emulator"]["clock"] == "sync" and first["emulator"]["trustworthy"]
    assert first["emulator"]["reordered"] == 0 and first["emulator"]["tdf"] is None
    assert first["verification"]["ok"] and first["fabric"]["packets_lost"] > 0
    for r in reports[1:]:  # processes=0: the switch and every host in this one process
        assert exact_part(r) == first
    assert [r.emulator.processes for r in reports] == [p + s + 1 for p, s in zip((1, 2, 4), servers, strict=True)] + [1]
    assert reports[-1].emulator.real_bytes == 0  # nothing crossed a socket


def test_a_jobs_shards_take_one_host_in_one_process_and_two_beside_it() -> None:
    """In one process a host is not run beside another, only its window's fixed cost is paid once
    more, so the shards share one; beside three or more workers' hosts, two sum them side by side. The reports
    agree whichever (``test_identical_across_process_layouts``, processes 0 against 1, 2 and 4)."""
    config = ReplayConfig(workers=64, fabric="ps", iters=1)
    assert config.one_process and config.shard_hosts == 1
    assert [replace(config, processes=p).shard_hosts for p in (1, 2, 3, 4)] == [1, 1, 2, 2]
    one = host_layout(None, [64], [64], config.host_processes, config.shard_hosts)
    assert one.shards == (((0, 64),),) and set(one.endpoint_host[64:]) == {1}
    two = host_layout(None, [64], [64], 2, 2)
    assert two.shards == (((0, 32), (32, 64)),) and set(two.endpoint_host[64:]) == {2, 3}


def test_identical_real_loss_recovery(no_children) -> None:
    """At payload scale 1 the links drop real rows and the stream's timers resend them through the
    switch (duplicates answered from its shadow copies): still identical across layouts."""
    trace = single_collective(CollKind.ALL_REDUCE, 250_000)
    config = ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=1, link=LinkSpec(loss=0.01))
    reports = [replay(trace, replace(config, processes=p)) for p in (1, 2, 4, 0)]
    first = exact_part(reports[0])
    assert first["verification"]["ok"] and first["fabric"]["retransmissions"] > 0
    assert first["fabric"]["duplicates"] > 0 and first["fabric"]["lost"] > 0
    for r in reports[1:]:
        assert exact_part(r) == first


@pytest.mark.slow
def test_identical_run_after_run(mlp, no_children) -> None:
    config = ReplayConfig(workers=8, fabric="ina", iters=2, payload_scale=64, link=LinkSpec(loss=0.005))
    a, b = replay(mlp, config), replay(mlp, config)
    assert exact_part(a) == exact_part(b)
    assert a.emulator.windows and a.emulator.windows > 10


@pytest.mark.parametrize("fabric", [pytest.param("ina", marks=pytest.mark.slow), "ring"])
def test_zero_lookahead(mlp, fabric: str, no_children) -> None:
    """Ideal links (no latency, infinite bandwidth): windows become rounds at one emulated time,
    ties broken by (time, kind, endpoint); the data stays exact and the step is faster than on
    real links (what is left of communication is waiting for the slower rank's gradients)."""
    config = ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=64,
                          link=LinkSpec(bandwidth_bps=float("inf"), latency_us=0.0))
    assert config.lookahead_us() == 0
    a = replay(mlp, config)
    b = replay(mlp, replace(config, processes=1))
    assert a.verification.ok and exact_part(a) == exact_part(b)
    real = replay(mlp, replace(config, link=LinkSpec()))
    assert a.iterations[0].emulated_us < real.iterations[0].emulated_us


def test_wall_clock_counts_every_event(mlp, no_children) -> None:
    r = replay(mlp, ReplayConfig(workers=2, fabric="ring", iters=1, payload_scale=64, tdf=0.05))
    assert r.emulator.clock == "wall" and r.emulator.tdf == 0.05
    assert r.emulator.lag_us_p99 is not None and r.emulator.lag_us_max >= r.emulator.lag_us_p99 >= 0
    assert r.emulator.windows is None


def test_lag_histogram_quantiles() -> None:
    h = LagHistogram()
    h.add_many(np.r_[np.zeros(980), np.full(20, 100.0)])
    assert h.n == 1000 and h.max_us == 100.0
    assert h.quantile(0.5) == 0.0
    assert 100.0 <= h.quantile(0.99) <= 100.0  # capped at the maximum seen
    other = LagHistogram.from_dict(h.to_dict())
    assert other.n == h.n and other.quantile(0.99) == h.quantile(0.99)
    h.add_many(np.full(1000, 3.0))
    assert 3.0 <= h.quantile(0.9) < 3.0 * 1.06  # a bin is 6% wide, read at its upper edge


@pytest.mark.slow
def test_paced_run_without_inversions_agrees(mlp, no_children) -> None:
    """A wall-clock run slow enough that no hand-over came out of order gives the same times."""
    config = ReplayConfig(workers=2, fabric="ina", iters=1, payload_scale=256)
    sync = replay(mlp, config)
    wall = replay(mlp, replace(config, clock=Clock.WALL, tdf=20.0))
    assert wall.emulator.reordered == 0, "the paced run was not slow enough to compare"
    assert [i.emulated_us for i in wall.iterations] == pytest.approx([i.emulated_us for i in sync.iterations],
                                                                       rel=1e-9)


@pytest.mark.slow
def test_heavy_loss_at_payload_scale_is_the_same_on_every_layout(mlp, no_children) -> None:
    """10% loss at R = 64: the no-progress check (emulated timeouts per emulated packet, per chunk)
    says the same whatever the layout; the run completes, identical on 1 and 8 host processes."""
    config = ReplayConfig(workers=8, fabric="ina", iters=1, payload_scale=64, link=LinkSpec(loss=0.10))
    one, eight = replay(mlp, replace(config, processes=1)), replay(mlp, replace(config, processes=8))
    assert one.verification.ok and exact_part(one) == exact_part(eight)


@pytest.mark.slow  # make test's golden cases change if a window's span changes a number
@pytest.mark.parametrize("fabric", ["ina", "ring", "ps"])
def test_windows_past_the_uplinks_queues_change_no_number(mlp, fabric: str, monkeypatch, no_children) -> None:
    """On a slow link the uplinks are busy for a whole pool of packets: the bound that counts their
    queues (emu.replay.switch.daemon.Windows) takes far fewer windows, and every emulated number is
    what the one-latency bound gives, with jitter, stragglers and payload-scale loss on."""
    link = LinkSpec(bandwidth_bps=1e9, latency_us=2.0, loss=0.001, jitter_us=1.0)
    config = ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=16, link=link,
                          stragglers=(Straggler.parse("lognormal:0.1"),))
    assert config.queues_bound_windows()
    # the stream at one window a latency is slow to run: one 2 MB all_reduce for it
    trace = single_collective(CollKind.ALL_REDUCE, 500_000) if fabric == "ina" else mlp
    queued = [replay(trace, replace(config, processes=p)) for p in (1, 0)]
    monkeypatch.setattr(ReplayConfig, "queues_bound_windows", lambda self, inside_nodes=True: False)
    latency = replay(trace, config)
    assert exact_part(queued[0])["fabric"]["packets_lost"] > 0
    assert exact_part(queued[0]) == exact_part(queued[1])  # the layouts: the same windows, bit for bit
    # the windows batch each link's rows differently: sums rounded in another order, no more
    assert golden.differences(golden.strip(latency.to_dict()), golden.strip(queued[0].to_dict())) == []
    if fabric == "ina":  # the stream's small packets: one window a latency without the queues
        assert queued[0].emulator.windows * 10 < latency.emulator.windows


def test_windows_keep_one_latency_where_a_pass_could_miss_its_own_events() -> None:
    """Real rows lost (retransmission timers): the bound stays at one lookahead past the earliest
    event. Leaves' links do not keep it there (their queues count: Host.departures)."""
    from emu.emulator.links.topology import Topology

    assert not ReplayConfig(workers=4, link=LinkSpec(loss=0.01), payload_scale=1).queues_bound_windows()
    assert ReplayConfig(workers=4, link=LinkSpec(loss=0.01), payload_scale=8).queues_bound_windows()
    leaves = ReplayConfig(workers=8, topology=Topology(workers_per_node=2, leaf_ports=2))
    assert leaves.layout().leaves == 2 and leaves.queues_bound_windows()


def test_leaves_windows_do_not_depend_on_the_layout(mlp, no_children) -> None:
    """Eight leaves, each host some of them: a row waiting at a leaf's link down counts with its
    own leaf's NICs, not with whichever NICs its host holds (the windows differed by layout, 1,484
    in one process against 1,462 in two, every number equal)."""
    from emu.emulator.links.topology import Topology

    link = LinkSpec(bandwidth_bps=10e9, latency_us=2.0, jitter_us=1.0)
    config = ReplayConfig(workers=16, fabric="ring", iters=1, payload_scale=64, link=link,
                          topology=Topology(workers_per_node=2, leaf_ports=2),
                          stragglers=(Straggler.parse("lognormal:0.3"),))
    one, two = (replay(mlp, replace(config, processes=p)) for p in (0, 2))
    assert exact_part(one) == exact_part(two)


@pytest.mark.parametrize("fabric,algorithm", [("ina", "flat"), ("ina", "hierarchical"), ("ring", "flat")])
def test_leaves_links_ahead_of_the_window_change_no_number(fabric: str, algorithm: str, monkeypatch,
                                                           no_children) -> None:
    """Four leaves at 2:1, a slow jittery link: the leaves' links send what no later row can come
    before (Host.leaf_horizon) and the bound counts their queues, in far fewer windows than one a
    lookahead, with every emulated number of those (to float rounding), the same on every layout."""
    import math

    from emu.emulator.links.topology import Hierarchy, Topology
    from emu.replay.host.runtime import Host

    link = LinkSpec(bandwidth_bps=10e9, latency_us=2.0, jitter_us=1.0)
    topo = Topology(workers_per_node=2, leaf_ports=2, oversubscription=2, algorithm=Hierarchy(algorithm))
    config = ReplayConfig(workers=8, fabric=fabric, iters=1, payload_scale=16, link=link, topology=topo,
                          stragglers=(Straggler.parse("lognormal:0.1"),))
    trace = single_collective(CollKind.ALL_REDUCE, 500_000, iterations=2)
    ahead = [replay(trace, replace(config, processes=p)) for p in (0, 2)]
    monkeypatch.setattr(ReplayConfig, "queues_bound_windows", lambda self, inside_nodes=True: False)
    monkeypatch.setattr(Host, "leaf_horizon", lambda self, bound, into, quiet_us=(): into.fill(-math.inf))
    latency = replay(trace, replace(config, processes=0))
    assert ahead[0].verification.ok and ahead[0].fabric.busiest_link["kind"] is not None
    assert exact_part(ahead[0]) == exact_part(ahead[1])
    assert golden.differences(golden.strip(latency.to_dict()), golden.strip(ahead[0].to_dict())) == []
    assert ahead[0].emulator.windows * 2 < latency.emulator.windows


def test_a_segment_counts_where_its_endpoint_can_act_change_no_number(mlp, monkeypatch, no_children) -> None:
    """A segment waiting for a downlink (or just forwarded by the switch) can make its endpoint send
    only once it is in, a hop later: counted there, the ring at 64 workers takes a fifth fewer
    windows (644 against 834), with the same numbers, and the same windows on every layout."""
    from emu.replay.host.p2p import P2PEndpoint
    from emu.replay.switch.daemon import Windows

    config = ReplayConfig(workers=64, fabric="ring", iters=1, link=LinkSpec(bandwidth_bps=100e9))
    acting = [replay(mlp, replace(config, processes=p)) for p in (0, 2)]
    start = P2PEndpoint.__init__

    def no_hop(self, *args, **kw) -> None:  # the rule before: a segment counts where its downlink starts on it
        start(self, *args, **kw)
        self.down_hop_us = 0.0
    monkeypatch.setattr(P2PEndpoint, "__init__", no_hop)
    queued = Windows._queued

    def at_switch(self, d, held):  # ... and where the switch forwarded it
        seg_min = self.seg_min
        self.seg_min = seg_min - self.lookahead_us
        try:
            return queued(self, d, held)
        finally:
            self.seg_min = seg_min
    monkeypatch.setattr(Windows, "_queued", at_switch)
    arriving = replay(mlp, replace(config, processes=0))
    assert exact_part(acting[0]) == exact_part(acting[1]) and acting[0].verification.ok
    assert golden.differences(golden.strip(arriving.to_dict()), golden.strip(acting[0].to_dict())) == []
    assert acting[0].emulator.windows * 5 < arriving.emulator.windows * 4


def test_a_lagging_member_holds_its_pools_results_change_no_number(monkeypatch, no_children) -> None:
    """Two data-parallel pools of 32 on 8-NIC nodes: while half of a pool's members still compute,
    no result of it can leave the switch before the first of them starts its next collective, so
    their NICs do not cap the leaves' horizons at the window (``Lagging``): a ninth of the windows
    of the rule that wakes every NIC at the bound, the same numbers (to float rounding), the same
    on every layout."""
    from emu.emulator.links.topology import Topology
    from emu.emulator.protocol.window import Departures
    from emu.traces.mesh import Mesh

    trace = load_trace(sample_path("tp"))
    config = ReplayConfig(workers=64, fabric="ina", iters=1, link=LinkSpec(bandwidth_bps=10e9),
                          mesh=Mesh.of([("dp", 32), ("tp", 2)]), topology=Topology(workers_per_node=8, nics_per_node=8))
    lagging = [replay(trace, replace(config, processes=p)) for p in (0, 2)]
    monkeypatch.setattr(Departures, "quiet_us", lambda self: ())
    every_nic = replay(trace, replace(config, processes=0))
    assert exact_part(lagging[0]) == exact_part(lagging[1]) and lagging[0].verification.ok
    assert golden.differences(golden.strip(every_nic.to_dict()), golden.strip(lagging[0].to_dict())) == []
    assert lagging[0].emulator.windows * 5 < every_nic.emulator.windows


def test_a_shard_wakes_only_for_a_complete_sum_change_no_number(mlp, monkeypatch, no_children) -> None:
    """A parameter-server shard sends a sum once every worker's push is in, and its downlink
    delivers pushes in order: a push that completes no sum wakes nothing (``ShardWakes``). The
    64 workers' pushes queue at each shard's 1 Gb/s downlink: under a third of the windows of a
    wake at every push's arrival (611 against 2,059; 3,502 where a push woke at its first packet's
    time at the switch, a downlink's hop before it can act), the same numbers, on every layout."""
    import heapq

    from emu.replay.host.p2p import ShardWakes

    config = ReplayConfig(workers=64, fabric="ps", iters=1, link=LinkSpec(bandwidth_bps=1e9))
    sums = [replay(mlp, replace(config, processes=p)) for p in (0, 2)]

    def every_push(self, links, keys, t) -> None:
        for link, first in zip(links.tolist(), t.tolist(), strict=True):
            heapq.heappush(self.ready.setdefault(link, []), first)
    monkeypatch.setattr(ShardWakes, "arrive", every_push)
    pushes = replay(mlp, replace(config, processes=0))
    assert exact_part(sums[0]) == exact_part(sums[1]) and sums[0].verification.ok
    assert golden.differences(golden.strip(pushes.to_dict()), golden.strip(sums[0].to_dict())) == []
    assert sums[0].emulator.windows * 3 < pushes.emulator.windows


@pytest.mark.slow  # 11 s here: one window a hop inside a node is the slow reference
def test_node_passes_change_no_number(monkeypatch, no_children) -> None:
    """Tensor-parallel rings inside nodes run in the hosts' own passes (Host._node_passes) and the
    bound counts the queues per link and pool: far fewer windows, the numbers of one window a hop
    inside a node (to float rounding), the same on every layout."""
    from emu.emulator.links.topology import Topology
    from emu.traces.mesh import Mesh

    trace = load_trace(sample_path("tp"))
    config = ReplayConfig(workers=4, fabric="ina", iters=1, link=LinkSpec(bandwidth_bps=100e9),
                          mesh=Mesh.of([("dp", 2), ("tp", 2)]), topology=Topology(workers_per_node=2, nics_per_node=2))
    assert config.node_passes and config.queues_bound_windows()
    passes = [replay(trace, replace(config, processes=p)) for p in (0, 2)]
    monkeypatch.setattr(ReplayConfig, "node_passes", property(lambda self: False))
    hop = replay(trace, replace(config, processes=0))
    assert exact_part(passes[0]) == exact_part(passes[1])
    assert passes[0].parallelism is not None and passes[0].verification.ok
    assert golden.differences(golden.strip(hop.to_dict()), golden.strip(passes[0].to_dict())) == []
    assert passes[0].emulator.windows * 5 < hop.emulator.windows


def test_an_ideal_node_link_keeps_the_leaves_horizon(mlp) -> None:
    """Without node passes (an ideal node link: zero lookahead), segments between a node's workers
    wait with the NICs' and cross the node's own link: a busy NIC downlink does not delay them, so
    it must not put off the leaf's horizon (a review found the run stopped as a clock error)."""
    import math

    from emu.emulator.links.topology import Topology

    config = ReplayConfig(workers=8, fabric="ring", iters=2, payload_scale=64, processes=0,
                          link=LinkSpec(bandwidth_bps=10e9, latency_us=2.0),
                          topology=Topology(workers_per_node=2, leaf_ports=2,
                                            intra=LinkSpec(bandwidth_bps=math.inf, latency_us=0.0)),
                          stragglers=(Straggler.parse("lognormal:0.5"),))
    assert not config.node_passes
    assert replay(mlp, config).verification.ok
