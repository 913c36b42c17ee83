"""How steady a trace's steps were, and how busy the machine was while they ran (``meta.noise``;
docs/capture.md, "Noise").

A trace freezes whatever the machine was doing: a capture beside another busy process times its
ranks' compute slowed by it, and every replay of the trace carries that. So a trace says how much
its profiled steps varied (``spread``: the durations' and the compute's standard deviation over
their mean, the most varied rank's, and the ranks' compute against each other's) and, for emu's own captures, how busy the machine was over the
profiled window (``MachineLoad``: the CPU time other processes took, from /proc/stat against the
ranks' own CPU time, and the hypervisor's steal). ``assess`` turns them into the reasons a trace
may not be a quiet machine's, by the limits below, fixed in advance:

- ``OTHER_CORES``: other processes kept at least half a core busy on average during the window
  (the ranks' compute shared the cores with them);
- ``STEAL``: the hypervisor took 5% or more of the machine's CPU time;
- ``STEP_CV``: the profiled steps' durations vary 10% or more (std over mean) on some rank.

Imported Kineto traces and ``emu run``'s live programs have the spread only: emu did not watch
their machine.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from emu.traces.model import CaptureNoise, Compute, Trace

OTHER_CORES = 0.5
STEAL = 0.05
STEP_CV = 0.10
# A capture's profiled steps this much slower than its own unprofiled ones (the steps it ran past
# its window): its compute carries the profiler's overhead, and a replay's report says so
PROFILER_OVERHEAD = 0.05


@dataclass(frozen=True)
class MachineLoad:
    """The machine over a capture's profiled window: its CPU-seconds busy (every core, not idle nor
    waiting for I/O, steal excluded), stolen, and in all, and the ranks' own CPU-seconds and the
    window's wall seconds."""

    busy_s: float
    steal_s: float
    total_s: float
    ranks_cpu_s: float
    wall_s: float

    @property
    def other_cores(self) -> float:
        """Cores other processes (not the ranks) kept busy on average over the window."""
        return max(0.0, self.busy_s - self.ranks_cpu_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steal(self) -> float:
        return self.steal_s / self.total_s if self.total_s > 0 else 0.0


def cpu_ticks() -> tuple[float, float, float] | None:
    """The machine's CPU-seconds since boot from /proc/stat: busy (user, nice, system, irq,
    softirq), stolen, and all; None where there is no /proc/stat (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = user + nice + system + irq + softirq
    return busy / hz, steal / hz, (busy + idle + iowait + steal) / hz


def spread(trace: Trace) -> tuple[float, float, float]:
    """The profiled steps' durations' and compute's std over mean, each the most varied rank's (0
    with fewer than two steps), and the ranks' median compute a step: std over mean across ranks
    (0 with one rank)."""
    steps, computes, medians = [0.0], [0.0], []
    for r in trace.ranks:
        per_step = [sum(op.dur_us for op in it.ops if isinstance(op, Compute)) for it in r.iterations]
        if per_step:
            medians.append(statistics.median(per_step))
        if len(r.iterations) < 2:
            continue
        steps.append(_cv([it.measured_us for it in r.iterations]))
        computes.append(_cv(per_step))
    return max(steps), max(computes), _cv(medians) if len(medians) > 1 else 0.0


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def profiled_step_us(trace: Trace) -> float:
    """The profiled steps' median duration: the ranks' median of each rank's median step."""
    per_rank = [statistics.median(it.measured_us for it in r.iterations) for r in trace.ranks if r.iterations]
    return statistics.median(per_rank) if per_rank else 0.0


def profiler_overhead(trace: Trace) -> float | None:
    """How much longer the capture's profiled steps took than its own unprofiled steps past the
    window (medians; 0.1: 10% longer), or None where the capture did not time any (imports, traces
    written before ``meta.noise.unprofiled_step_us``)."""
    noise = trace.meta.noise
    if noise is None or not noise.unprofiled_step_us:
        return None
    return profiled_step_us(trace) / noise.unprofiled_step_us - 1.0


def overhead_line(trace: Trace) -> str | None:
    """What a replay's reader must know of the profiler's overhead, where it reaches
    ``PROFILER_OVERHEAD``; else None."""
    overhead = profiler_overhead(trace)
    if overhead is None or overhead < PROFILER_OVERHEAD:
        return None
    noise = trace.meta.noise
    assert noise is not None and noise.unprofiled_step_us
    return (f"its profiled steps took {overhead:.0%} longer than the same capture's steps without the profiler "
            f"(median {profiled_step_us(trace) / 1e3:.1f} ms against {noise.unprofiled_step_us / 1e3:.1f} ms over "
            f"{_steps(noise.unprofiled_steps)}): the profiler's overhead")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _after_median(after: list[list[float]]) -> tuple[float | None, int]:
    """The ranks' median of each rank's median unprofiled step, and the fewest steps a rank counted.
    Of three or more, a rank's first is left out: it can hold its wait for a slower rank that was
    still exporting the window (its own export is outside it)."""
    kept = [steps[1:] if len(steps) >= 3 else steps for steps in after]
    timed = [statistics.median(steps) for steps in kept if steps]
    if not timed or len(timed) < len(kept):
        return None, 0
    return round(statistics.median(timed), 3), min(len(steps) for steps in kept)


def assess(trace: Trace, load: MachineLoad | None = None, after: list[list[float]] | None = None) -> CaptureNoise:
    """The trace's noise record: its spread, the machine's load where emu watched it, its ranks'
    unprofiled steps past the window (``after``: each rank's, in us) where it timed them, and the
    reasons (module docstring) its steps may not be a quiet machine's."""
    step_cv, compute_cv, rank_cv = spread(trace)
    unprofiled, steps = _after_median(after or [])
    busy = []
    if load is not None and load.other_cores >= OTHER_CORES:
        busy.append(f"other processes kept {load.other_cores:.1f} cores busy on average during the profiled steps "
                    f"(limit {OTHER_CORES}): the ranks' compute shared the cores with them")
    if load is not None and load.steal >= STEAL:
        busy.append(f"the hypervisor took {load.steal:.0%} of the machine's CPU time during the profiled steps "
                    f"(limit {STEAL:.0%})")
    if step_cv >= STEP_CV:
        busy.append(f"the profiled steps' durations vary {step_cv:.0%} (std over mean, limit {STEP_CV:.0%})")
    return CaptureNoise(step_cv=round(step_cv, 6), compute_cv=round(compute_cv, 6), rank_cv=round(rank_cv, 6),
                        other_cores=None if load is None else round(load.other_cores, 4),
                        steal=None if load is None else round(load.steal, 4), busy=tuple(busy),
                        unprofiled_step_us=unprofiled, unprofiled_steps=steps)
