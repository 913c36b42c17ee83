"""Turning one rank's Kineto events into emu iterations (compute / coll / wait programs).

The timeline of a step runs from its ``ProfilerStep#N`` start to its end. On it
sit the points where collectives are issued and where the rank waits for them;
compute is everything between those points that is not spent blocked, idle gaps
included (docs/capture.md explains why), so per iteration
``sum(compute) + sum(blocked) == ProfilerStep duration`` exactly.

Where a wait sits and how long it blocked:

- a blocking point-to-point launch (gloo send/recv run on the issuing thread):
  right after the issue, blocked for the launch;
- a synchronous collective (``async_op`` False): at the end of its launch, blocked
  until it completed or the thread resumed, whichever came first;
- DDP's reducer: after the last bucket is issued it waits for each bucket in turn
  and copies it back (``copy_bucket_to_grad``); a bucket blocked the thread for the
  longest idle stretch between the previous wait (or the last issue) and its
  completion, zero if it completed while the thread was busy;
- NCCL's explicit ``wait`` events: each waits for the oldest pending collective
  of its thread;
- a functional collective's ``wait_tensor`` (DTensor's tensor parallelism): the oldest
  pending collective of its thread whose tensor has the waited tensor's size, blocked from
  the wait's start until the collective completed or the wait returned;
- other asynchronous collectives on CPU traces: the idle gap of the main thread
  that holds their completion, if there is one. Idle means between the thread's
  innermost events: an autograd function or module hook that waits inside (FSDP's
  backward does) spans its wait, and its own span would hide it.

On GPU traces the CPU does not block in a wait; the GPU's compute streams do. There
a wait's blocked time is the idle time of the compute streams between the wait
and the completion, capped by how long the CPU itself waited for the GPU in the
rest of the step: a CPU-bound step is not lengthened by a stalled stream.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace

from emu.capture.collectives import CollEvent, WaitEvent, find_collectives
from emu.capture.groups import role_of, stream_numbers
from emu.capture.kineto import Event, KinetoTrace
from emu.errors import KinetoError
from emu.traces.mesh import Mesh
from emu.traces.model import Coll, CollKind, Compute, Iteration, Op, Sparsity, Wait

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DDP_COPY = "torch.distributed.ddp.reducer::copy_bucket_to_grad"
_SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"}
_FORWARD = ("DistributedDataParallel.forward", "FullyShardedDataParallel.forward")
# FSDP2 (fully_shard) marks the root module's forward by its pre- and post-forward hooks, and
# torch.distributed.pipelining each microbatch's forward and backward
_FSDP2_FORWARD = ("FSDP::root_pre_forward", "FSDP::post_forward")
_MICROBATCH = re.compile(r"^(Forward|Backward) \d+$")
_BACKWARD = "autograd::engine::evaluate_function"
_OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")


class _Busy:
    """The merged intervals in which one thread (or stream set) was doing something."""

    def __init__(self, events: list[Event]) -> None:
        spans: list[list[float]] = []
        for ev in sorted(events, key=lambda e: e.ts_us):
            if spans and ev.ts_us <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], ev.end_us)
            else:
                spans.append([ev.ts_us, ev.end_us])
        self.starts = [s[0] for s in spans]
        self.ends = [s[1] for s in spans]

    def gap_start(self, t: float, floor: float) -> float:
        """Start of the idle gap that ends at t (t itself if busy at t)."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and self.starts[i] < t < self.ends[i]:
            return t
        j = bisect.bisect_right(self.ends, t) - 1
        return max(floor, self.ends[j]) if j >= 0 else floor

    def next_start(self, t: float, ceiling: float) -> float:
        """When the thread is next busy at or after t."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and self.ends[i] > t:
            return t
        j = bisect.bisect_left(self.starts, t)
        return min(ceiling, self.starts[j]) if j < len(self.starts) else ceiling

    def idle(self, a: float, b: float) -> float:
        """Idle time inside [a, b]."""
        if b <= a:
            return 0.0
        busy = 0.0
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        while i < len(self.starts) and self.starts[i] < b:
            busy += max(0.0, min(b, self.ends[i]) - max(a, self.starts[i]))
            i += 1
        return (b - a) - busy

    def longest_gap(self, lo: float, hi: float) -> tuple[float, float]:
        """The longest idle stretch inside [lo, hi] (lo, lo if none)."""
        best = (lo, lo)
        cursor = lo
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.starts) and self.starts[i] < hi:
            if self.starts[i] > cursor and self.starts[i] - cursor > best[1] - best[0]:
                best = (cursor, self.starts[i])
            cursor = max(cursor, self.ends[i])
            i += 1
        if hi - cursor > best[1] - best[0]:
            best = (cursor, hi)
        return best

    def gap_holding(self, t: float, lo: float, hi: float) -> tuple[float, float] | None:
        """The idle gap [start, end] in [lo, hi] that contains time t, if t is idle."""
        if not lo <= t <= hi:
            return None
        start = self.gap_start(t, lo)
        if start == t and self.next_start(t, hi) == t:
            return None
        return start, self.next_start(t, hi)


@dataclass
class _WaitPlan:
    position_us: float
    ids: list[int]
    blocked_us: float
    tensors: list[tuple[int, ...]] = field(default_factory=list)
    tensor_ids: list[int] | None = None  # the buckets the shapes cover, if not just ids


@dataclass(frozen=True)
class _Context:
    """Per-file indexes the steps share."""

    kt: KinetoTrace
    main_tid: int | str
    gpu: bool
    busy: dict[int | str, _Busy]
    leaves: _Busy  # the main thread's innermost events only
    compute_streams: _Busy | None
    syncs: tuple[Event, ...]
    copies: tuple[Event, ...]
    phases: tuple[tuple[float, float, str], ...]

    def busy_of(self, tid: int | str) -> _Busy:
        return self.busy.get(tid) or self.busy[self.main_tid]


def profiler_steps(kt: KinetoTrace) -> list[tuple[int, Event]]:
    """The ProfilerStep#N spans of the CPU timeline, by step number."""
    steps = {}
    for ev in kt.events:
        m = _STEP.match(ev.name)
        if m and ev.cat in ("user_annotation", "cpu_op", ""):
            steps[int(m.group(1))] = ev
    if not steps:
        raise KinetoError(f"{kt.path}: no ProfilerStep#N events: emu needs the step boundaries; "
                          "profile with torch.profiler.profile(schedule=...) and call prof.step() "
                          "once per training step")
    return sorted(steps.items())


