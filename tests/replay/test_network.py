"""The emulated network: physics, loss recovery, stragglers, and the wall clock's calibration."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.links.spec import LinkSpec, parse_bandwidth
from emu.emulator.physics import forms as physics
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import Clock, Straggler
from emu.traces import CollKind, load_trace, sample_path
from emu.traces.synthetic import single_collective

COUNT = 4_000_000  # 16 MB of float32


@pytest.fixture(scope="module")
def big_all_reduce():
    return single_collective(CollKind.ALL_REDUCE, COUNT)


def test_ina_matches_the_formula(big_all_reduce, no_children) -> None:
    link = LinkSpec(bandwidth_bps=10e9, latency_us=5.0)
    r = replay(big_all_reduce, ReplayConfig(workers=4, fabric="ina", link=link, payload_scale=64))
    emulated = r.summary.iteration_us_median
    assert emulated == pytest.approx(physics.ina_time_us(COUNT, link), rel=0.03)
    assert emulated == pytest.approx(physics.ina_detail_us(COUNT, link, 64, r.fabric.slots_emulated), rel=0.01)
    assert r.verification.ok


@pytest.mark.parametrize("workers", [2, 6])
def test_ring_matches_the_formula(big_all_reduce, workers: int, no_children) -> None:
    link = LinkSpec(bandwidth_bps=10e9, latency_us=5.0)
    r = replay(big_all_reduce, ReplayConfig(workers=workers, fabric="ring", link=link, payload_scale=16))
    formula = physics.ring_time_us(COUNT, 4, workers, link)
    assert r.summary.iteration_us_median == pytest.approx(formula, rel=0.05)
    assert r.verification.ok


@pytest.mark.slow
def test_bandwidth_scales_time(big_all_reduce, no_children) -> None:
    slow = replay(big_all_reduce, ReplayConfig(workers=4, fabric="ina", link=LinkSpec(bandwidth_bps=10e9),
                                               payload_scale=64))
    fast = replay(big_all_reduce, ReplayConfig(workers=4, fabric="ina", link=LinkSpec(bandwidth_bps=100e9),
                                               payload_scale=64))
    ratio = slow.summary.iteration_us_median / fast.summary.iteration_us_median
    assert 8.5 < ratio < 10.1  # latency and the exponent round do not scale with bandwidth


@pytest.mark.parametrize("fabric", ["ina", "ring", "ps"])
def test_exact_under_loss(fabric: str, no_children) -> None:
    cnn = load_trace(sample_path("cnn"))
    clean = replay(cnn, ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=16))
    lossy = replay(cnn, ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=16,
                                      link=LinkSpec(loss=0.10)))
    assert lossy.verification.ok and lossy.verification.mismatches == 0
    assert lossy.fabric.packets_lost > 0
    assert lossy.fabric.lost == lossy.fabric.retransmissions == 0  # at R > 1 the real rows all cross
    assert lossy.summary.bytes_sent > clean.summary.bytes_sent
    assert lossy.iterations[0].comm_us > clean.iterations[0].comm_us


def test_real_loss_recovery(no_children) -> None:
    """At payload scale 1 lost rows are real: resent by the stream's timers, answered by the switch."""
    trace = single_collective(CollKind.ALL_REDUCE, 250_000)
    r = replay(trace, ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=1, link=LinkSpec(loss=0.10)))
    assert r.verification.ok and r.verification.mismatches == 0
    assert r.fabric.lost > 0 and r.fabric.retransmissions >= r.fabric.lost
    assert r.fabric.duplicates > 0 and r.fabric.answered > 0
    assert r.fabric.packets_lost == r.fabric.lost  # one emulated packet per real row


@pytest.mark.slow
def test_loss_under_payload_scale_costs_what_real_packets_do(no_children) -> None:
    """A row standing for R packets must not cost R times a packet's loss: the mean over seeds of
    the time at R = 64 is within 12% of R = 1, and both near the tail formula of docs/physics.md."""
    trace = single_collective(CollKind.ALL_REDUCE, 1_000_000)
    link = LinkSpec(loss=0.01)
    times = {}
    for scale in (1, 64):
        times[scale] = np.mean([replay(trace, ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=scale,
                                                           link=link, seed=s)).summary.iteration_us_median
                                for s in range(3)])
    clean = replay(trace, ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=64))
    base = clean.summary.iteration_us_median
    config = ReplayConfig(workers=4, fabric="ina", link=link)
    formula = physics.ina_loss_extra_us(1_000_000, link, 4, config.emulated_slots, config.timeout_rto_us)
    assert times[64] == pytest.approx(times[1], rel=0.12)
    for t in times.values():
        assert 0.75 * formula < t - base < 1.35 * formula


def test_straggler_slows_the_job(no_children) -> None:
    cnn = load_trace(sample_path("cnn"))
    base = replay(cnn, ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=16))
    slow = replay(cnn, ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=16,
                                    stragglers=(Straggler.parse("2:1.5"),)))
    assert slow.iterations[0].critical_worker == 2
    assert slow.iterations[0].compute_us == pytest.approx(1.5 * base.iterations[0].compute_us, rel=0.25)
    assert slow.summary.iteration_us_median > 1.2 * base.summary.iteration_us_median


def test_straggler_specs() -> None:
    assert Straggler.parse("3,7:1.5") == Straggler(factor=1.5, workers=(3, 7))
    assert Straggler.parse("random:0.1:2") == Straggler(factor=2.0, fraction=0.1)
    assert Straggler.parse("lognormal:0.2") == Straggler(sigma=0.2)


@pytest.mark.slow  # wall-clock calibration probes: paced replays (about 30 s)
def test_auto_calibration(no_children) -> None:
    mlp = load_trace(sample_path("mlp"))
    r = replay(mlp, ReplayConfig(workers=2, fabric="ina", iters=1, clock=Clock.WALL))
    assert r.emulator.clock == "wall"
    assert r.emulator.calibration is not None and r.emulator.calibration["probes"]
    assert r.emulator.tdf == r.emulator.calibration["chosen_tdf"]
    assert r.emulator.payload_scale >= 1 and r.verification.ok
    assert r.emulator.trustworthy


@pytest.mark.parametrize("text, bps", [("100Gbps", 100e9), ("100Gbit", 100e9), ("100G", 100e9), ("1.5 Gb/s", 1.5e9),
                                       ("100GBps", 800e9), ("12.5GB/s", 100e9), ("400Mbps", 400e6),
                                       ("ideal", float("inf"))])
def test_bandwidth_units(text: str, bps: float) -> None:
    """A capital B is a byte: 100GBps is 800 Gbit/s, not 100."""
    assert parse_bandwidth(text) == bps


@pytest.mark.parametrize("text", ["1e400", "0bps", "100Pbps", "fast", "-5G"])
def test_bandwidth_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--bandwidth"):
        parse_bandwidth(text)


def test_waiting_for_a_straggler_is_not_a_stall(no_children) -> None:
    """No progress is counted in timeouts, not time: a worker whose collective waits for a peer 50
    times slower, with loss, is not stopped."""
    mlp = load_trace(sample_path("mlp"))
    r = replay(mlp, ReplayConfig(workers=4, fabric="ring", iters=1, payload_scale=64, link=LinkSpec(loss=0.05),
                                 stragglers=(Straggler.parse("1:50"),)))
    assert r.verification.ok and r.iterations[0].critical_worker == 1
    assert r.iterations[0].emulated_us > 40 * r.iterations[0].comm_us
