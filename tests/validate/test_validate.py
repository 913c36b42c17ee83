"""emu validate: the link fit, the error arithmetic, and one real case end to end."""

from __future__ import annotations

import subprocess

import pytest

from emu.traces import Coll, CollKind, Dtype, Iteration, RankProgram, Source, Trace, TraceMeta, Wait
from emu.validate import Setting, fit_link, run_validation
from emu.validate.core import CaseKind, _case, _summary
from emu.validate.netns import available


def trace_with(times: dict[int, float], overlapping: bool = False) -> Trace:
    """One iteration of all_reduces of these element counts and observed times, one after the
    other (each waited for), or all issued at once."""
    ops = []
    for i, (count, observed) in enumerate(times.items()):
        ops.append(Coll(id=i, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=count, bytes=4 * count,
                        group_size=2, observed_us=observed))
        if not overlapping:
            ops.append(Wait(ids=(i,), blocked_us=observed))
    if overlapping:
        ops.append(Wait(ids=tuple(range(len(times))), blocked_us=max(times.values())))
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=2, backend="gloo", device="cpu", framework="t",
                     dtype="float32", captured_at="x")
    return Trace(meta=meta, ranks=(RankProgram(0, (Iteration(0, 1.0, tuple(ops)),)),))


def test_alpha_beta_fit_recovers_the_link() -> None:
    bw, lat = 1e9, 30.0  # 1 Gb/s, 30 us per hop; ring of 2: 2 hops, 1 x bytes
    times = {n: 2 * lat + 4 * n * 8 / bw * 1e6 for n in (100_000, 1_000_000, 5_000_000)}
    fit = fit_link(trace_with(times))
    assert fit.method == "alpha-beta"
    assert fit.bandwidth_bps == pytest.approx(bw, rel=1e-6) and fit.latency_us == pytest.approx(lat, rel=1e-6)


def test_flat_times_fall_back_to_the_bandwidth_bound() -> None:
    fit = fit_link(trace_with({1_000_000: 5000.0, 4_000_000: 4000.0}))
    assert fit.method == "bandwidth bound" and fit.latency_us == 0
    assert fit.bandwidth_bps == pytest.approx(4_000_000 * 4 * 8 / 4000e-6)


def test_overlapping_collectives_fit_the_busy_period() -> None:
    # gloo runs two buckets at once: 16 MB and 8 MB sharing a 300 Mb/s link both end late;
    # an alpha-beta fit of these would find a latency of a hundred milliseconds.
    fit = fit_link(trace_with({4_000_000: 717_000.0, 2_000_000: 528_000.0}, overlapping=True))
    assert fit.method == "busy period" and fit.latency_us == 0
    assert fit.bandwidth_bps == pytest.approx(6_000_000 * 4 * 8 / 0.717)


def test_implausible_latency_falls_back_to_the_bandwidth_bound() -> None:
    fit = fit_link(trace_with({4_000_000: 717_000.0, 2_000_000: 528_000.0}))
    assert fit.method == "bandwidth bound"


def test_error_arithmetic() -> None:
    cases = [_case("a", CaseKind.SAME, 100.0, 1.0, 103.0), _case("b", CaseKind.SAME, 200.0, 1.0, 190.0),
             _case("c", CaseKind.EXTRAPOLATED, 100.0, 1.0, 120.0)]
    assert [c.error_pct for c in cases] == pytest.approx([3.0, -5.0, 20.0])
    s = _summary(cases)
    assert s["same_mean_abs_error_pct"] == pytest.approx(4.0) and s["same_max_abs_error_pct"] == pytest.approx(5.0)
    assert s["extrapolated_max_abs_error_pct"] == pytest.approx(20.0)
    assert s["mean_abs_error_pct"] == pytest.approx(28 / 3) and s["max_abs_error_pct"] == pytest.approx(20.0)


def test_a100_calibrated_case(no_children) -> None:
    report = run_validation(models=(), settings=())
    (case,) = report.cases
    assert case.kind == "calibrated" and 219_000 < case.measured_us < 225_000
    assert abs(case.error_pct) < 2.0


def test_one_real_case(no_children) -> None:
    setting = Setting("300Mbit/25MB", 300e6, 25) if available() is None else Setting("unshaped/25MB", None, 25)
    report = run_validation(models=("mlp",), settings=(setting,), steps=3, a100_trace=None)
    (case,) = report.cases
    assert case.kind == "same" and case.measured_us > 0 and case.predicted_us > 0
    assert case.error_pct == pytest.approx(100 * (case.predicted_us - case.measured_us) / case.measured_us)
    if available() is None:
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "emu-v" not in netns  # every namespace it made, it removed
        assert abs(case.error_pct) < 15  # the link dominates at 300 Mbit/s; FIDELITY.md has the real figures