def _context(kt: KinetoTrace, main_tid: int | str, colls: list[CollEvent]) -> _Context:
    gpu_events = [e for e in kt.events if e.cat in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu = bool(gpu_events) and any(c.done_us is not None for c in colls) and kt.device != "cpu"
    comm_streams = {e.tid for e in gpu_events if e.name.lower().startswith("nccl")}
    cpu = [e for e in kt.events if e.cat in ("cpu_op", "cuda_runtime") and not e.name.startswith("gloo:")]
    by_tid: dict[int | str, list[Event]] = {}
    for ev in cpu:
        by_tid.setdefault(ev.tid, []).append(ev)
    by_tid.setdefault(main_tid, [])
    phases = []
    backward = [e for e in kt.events if e.name.startswith(_BACKWARD)]
    root_posts = [e for e in kt.events if e.name == _FSDP2_FORWARD[1]]
    for ev in kt.events:
        if ev.name.startswith(_FORWARD):
            phases.append((ev.ts_us, ev.end_us, "forward"))
        elif ev.name.startswith(_OPTIMIZER):
            phases.append((ev.ts_us, ev.end_us, "optimizer"))
        elif ev.name == _FSDP2_FORWARD[0]:
            post = next((p for p in root_posts if p.ts_us >= ev.ts_us and p.tid == ev.tid), None)
            if post is not None:
                phases.append((ev.ts_us, post.end_us, "forward"))
        elif ev.cat == "user_annotation" and (m := _MICROBATCH.match(ev.name)):
            phases.append((ev.ts_us, ev.end_us, m.group(1).lower()))
    # Backward has no span of its own: it runs from the first to the last autograd
    # function of a step; group them by the forward spans that separate steps.
    forwards = sorted(p[0] for p in phases if p[2] == "forward")
    groups: dict[int, list[Event]] = {}
    for ev in backward:
        groups.setdefault(bisect.bisect_right(forwards, ev.ts_us), []).append(ev)
    for evs in groups.values():
        phases.append((min(e.ts_us for e in evs), max(e.end_us for e in evs), "backward"))
    return _Context(
        kt=kt, main_tid=main_tid, gpu=gpu, busy={tid: _Busy(evs) for tid, evs in by_tid.items()},
        leaves=_Busy(_innermost(by_tid[main_tid])),
        compute_streams=_Busy([e for e in gpu_events if e.tid not in comm_streams]) if gpu else None,
        syncs=tuple(e for e in kt.events if e.cat == "cuda_runtime" and e.name in _SYNC_CALLS),
        copies=tuple(e for e in kt.events if e.name == _DDP_COPY),
        phases=tuple(sorted(phases)))


def _innermost(events: list[Event]) -> list[Event]:
    """The events that hold no other (one thread's): what it was doing, not what it was inside."""
    ordered = sorted(events, key=lambda e: (e.ts_us, -e.dur_us))
    return [e for i, e in enumerate(ordered) if i + 1 == len(ordered) or ordered[i + 1].ts_us >= e.end_us]


def _phase(ctx: _Context, a: float, b: float) -> str:
    mid = (a + b) / 2
    found = "compute"
    for start, end, name in ctx.phases:
        if start > mid:
            break
        if start <= mid < end:
            found = name  # the innermost (latest-starting) span wins
    return found


def _plan_waits(ctx: _Context, colls: list[CollEvent], waits: list[WaitEvent],
                start: float, end: float) -> list[_WaitPlan]:
    plans: list[_WaitPlan] = []
    pending = list(range(len(colls)))

    def take(ids: list[int]) -> None:
        for i in ids:
            pending.remove(i)

    for i, c in enumerate(colls):
        if c.blocking:
            # The issuing thread ran the transfer itself (gloo send/recv).
            done = max(c.launch_end_us, c.done_us or c.launch_end_us)
            plans.append(_WaitPlan(c.issue_us, [i], done - c.issue_us))
            take([i])
        elif c.async_op is False and not ctx.gpu and c.done_us is not None:
            resume = ctx.busy_of(c.tid).next_start(c.launch_end_us, end)
            plans.append(_WaitPlan(c.launch_end_us, [i], max(0.0, min(resume, c.done_us) - c.launch_end_us)))
            take([i])
    for w in waits:
        mine = [i for i in pending if colls[i].issue_us <= w.ts_us and colls[i].tid == w.tid]
        if w.count is not None:  # a tensor's wait: for a collective of its size (in or out)
            mine = [i for i in mine if w.count in (colls[i].count, colls[i].count // max(1, colls[i].group_size))]
        else:
            mine = mine or [i for i in pending if colls[i].issue_us <= w.ts_us]
        if mine:
            c = colls[mine[0]]
            blocked = 0.0
            if w.end_us is not None and not ctx.gpu and c.done_us is not None:
                blocked = max(0.0, min(w.end_us, c.done_us) - w.ts_us)
            plans.append(_WaitPlan(w.ts_us, [mine[0]], blocked))
            take([mine[0]])
    # DDP: after the last bucket is launched, the reducer waits for each bucket in turn and
    # copies it back before waiting for the next.
    copies = [e for e in ctx.copies if start <= e.ts_us < end]
    if copies and pending:
        first = copies[0]
        ids = sorted((i for i in pending if colls[i].issue_us < first.ts_us
                      and colls[i].kind == CollKind.ALL_REDUCE), key=lambda i: colls[i].issue_us)
        # the buckets are the reducer's group's (the last issued before the copies); other groups'
        # all_reduces in flight (tensor parallel's) are not DDP's
        ids = [i for i in ids if colls[i].group_name == colls[ids[-1]].group_name] if ids else ids
        if ids:
            shapes = _bucket_tensors(copies)
            if ctx.gpu or any(colls[i].done_us is None for i in ids):
                plans.append(_WaitPlan(first.ts_us, ids, 0.0, shapes))
            else:
                # Bucket i blocked the thread for its longest idle stretch between the later
                # of the last launch and the previous bucket's wait, and its completion.
                # Not the gap just before a copy: the reducer resumes with views and other
                # small ops first, and gloo's span closes a little after it released the
                # waiter. The reducer's own work is compute.
                busy = ctx.busy_of(first.tid)
                lo = max(colls[i].launch_end_us for i in ids)
                for k, i in enumerate(ids):
                    hi = max(lo, min(colls[i].done_us, end))
                    g0, g1 = busy.longest_gap(lo, hi)
                    plans.append(_WaitPlan(g0 if g1 > g0 else hi, [i], g1 - g0, shapes if k == 0 else [],
                                           tensor_ids=ids if k == 0 else None))
                    # the next wait begins when this one ended: at the thread's resume, or
                    # (no idle stretch) not before this bucket completed
                    lo = max(lo, g1 if g1 > g0 else hi)
            take(ids)
    if not ctx.gpu:
        main = ctx.leaves
        by_gap: dict[tuple[float, float], list[int]] = {}
        for i in list(pending):
            c = colls[i]
            gap = main.gap_holding(c.done_us, c.launch_end_us, end) if c.done_us is not None else None
            if gap is not None:
                by_gap.setdefault(gap, []).append(i)
        for (g0, _), ids in sorted(by_gap.items()):
            plans.append(_WaitPlan(g0, ids, max(colls[i].done_us or g0 for i in ids) - g0))
            take(ids)
    if ctx.gpu:
        _gpu_blocked(ctx, colls, plans, end)
    return plans


def _gpu_blocked(ctx: _Context, colls: list[CollEvent], plans: list[_WaitPlan], end: float) -> None:
    """Blocked time of GPU waits: stalled compute streams, capped by CPU-side syncs."""
    assert ctx.compute_streams is not None
    plans.sort(key=lambda p: p.position_us)
    if not plans:
        return
    budget = sum(min(e.end_us, end) - e.ts_us for e in ctx.syncs
                 if plans[0].position_us <= e.ts_us < end)
    for plan in plans:
        done = [colls[i].done_us for i in plan.ids if colls[i].done_us is not None]
        if not done or max(done) <= plan.position_us:
            continue
        stall = ctx.compute_streams.idle(plan.position_us, min(max(done), end))
        plan.blocked_us = min(stall, budget)
        budget -= plan.blocked_us


def _bucket_tensors(copies: list[Event]) -> list[tuple[int, ...]]:
    """Parameter shapes per bucket from the reducer's copy-back events, where recorded."""
    shapes = []
    for ev in copies:
        dims = ev.args.get("Input Dims") or []
        if not dims or not isinstance(dims[0], list):
            return []
        shapes.append(tuple(int(d) for d in dims[0]))
    return shapes


def _split_tensors(colls: list[CollEvent], ids: list[int],
                   shapes: list[tuple[int, ...]]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Assign copied-back shapes to the buckets in issue order; {} when they do not add up."""
    out: dict[int, tuple[tuple[int, ...], ...]] = {}
    k = 0
    for i in sorted(ids, key=lambda i: colls[i].issue_us):
        bucket, total = [], 0
        while k < len(shapes) and total < colls[i].count:
            n = 1
            for d in shapes[k]:
                n *= d
            bucket.append(shapes[k])
            total += n
            k += 1
        if total != colls[i].count:
            return {}
        out[i] = tuple(bucket)
    return out


def _sparse_tensor(rank: int, c: CollEvent) -> Sparsity | None:
    """An all_reduce of a sparse tensor in the trace's terms: one block per row, this rank's rows and
    the result's over the tensor's (docs/trace-format.md, ``sparse_tensor``)."""
    if c.sparse is None:
        return None
    s = c.sparse
    return Sparsity(block_elements=s.row_elements, nonzero=s.nnz[rank] / s.rows, union=s.union / s.rows,
                    sparse_tensor=True)


def _iteration(ctx: _Context, step: int, span: Event, colls: list[CollEvent],
               waits: list[WaitEvent]) -> Iteration:
    start = span.ts_us
    end = start + span.dur_us
    plans = _plan_waits(ctx, colls, waits, start, end)
    tensors: dict[int, tuple[tuple[int, ...], ...]] = {}
    for plan in plans:
        if plan.tensors:
            tensors.update(_split_tensors(colls, plan.tensor_ids or plan.ids, plan.tensors))
    # (time, order, item): colls before waits at one instant; boundaries split compute.
    points: list[tuple[float, int, object]] = []
    for i, c in enumerate(colls):
        points.append((min(max(c.issue_us, start), end), 0, i))
    for plan in plans:
        pos = max([plan.position_us] + [colls[i].issue_us for i in plan.ids])
        points.append((min(max(pos, start), end), 1, plan))
    for a, b, _ in ctx.phases:
        for t in (a, b):
            if start < t < end:
                points.append((t, 2, None))
    points.sort(key=lambda p: (p[0], p[1], p[2].position_us if isinstance(p[2], _WaitPlan) else 0))
    ops: list[Op | _WaitPlan] = []
    t, debt = start, 0.0

    def compute(a: float, b: float) -> None:
        nonlocal debt
        dur = b - a
        take = min(dur, debt)
        debt -= take
        dur -= take
        if dur <= 0:
            return
        name = _phase(ctx, a, b)
        last = ops[-1] if ops else None
        if isinstance(last, Compute) and last.name == name:
            ops[-1] = Compute(name=name, dur_us=last.dur_us + dur)
        else:
            ops.append(Compute(name=name, dur_us=dur))

    for when, _, item in points:
        compute(t, when)
        t = when
        if isinstance(item, int):
            c = colls[item]
            ops.append(Coll(
                id=item, kind=c.kind, dtype=c.dtype, count=c.count, bytes=c.count * c.dtype.itemsize,
                group_size=c.group_size,
                observed_us=None if c.done_us is None else max(0.0, c.done_us - c.issue_us),
                root=c.root, peer=c.peer, group=c.group, tensors=tensors.get(item),
                sparsity=_sparse_tensor(ctx.kt.rank, c), group_role=c.role, stream=c.stream, splits=c.splits))
        elif isinstance(item, _WaitPlan):
            ops.append(item)
            debt += item.blocked_us
    compute(t, end)
    if debt > 0:
        # Blocked time can only overrun the step's end through clock skew between
        # threads; take it back from the last waits so the total stays the step.
        for item in reversed(ops):
            if isinstance(item, _WaitPlan) and debt > 0:
                back = min(debt, item.blocked_us)
                item.blocked_us -= back
                debt -= back
    program = tuple(Wait(ids=tuple(sorted(op.ids)), blocked_us=op.blocked_us)
                    if isinstance(op, _WaitPlan) else op for op in ops)
    return Iteration(step=step, measured_us=span.dur_us, ops=program)


def _with_groups(kt: KinetoTrace, colls: list[CollEvent], mesh: Mesh | None) -> list[CollEvent]:
    """Each collective's role in the mesh and its stream (``emu.capture.groups``): by the GPU stream
    its kernel ran on where every one has a kernel, else by its group."""
    table = kt.group_table()
    keys = [c.stream_key for c in colls] if colls and all(c.stream_key is not None for c in colls) \
        else [c.group_name or ("" if c.group is None else ",".join(map(str, c.group))) for c in colls]
    streams = stream_numbers(keys)
    return [replace(c, role=role_of(table.get(c.group_name or ""), c.group or (), kt.world_size, mesh), stream=st)
            for c, st in zip(colls, streams, strict=True)]


def convert_rank(kt: KinetoTrace, mesh: Mesh | None = None) -> list[Iteration]:
    """All profiled steps of one rank as emu iterations; ``mesh``: the job's, which gives each
    collective's group its role."""
    steps = profiler_steps(kt)
    main_tid = steps[0][1].tid
    colls, waits = find_collectives(kt)
    colls = _with_groups(kt, colls, mesh)
    ctx = _context(kt, main_tid, colls)
    iterations = []
    for step, span in steps:
        inside = [c for c in colls if span.ts_us <= c.issue_us < span.end_us]
        step_waits = [w for w in waits if span.ts_us <= w.ts_us < span.end_us]
        iterations.append(_iteration(ctx, step, span, inside, step_waits))
    return iterations
