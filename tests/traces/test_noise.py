"""A trace's noise (emu.traces.noise, docs/capture.md "Noise"): the steps' spread, the machine's
load over a capture's window, the reasons by the stated limits, and meta.noise in the format."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu.errors import TraceError
from emu.traces.io import load_trace, save_trace, trace_to_dict
from emu.traces.model import CaptureNoise, Compute, Iteration
from emu.traces.noise import (
    OTHER_CORES,
    PROFILER_OVERHEAD,
    STEP_CV,
    MachineLoad,
    assess,
    overhead_line,
    profiled_step_us,
    profiler_overhead,
    spread,
)
from tests.traces.test_io import small_trace


def _steps(trace, durations: list[float]):
    """The trace with one rank's iterations taking these durations (and as much compute)."""
    first = trace.ranks[0]
    its = tuple(Iteration(step=k, measured_us=d, ops=(Compute("compute", d), *[
        op for op in first.iterations[0].ops if not isinstance(op, Compute)])) for k, d in enumerate(durations))
    return replace(trace, ranks=(replace(first, iterations=its), *trace.ranks[1:]))


def test_the_spread_is_the_most_varied_ranks() -> None:
    trace = _steps(small_trace(), [90.0, 110.0, 100.0, 100.0])
    step_cv, compute_cv, rank_cv = spread(trace)
    assert step_cv == pytest.approx((50.0 ** 0.5) / 100.0)  # pstdev of 90, 110, 100, 100 over 100
    assert compute_cv == pytest.approx(step_cv)
    other = sum(op.dur_us for op in trace.ranks[1].iterations[0].ops if isinstance(op, Compute))
    assert rank_cv == pytest.approx(abs(100.0 - other) / (100.0 + other))  # two ranks: |a - b| / (a + b)


def test_the_limits_name_each_reason() -> None:
    steady = _steps(small_trace(), [100.0, 101.0, 99.0])
    quiet = MachineLoad(busy_s=2.05, steal_s=0.0, total_s=4.0, ranks_cpu_s=2.0, wall_s=2.0)
    assert assess(steady, quiet).busy == ()
    busy = MachineLoad(busy_s=4.0, steal_s=0.3, total_s=4.0, ranks_cpu_s=2.0, wall_s=2.0)
    noise = assess(_steps(small_trace(), [80.0, 120.0]), busy)
    assert noise.other_cores == 1.0 and noise.steal == 0.075
    assert [line.split(" ")[0] for line in noise.busy] == ["other", "the", "the"]
    assert f"(limit {OTHER_CORES})" in noise.busy[0] and f"limit {STEP_CV:.0%}" in noise.busy[2]
    assert assess(steady).other_cores is None  # an import: the spread only


def test_meta_noise_round_trips_and_is_checked(tmp_path: Path) -> None:
    noise = CaptureNoise(step_cv=0.17, compute_cv=0.18, other_cores=0.98, steal=0.0, busy=("other processes ...",))
    trace = replace(small_trace(), meta=replace(small_trace().meta, noise=noise))
    assert load_trace(save_trace(trace, tmp_path / "t.json")).meta.noise == noise
    doc = trace_to_dict(trace)
    doc["meta"]["noise"]["step_cv"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="field 'meta.noise.step_cv' is -1; give a number >= 0"):
        load_trace(tmp_path / "bad.json")


def test_the_profilers_overhead_is_the_profiled_steps_against_the_unprofiled() -> None:
    """A capture's steps past its window, timed without the profiler: the ranks' median of each
    one's median, a rank's first of three or more left out (it can hold a wait for a slower rank's
    export); the profiled steps' median against it is the overhead, and a report line says so from
    ``PROFILER_OVERHEAD``. Imports, which timed none, have neither."""
    trace = _steps(small_trace(), [110.0, 112.0, 108.0])  # rank 0's profiled steps; rank 1's as they are
    noise = assess(trace, None, [[130.0, 100.0, 99.0, 101.0], [140.0, 102.0, 98.0, 100.5]])
    assert (noise.unprofiled_step_us, noise.unprofiled_steps) == (100.25, 3)  # median of 100 and 100.5
    assert assess(trace, None, [[100.0, 90.0]]).unprofiled_step_us == 95.0  # two: both kept
    assert assess(trace, None, [[100.0], []]).unprofiled_step_us is None  # a rank timed none: not measured
    timed = replace(trace, meta=replace(trace.meta, noise=noise))
    ranks = sorted([110.0, trace.ranks[1].iterations[0].measured_us])
    assert profiler_overhead(timed) == pytest.approx(sum(ranks) / 2 / 100.25 - 1)
    assert profiler_overhead(trace) is None and overhead_line(trace) is None
    profiled = profiled_step_us(timed)
    under = replace(timed, meta=replace(timed.meta, noise=replace(noise, unprofiled_step_us=profiled / 1.02)))
    assert profiler_overhead(under) == pytest.approx(0.02) and 0.02 < PROFILER_OVERHEAD and overhead_line(under) is None
    slow = replace(timed, meta=replace(timed.meta, noise=replace(noise, unprofiled_step_us=50.0)))
    line = overhead_line(slow)
    assert line is not None and line.startswith("its profiled steps took ") and "over 3 steps" in line


def test_the_unprofiled_steps_round_trip_and_are_checked(tmp_path: Path) -> None:
    noise = CaptureNoise(step_cv=0.05, compute_cv=0.05, unprofiled_step_us=45_000.0, unprofiled_steps=5)
    trace = replace(small_trace(), meta=replace(small_trace().meta, noise=noise))
    assert load_trace(save_trace(trace, tmp_path / "t.json")).meta.noise == noise
    for key, value, message in (("unprofiled_step_us", 0, "is 0; give a time in us > 0, or null"),
                                ("unprofiled_steps", 0, "is 0; give the steps timed: at least 1 with unprofiled_step_us"),
                                ("unprofiled_step_us", None, "is 5; give the steps timed: at least 1 with "
                                 "unprofiled_step_us, 0 without")):
        doc = trace_to_dict(trace)
        doc["meta"]["noise"][key] = value
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        field = key if value is not None else "unprofiled_steps"  # steps without a time
        with pytest.raises(TraceError, match=f"field 'meta.noise.{field}' {message}"):
            load_trace(tmp_path / "bad.json")


def test_a_capture_keeps_its_steadiest_window() -> None:
    """emu capture --windows N: while the kept window's steps vary past the limit the ranks run
    again, at most N windows in all; the steadiest is kept and says how many were taken."""
    from emu.capture.run import CaptureConfig, _steadiest

    def taking(cvs: list[float]):
        made = iter(cvs)

        def take(config: CaptureConfig):
            kept.append(config.keep_kineto)
            cv = next(made)
            trace = small_trace()
            return replace(trace, meta=replace(trace.meta, noise=CaptureNoise(step_cv=cv, compute_cv=cv)))
        return take

    kept: list = []
    trace = _steadiest(CaptureConfig(windows=3, keep_kineto=Path("k")), taking([0.30, 0.12, 0.20]))
    assert trace.meta.noise.step_cv == 0.12 and trace.meta.noise.windows == 3
    assert kept == [Path("k"), Path("k/window2"), Path("k/window3")]  # each window's files apart
    trace = _steadiest(CaptureConfig(windows=3), taking([0.30, 0.05, 0.01]))
    assert trace.meta.noise.step_cv == 0.05 and trace.meta.noise.windows == 2  # steady enough: no third
    trace = _steadiest(CaptureConfig(windows=1), taking([0.30]))
    assert trace.meta.noise.windows == 1
