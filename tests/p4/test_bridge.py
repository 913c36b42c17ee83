"""The bridge to BMv2 (emu/p4/bridge.py) against a stand-in that loses frames as BMv2 does.

Before the bridge had barriers and resends, one frame BMv2 dropped deadlocked the stream: emu's
retransmission timers arm only for losses its own link model decides. These tests run without
BMv2 (tests/p4/fake_bmv2.py); tests/p4/test_bmv2_replay.py runs the same on a real one.
"""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator import fabric as fabrics
from emu.emulator.links.topology import Hierarchy, Topology
from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import AggregationSwitch
from emu.errors import ConfigError, RunFailed
from emu.p4 import bridge
from emu.p4.bridge import Bmv2Pool
from emu.p4.fabric import Bmv2Fabric
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path
from tests.p4.fake_bmv2 import FakeBmv2

M, SLOTS = 4, 8


def batch(rounds: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every worker's contributions to ``rounds`` x SLOTS slot copies, a retransmission among them."""
    rng = np.random.default_rng(seed)
    rows = []
    for chunk in range(rounds * SLOTS):
        for w in range(M):
            rows.append((chunk, w))
    rows.insert(M * 3 + 1, (2, 1))  # worker 1 sends chunk 2 again after the copy completed: answered
    h = np.zeros(len(rows), wire.AGG_HEADER)
    h["msg_type"], h["num_workers"], h["size"] = wire.MsgType.CONTRIB, M, 1
    h["chunk"] = [c for c, _ in rows]
    h["worker"] = [w for _, w in rows]
    h["slot"] = h["chunk"] % SLOTS
    h["flags"] = (h["chunk"] // SLOTS) % 2
    h["exponent"] = rng.integers(-4, 4, len(rows))
    payload = rng.integers(-1000, 1000, (len(rows), 64)).astype(np.int32)
    stamps = np.repeat(np.arange(len(rows), dtype=np.float64)[:, None], 2, axis=1)
    return h, payload, stamps


def same(a, b) -> None:
    assert np.array_equal(a.headers, b.headers)
    assert np.array_equal(a.payload, b.payload)
    assert np.array_equal(a.stamps, b.stamps)


def test_results_are_the_protocols_with_bmv2s_sums() -> None:
    h, p, s = batch()
    fake = FakeBmv2(M, SLOTS)
    pool = Bmv2Pool(SLOTS, M, 64, 0, fake)
    got = pool.process(h, p, s)
    same(got, AggregationSwitch(SLOTS, M, 64).process(h, p, s))
    assert len(got) == SLOTS + 1  # every copy's multicast, and the retransmission's answer
    stats = pool.stats.as_dict()
    assert stats["bridge_frames"] == len(h) and stats["bridge_differs"] == 0 and stats["bridge_resent"] == 0
    # one barrier each BARRIER_ROWS frames: never more in flight
    assert stats["bridge_barriers"] == -(-len(h) // bridge.BARRIER_ROWS)


@pytest.mark.parametrize("drop_in, drop_out", [({5}, set()), (set(), {3, 40}), ({0, 17}, {9})])
def test_frames_bmv2_lost_are_resent_and_counted(drop_in, drop_out) -> None:
    h, p, s = batch()
    pool = Bmv2Pool(SLOTS, M, 64, 0, FakeBmv2(M, SLOTS, drop_in=frozenset(drop_in), drop_out=frozenset(drop_out)))
    same(pool.process(h, p, s), AggregationSwitch(SLOTS, M, 64).process(h, p, s))
    assert pool.bridge.resent > 0 and pool.bridge.differs == 0


def test_a_lost_barrier_is_sent_again(monkeypatch) -> None:
    monkeypatch.setattr(bridge, "BARRIER_TIMEOUT_S", 0.05)
    h, p, s = batch()
    pool = Bmv2Pool(SLOTS, M, 64, 0, FakeBmv2(M, SLOTS, drop_flush=1))
    same(pool.process(h, p, s), AggregationSwitch(SLOTS, M, 64).process(h, p, s))
    assert pool.bridge.barrier_resends == 1


def test_a_switch_that_never_answers_fails_naming_its_log(monkeypatch) -> None:
    monkeypatch.setattr(bridge, "BARRIER_TIMEOUT_S", 0.02)
    h, p, s = batch()
    pool = Bmv2Pool(SLOTS, M, 64, 0, FakeBmv2(M, SLOTS, drop_flush=99), lambda: "BMv2's log: /tmp/x.log")
    with pytest.raises(RunFailed, match=r"barrier back on every port .* BMv2's log: /tmp/x.log"):
        pool.process(h, p, s)


def test_a_result_bmv2_never_gives_stops_the_run() -> None:
    h, p, s = batch()
    lost = frozenset(range(10_000))  # every result frame
    pool = Bmv2Pool(SLOTS, M, 64, 0, FakeBmv2(M, SLOTS, drop_out=lost))
    with pytest.raises(RunFailed, match="did not send .* results the protocol gives"):
        pool.process(h, p, s)


class _FakeFabric(Bmv2Fabric):
    """bmv2's fabric with the stand-in for BMv2: no switch to start, ports in the switch process."""

    name = "bmv2-stand-in"

    def check_available(self) -> None:
        pass

    def external_switch(self, workers: int, slots: int):
        import contextlib

        return contextlib.nullcontext()

    def pool(self, slots: int, workers: int, elements: int, job: int):
        return Bmv2Pool(slots, workers, elements, job, FakeBmv2(workers, slots, drop_in=frozenset({7, 900})))


def test_replay_through_the_bridge_gives_inas_numbers(no_children) -> None:
    """The whole path of --fabric bmv2 on the synchronized clock, BMv2 stood in for (losing two
    frames): the same emulated numbers as ina's software switch."""
    fabrics.register(_FakeFabric)
    mlp = load_trace(sample_path("mlp"))
    reports = {f: replay(mlp, ReplayConfig(workers=4, fabric=f, iters=1, payload_scale=256))
               for f in ("ina", _FakeFabric.name)}
    ina, fake = reports["ina"], reports[_FakeFabric.name]
    assert fake.verification.ok and fake.verification.mismatches == 0
    assert [it.emulated_us for it in fake.iterations] == [it.emulated_us for it in ina.iterations]
    assert fake.summary.bytes_sent == ina.summary.bytes_sent
    assert fake.fabric.packets == ina.fabric.packets and fake.fabric.results == ina.fabric.results
    assert fake.emulator.windows == ina.emulator.windows
    bridge = fake.fabric.bridge
    assert ina.fabric.bridge is None and bridge is not None
    assert bridge.frames == fake.fabric.packets + bridge.resent and bridge.resent > 0 and bridge.differs == 0
    # in one process (--processes 0), the bridge in the orchestrator's: the same numbers
    one = replay(mlp, ReplayConfig(workers=4, fabric=_FakeFabric.name, iters=1, payload_scale=256, processes=0))
    assert [it.emulated_us for it in one.iterations] == [it.emulated_us for it in ina.iterations]
    assert one.verification.ok and one.fabric.bridge is not None and one.fabric.bridge.resent == bridge.resent


@pytest.mark.parametrize("sample, refused", [
    ("fsdp", "collective 0, an all_gather, aggregates on the switch under --fabric ina"),
    ("tp", "an all_reduce of a sub-group of 2"),
    ("dlrm", "a sparse all_reduce, .*, or dense \\(--sparsity none\\)"),
])
def test_what_the_program_cannot_run_is_refused_by_name(sample: str, refused: str) -> None:
    """On ina these aggregate on the switch; bmv2 once ran them silently as rings (or dense)."""
    fabrics.register(_FakeFabric)
    with pytest.raises(ConfigError, match=refused):
        replay(load_trace(sample_path(sample)), ReplayConfig(workers=8, fabric=_FakeFabric.name, iters=1))


def test_a_topology_is_refused_on_bmv2() -> None:
    topo = Topology(workers_per_node=2, leaf_ports=2, algorithm=Hierarchy.HIERARCHICAL)
    with pytest.raises(ConfigError, match="a topology runs on the software fabrics .*one port per worker"):
        ReplayConfig(workers=8, fabric="bmv2", topology=topo).check()
