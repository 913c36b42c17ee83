"""Summaries of a trace: what ``emu inspect`` prints, as data.

Per iteration the program is laid on a timeline (compute and blocked waits in
order), so that each collective's issue time is known and communication can be
measured against compute: the communication time is the union of the
collectives' issue-to-completion intervals (where the capture observed them),
the exposed part is the time spent blocked in waits, the rest overlapped.
Where the capture measured gradient sparsity (``Coll.sparsity``), it is summed up
over the all_reduces that carry it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from emu.traces.model import CaptureNoise, Coll, CollKind, Compute, Iteration, Trace, Wait
from emu.traces.noise import profiler_overhead, spread


@dataclass(frozen=True)
class CollStats:
    """One kind of collective (with its dtype, and its group's role where the trace names one),
    per iteration of one rank."""

    kind: str
    dtype: str
    per_iteration: int
    bytes_per_iteration: int
    elements_per_iteration: int
    role: str | None = None  # dp, fsdp, tp, pp, ep or other (docs/parallelism.md)


@dataclass(frozen=True)
class SparsityStats:
    """Gradient block sparsity over the all_reduces that carry it, of every rank in the file.

    Fractions of blocks: ``nonzero`` the blocks a rank's gradient had non-zero, ``union`` those
    non-zero on at least one rank of the captured job; as the median over the all_reduces and as
    their mean weighted by each all_reduce's bytes (what a sparse all_reduce would send).
    """

    block_elements: int | None  # None when the all_reduces were measured with different blocks
    all_reduces: int  # that carry sparsity
    all_reduces_total: int  # in the file, with or without it
    nonzero_median: float
    union_median: float
    nonzero_weighted: float
    union_weighted: float
    sparse_tensors: int = 0  # of them, all_reduces of a sparse tensor (their blocks are rows)


@dataclass(frozen=True)
class TraceSummary:
    model: str | None
    source: str
    backend: str
    device: str
    world_size: int
    ranks_in_file: tuple[int, ...]
    iterations: int
    params: int | None
    batch_size: int | None
    step_us_median: float
    step_us_min: float
    step_us_max: float
    compute_us_median: float
    comm_us_median: float | None
    exposed_comm_us_median: float
    overlap_pct: float | None
    collectives: tuple[CollStats, ...]
    gaps: tuple[str, ...] = ()  # what the source trace lacked (meta.gaps): values that are bounds, not measures
    sparsity: SparsityStats | None = None  # where the capture measured it (built-in workloads)
    mesh: str | None = None  # the job's device mesh (dp=2,tp=2), where the trace records one
    experts: int | None = None  # a mixture of experts' experts (meta.experts), where recorded
    params_per_expert: int | None = None
    # per step (iteration index), the largest all_to_all split over its mean, over every rank in
    # the file and every all_to_all of the step (1.0: even); empty where the trace has no all_to_all
    all_to_all_imbalance: tuple[float, ...] = ()
    # the profiled steps' spread (std over mean: durations, compute), computed here for any trace;
    # the machine's load and the reasons not to trust the steps, where the trace records them
    step_cv: float = 0.0
    compute_cv: float = 0.0
    rank_cv: float = 0.0
    noise: CaptureNoise | None = None
    # how much longer the profiled steps took than the capture's own unprofiled ones (0.1: 10%),
    # where the capture timed those (emu.traces.noise.profiler_overhead)
    profiler_overhead: float | None = None


def iteration_comm_us(it: Iteration) -> float | None:
    """Union of issue-to-completion intervals of an iteration's collectives.

    None when a collective has no observed time (the source did not say).
    """
    t = 0.0
    spans: list[tuple[float, float]] = []
    for op in it.ops:
        if isinstance(op, Compute):
            t += op.dur_us
        elif isinstance(op, Wait):
            t += op.blocked_us or 0.0
        else:
            if op.observed_us is None:
                return None
            spans.append((t, t + op.observed_us))
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def sparsity_stats(trace: Trace) -> SparsityStats | None:
    """The sparsity of the trace's all_reduces, or None when none carries it."""
    reduces = [op for r in trace.ranks for it in r.iterations for op in it.ops
               if isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE]
    measured = [op for op in reduces if op.sparsity is not None]
    if not measured:
        return None
    blocks = {op.sparsity.block_elements for op in measured if op.sparsity is not None}
    total = sum(op.bytes for op in measured)

    def weighted(fraction: list[float]) -> float:
        if not total:  # only empty all_reduces: no bytes to weigh by
            return statistics.fmean(fraction)
        return sum(f * op.bytes for f, op in zip(fraction, measured, strict=True)) / total

    nonzero = [op.sparsity.nonzero for op in measured if op.sparsity is not None]
    union = [op.sparsity.union for op in measured if op.sparsity is not None]
    return SparsityStats(
        block_elements=blocks.pop() if len(blocks) == 1 else None, all_reduces=len(measured),
        all_reduces_total=len(reduces), nonzero_median=statistics.median(nonzero),
        union_median=statistics.median(union), nonzero_weighted=weighted(nonzero), union_weighted=weighted(union),
        sparse_tensors=sum(1 for op in measured if op.sparsity is not None and op.sparsity.sparse_tensor))


def all_to_all_imbalance(trace: Trace) -> tuple[float, ...]:
    """Per step, the largest all_to_all split over its mean (``Splits.imbalance``), the worst of
    every rank and all_to_all of the step; an all_to_all without splits is even (1.0)."""
    steps = max((len(r.iterations) for r in trace.ranks), default=0)
    out = []
    for k in range(steps):
        a2a = [op for r in trace.ranks if k < len(r.iterations) for op in r.iterations[k].colls
               if op.kind == CollKind.ALL_TO_ALL]
        if a2a:
            out.append(max(op.splits.imbalance if op.splits is not None else 1.0 for op in a2a))
    return tuple(out) if len(out) == steps else ()


def summarize(trace: Trace) -> TraceSummary:
    """Medians over every iteration of every rank in the file."""
    its = [it for r in trace.ranks for it in r.iterations]
    steps = [it.measured_us for it in its]
    comm = [iteration_comm_us(it) for it in its]
    known = [c for c in comm if c is not None]
    exposed = statistics.median(it.blocked_us for it in its)
    comm_med = statistics.median(known) if len(known) == len(comm) else None
    overlap = None
    if comm_med:
        overlap = max(0.0, 100.0 * (1.0 - exposed / comm_med))
    stats: dict[tuple[str, str, str | None], list[int]] = {}
    first = trace.ranks[0]
    n = len(first.iterations)
    for it in first.iterations:
        for op in it.colls:
            role = op.group_role.value if op.group_role is not None else None
            row = stats.setdefault((op.kind.value, op.dtype.value, role), [0, 0, 0])
            row[0] += 1
            row[1] += op.bytes
            row[2] += op.count
    collectives = tuple(
        CollStats(kind=k, dtype=d, per_iteration=round(v[0] / n), bytes_per_iteration=v[1] // n,
                  elements_per_iteration=v[2] // n, role=role)
        for (k, d, role), v in sorted(stats.items(), key=lambda kv: -kv[1][1]))
    m = trace.meta
    cvs = spread(trace)
    return TraceSummary(
        model=m.model, source=m.source.value, backend=m.backend, device=m.device,
        world_size=m.world_size, ranks_in_file=tuple(r.rank for r in trace.ranks),
        iterations=n, params=m.params, batch_size=m.batch_size,
        step_us_median=statistics.median(steps), step_us_min=min(steps), step_us_max=max(steps),
        compute_us_median=statistics.median(it.compute_us for it in its),
        comm_us_median=comm_med, exposed_comm_us_median=exposed, overlap_pct=overlap,
        collectives=collectives, gaps=m.gaps, sparsity=sparsity_stats(trace),
        mesh=m.mesh.text() if m.mesh is not None else None, all_to_all_imbalance=all_to_all_imbalance(trace),
        experts=m.experts.count if m.experts else None,
        params_per_expert=m.experts.params_per_expert if m.experts else None,
        step_cv=cvs[0], compute_cv=cvs[1], rank_cv=cvs[2], noise=m.noise, profiler_overhead=profiler_overhead(trace),
    )
