"""A link whose bandwidth changes over emulated time (``--bandwidth-schedule``): exact times
across a change, the identity without one, and replays between the constant ones."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.links.array import LinkArray
from emu.emulator.links.spec import Capacity, LinkSpec, parse_schedule
from emu.errors import ConfigError

STEPS = parse_schedule("0s:10Gbps,1ms:1Gbps,2ms:10Gbps")


def test_a_packet_across_a_change_takes_each_rate_for_its_part() -> None:
    spec = LinkSpec(bandwidth_bps=1e10, schedule=STEPS, latency_us=2.0)
    # 12,500 bytes: 10 us at 10 Gb/s. From 995 us: 6,250 bytes in 5 us, the rest at 1 Gb/s in 50 us
    got = LinkArray(spec, np.arange(1), 0, 0).transmit(np.array([0]), np.array([995.0]), np.array([12500.0]))
    assert got.last_us[0] == pytest.approx(1050.0 + 2.0)
    seg = LinkArray(spec, np.arange(1), 0, 0).send_segment(0, 995.0, 12500.0, 1)
    assert seg[1] == pytest.approx(1052.0)
    # a FIFO queue through both changes: the second packet starts when the first is done
    link = LinkArray(spec, np.arange(1), 0, 0)
    two = link.transmit(np.array([0, 0]), np.array([1990.0, 1990.0]), np.array([1250.0, 12500.0]))
    assert two.last_us.tolist() == pytest.approx([2002.0, 2002.0 + 10.0])  # 1 250 B: 10 us at 1 Gb/s
    assert link.free_us[0] == pytest.approx(2010.0)


def test_no_schedule_is_the_identity_and_bad_steps_are_refused() -> None:
    cap = Capacity(LinkSpec(bandwidth_bps=1e10))
    t = np.array([-5.0, 0.0, 12.5, 1e9])
    assert not cap.active and np.array_equal(cap.to(t), t) and np.array_equal(cap.back(t), t)
    stepped = Capacity(LinkSpec(bandwidth_bps=1e10, schedule=STEPS))
    assert np.allclose(stepped.back(stepped.to(t)), t)
    with pytest.raises(ConfigError, match="start at 0s"):
        LinkSpec(bandwidth_bps=1e10, schedule=((5.0, 1e10),))
    with pytest.raises(ConfigError, match="start at 0s"):
        LinkSpec(bandwidth_bps=1e9, schedule=STEPS)  # the first step is the link's bandwidth
    with pytest.raises(ConfigError, match="TIME:BANDWIDTH"):
        parse_schedule("100Gbps")


@pytest.mark.slow
def test_a_replay_under_a_schedule_lies_between_the_constant_ones(no_children) -> None:
    from emu.replay import ReplayConfig, replay
    from emu.traces import load_trace, sample_path

    mlp = load_trace(sample_path("mlp"))

    def run(link: LinkSpec) -> float:
        r = replay(mlp, ReplayConfig(workers=4, fabric="ina", iters=2, payload_scale=64, link=link))
        assert r.verification.ok
        return r.summary.iteration_us_median

    fast, slow = run(LinkSpec(bandwidth_bps=100e9)), run(LinkSpec(bandwidth_bps=10e9))
    # 100 Gb/s for the first iteration's compute, then 10 Gb/s
    mixed = run(LinkSpec(bandwidth_bps=100e9, schedule=((0.0, 100e9), (20_000.0, 10e9))))
    assert fast < mixed <= slow + 1.0


# ina's takes 24 s here, and test_clock checks ina's layouts: the default run keeps ring's and ps's
@pytest.mark.parametrize("fabric", ["ring", pytest.param("ps", marks=pytest.mark.slow),
                                    pytest.param("ina", marks=pytest.mark.slow)])
def test_a_schedule_replays_the_same_on_any_process_layout(fabric: str, no_children) -> None:
    from dataclasses import replace

    from emu.replay import ReplayConfig, replay
    from emu.traces import load_trace, sample_path
    from tests.replay.test_clock import exact_part

    link = LinkSpec(bandwidth_bps=100e9, schedule=((0.0, 100e9), (20_000.0, 10e9), (60_000.0, 25e9)),
                    loss=0.01, jitter_us=1.0)
    cfg = ReplayConfig(workers=4, fabric=fabric, iters=2, payload_scale=64, link=link)
    mlp = load_trace(sample_path("mlp"))
    first, second = (exact_part(replay(mlp, replace(cfg, processes=p))) for p in (1, 2))
    assert first == second and first["verification"]["ok"]
    assert first["config"]["bandwidth_schedule"] == [[0.0, 100e9], [20_000.0, 10e9], [60_000.0, 25e9]]


@pytest.mark.parametrize("fabric", ["ring", pytest.param("ina", marks=pytest.mark.slow)])
def test_a_schedule_reaches_the_leaves_links_to_the_spine(fabric: str, no_children) -> None:
    """The NICs' schedule, scaled as their rate is, paces the leaf-spine links too: a schedule that
    is at 100 Gb/s from the first microsecond replays as the constant 100 Gb/s (it gave +28% and a
    "non-blocking" spine 32% busy when the spine kept the schedule's first step)."""
    from emu.emulator.links.topology import Topology
    from emu.replay import ReplayConfig, replay
    from emu.traces import load_trace, sample_path

    mlp = load_trace(sample_path("mlp"))
    topo = Topology(workers_per_node=1, nics_per_node=1, leaf_ports=2)
    runs = [replay(mlp, ReplayConfig(workers=8, fabric=fabric, iters=1, processes=0, topology=topo, link=link))
            for link in (LinkSpec(bandwidth_bps=1e11),
                         LinkSpec(bandwidth_bps=1e10, schedule=parse_schedule("0s:10Gbps,1us:100Gbps")))]
    const, scheduled = (r.iterations[0].emulated_us for r in runs)
    assert scheduled == pytest.approx(const, rel=1e-6)
    spine = [r.fabric.utilisation["leaf to spine"].max for r in runs]
    assert spine[1] == pytest.approx(spine[0], rel=1e-6)


def test_point_to_point_segments_get_jitter_both_ways() -> None:
    """A segment's uplink delays it by a draw in [0, jitter), as its downlink does (the uplink gave
    none), the same for the same link and count whatever the process."""
    spec = LinkSpec(bandwidth_bps=1e10, latency_us=5.0, jitter_us=20.0)
    ser = 1500 * 8e6 / 1e10

    def extras(direction: int) -> list[float]:
        link = LinkArray(spec, np.arange(2), 7, direction)
        out = []
        for k in range(8):
            t = 1000.0 * k
            if direction == 0:
                first, _, _ = link.send_segment(1, t, 1500.0, 1)
                out.append(first - t - ser - 5.0)
            else:
                done, _ = link.receive_segment(1, t, t, 1500.0, 1)
                out.append(done - t - ser - 5.0)
        return out

    up, down = extras(0), extras(1)
    for got in (up, down):
        assert all(0.0 <= x < 20.0 for x in got) and len(set(np.round(got, 9))) == len(got)
    assert extras(0) == up  # keyed, not random


def test_the_leaves_links_to_the_spine_get_jitter_both_ways() -> None:
    """A leaf's link to the spine delays each row by a draw in [0, jitter), as a NIC does (it gave
    none: loss and jitter were the NICs' alone), each way, keyed by the link and the row's number."""
    from emu.emulator.links.topology import Topology
    from emu.replay.host.leaves import LeafStage

    spine = Topology(workers_per_node=1, leaf_ports=2).spine_link(LinkSpec(bandwidth_bps=1e10, jitter_us=20.0))
    assert spine.jitter_us == 20.0 and spine.loss == 0.0

    def extras(direction: int) -> list[float]:
        stage = LeafStage(np.array([0, 3]), spine, seed=7)
        out = []
        for k in range(8):
            t = np.array([1000.0 * k, 1000.0 * k])
            first, _ = stage._transmit(direction, np.array([0, 1]), t, t, np.array([1500.0, 1500.0]), np.ones(2))
            out += list(first - t - float(spine.serialization_us(1500.0)) - spine.latency_us)
        return out

    up, down = extras(0), extras(1)
    for got in (up, down):
        assert all(0.0 <= x < 20.0 for x in got) and len(set(np.round(got, 9))) == len(got)
    assert up != down and extras(0) == up  # each way its own draws; keyed, not random


@pytest.mark.slow
@pytest.mark.parametrize("fabric", ["ring", "ina"])
def test_leaf_jitter_is_the_same_on_any_process_layout(fabric: str, no_children) -> None:
    from emu.emulator.links.topology import Topology
    from emu.replay import ReplayConfig, replay
    from emu.traces import load_trace, sample_path

    mlp = load_trace(sample_path("mlp"))
    topo = Topology(workers_per_node=1, leaf_ports=2, oversubscription=2)
    times = [[it.emulated_us for it in replay(mlp, ReplayConfig(
        workers=8, fabric=fabric, iters=1, processes=p, topology=topo,
        link=LinkSpec(bandwidth_bps=1e10, jitter_us=2.0))).iterations] for p in (0, 2)]
    assert times[0] == times[1]
