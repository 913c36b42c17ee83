"""A fake worker: runs its program in emulated time, without a GPU and without sleeping.

Compute advances the worker's clock; a collective is issued onto its communication stream
(FIFO, as NCCL's and gloo's: the rank's one stream, or the one its ``stream`` names, where a
trace's groups run concurrently on streams of their own) and the program goes on; a wait
blocks the clock until the listed collectives completed. An iteration ends when
its last op ran and all its collectives completed; the next begins then. The
host decides when (in emulated time) each of these happens and moves the bytes;
the worker only keeps the books.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from emu.emulator.links.array import uniform
from emu.emulator.protocol.rows import split_at
from emu.replay.plan.programs import WorkerProgram
from emu.traces.model import Coll, Compute, GroupRole, Wait

_SPAN_LIMIT = 200_000  # spans kept per worker for the Chrome trace


@dataclass
class CollRun:
    """One issued collective on one worker."""

    op: Coll
    seq: int
    issue_us: float
    start_us: float | None = None
    end_us: float | None = None


def complete_by_run(ids: np.ndarray, runs: np.ndarray, ends: np.ndarray,
                    completed: Callable[[np.ndarray, CollRun, np.ndarray], None]) -> None:
    """Workers ``ids`` completed the runs ``runs`` (objects; a cohort's members share one) at
    ``ends``: ``completed`` once a run with all its workers, runs in the order their first worker
    comes. Pieces of a split cohort interleave by worker id, so this is not the order of calls one
    worker at a time (a run's workers come together); nothing emulated depends on the order of
    calls at one emulated time (docs/design-notes.md, "Cohorts": checked by running them in
    reverse), and the golden set and the identity tests of cohorts hold it."""
    keys = np.fromiter(map(id, runs), np.int64, len(runs))
    if not len(keys):
        return
    if (keys == keys[0]).all():
        completed(ids, runs[0], ends)
        return
    for sel in groups(keys):
        completed(ids[sel], runs[sel[0]], ends[sel])


def groups(values: np.ndarray) -> list[np.ndarray]:
    """The positions of each distinct value (ascending), the groups in the order their first
    position comes: one sort, not a comparison per group."""
    order = np.argsort(values, kind="stable")
    cuts = np.flatnonzero(values[order][1:] != values[order][:-1]) + 1
    return sorted(split_at(order, cuts), key=lambda g: int(g[0]))


@dataclass
class IterationRecord:
    index: int
    start_us: float
    end_us: float = 0.0
    compute_us: float = 0.0
    blocked_us: float = 0.0
    comm_us: float = 0.0


@dataclass
class WorkerState:
    program: WorkerProgram
    iters: int
    straggle: float = 1.0  # compute slow-down factor of this worker
    noise_sigma: float = 0.0  # per-op lognormal compute noise
    seed: int = 0
    ops_run: int = 0
    it: int = 0
    op: int = 0
    t: float = 0.0
    records: list[IterationRecord] = field(default_factory=list)
    colls: dict[int, CollRun] = field(default_factory=dict)  # this iteration's, by trace id
    # per stream: issued, not yet completed, in order
    streams: dict[int, list[CollRun]] = field(default_factory=dict)
    waiting: tuple[int, ...] | None = None
    # When a stream's last completed collective ended: a completion can be known (from stamps)
    # before the worker's clock reaches it, and the stream's next collective may not start earlier.
    stream_free_us: dict[int, float] = field(default_factory=dict)
    finished: bool = False
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)  # (cat, name, start, end)
    # collectives done, by their group's role (None: no role; its value, "", in reports: ``roles_done``)
    completed: dict[GroupRole | None, int] = field(default_factory=dict)
    timed: bool = False  # keep every completed collective's times (``coll_times``)
    coll_times: list[tuple[int, int, float, float]] = field(default_factory=list)  # iteration, id, start, end
    keep_spans: bool = True  # record ``spans`` (only where the report's Chrome trace asks for them)

    def span(self, cat: str, name: str, start: float, end: float) -> None:
        if self.keep_spans and len(self.spans) < _SPAN_LIMIT and end >= start:
            self.spans.append((cat, name, start, end))


class FakeWorker:
    """Program execution of one worker; ``start_coll`` and ``resume_at`` are the host's."""

    def __init__(self, state: WorkerState, start_coll: Callable[[FakeWorker, CollRun], None],
                 resume_at: Callable[[FakeWorker, float], None], members: list[int] | None = None,
                 token: int = 0, pause: Callable[[FakeWorker], None] | None = None, kind: object = None) -> None:
        """``members``: the workers that run this program in step, as one (a cohort:
        ``emu.replay.host.cohorts``; None: the program's own worker alone); ``token``: its name in
        the host's events; ``pause``: the host's, called where an iteration ended and the next
        may begin (None: it begins at once); ``kind``: what its members share (cohorts of one kind
        may merge)."""
        self.s = state
        self._start_coll = start_coll
        self._resume_at = resume_at
        self._pause = pause
        self.token = token
        self.kind = kind
        self.paused = False  # stopped between two iterations, for the host to go on (``pause``)
        # per member that joined from another cohort: its iterations' records from before
        self.history: dict[int, list[IterationRecord]] = {}
        self.set_members(members or [state.program.worker])

    def set_members(self, members: list[int]) -> None:
        self.members = members
        self.w = members[0]
        self.size = len(members)
        self.ids = np.asarray(members, np.int64)
        self.at: int | np.ndarray = members[0] if len(members) == 1 else self.ids

    def records_of(self, w: int) -> list[IterationRecord]:
        """Member ``w``'s iterations, from the first."""
        return self.history.get(w, []) + self.s.records

    def _noise(self) -> float:
        s = self.s
        s.ops_run += 1
        if not s.noise_sigma:
            return 1.0
        u = uniform(s.seed + 77, np.array([self.w * 2, self.w * 2 + 1]), np.array([s.ops_run, s.ops_run]))
        z = math.sqrt(-2.0 * math.log(max(u[0], 1e-300))) * math.cos(2 * math.pi * u[1])
        return math.exp(s.noise_sigma * z - s.noise_sigma**2 / 2)

    def _iteration(self):
        its = self.s.program.iterations
        return its[self.s.it % len(its)]

    def begin(self) -> None:
        self.s.records.append(IterationRecord(index=0, start_us=self.s.t))
        self.run()

    def run(self) -> None:
        """Execute ops until the worker must wait for time or for a collective."""
        s = self.s
        self.paused = False
        ops = self._iteration().ops
        while not s.finished:
            if s.op >= len(ops):
                if not self._end_iteration():
                    return
                if self._pause is not None and not s.finished:
                    self.paused = True
                    self._pause(self)
                    return
                ops = self._iteration().ops
                continue
            op = ops[s.op]
            if isinstance(op, Compute):
                dur = op.dur_us * s.straggle * self._noise()
                s.span("compute", op.name, s.t, s.t + dur)
                s.records[-1].compute_us += dur
                s.t += dur
                s.op += 1
                # another compute next, not the iteration's last op: nothing reaches a computing
                # worker, so it runs on to that one's end without an event between them (the last
                # stays apart: a collective done meanwhile wakes a worker past its last op)
                if s.op + 1 < len(ops) and isinstance(ops[s.op], Compute):
                    continue
                self._resume_at(self, s.t)
                return
            if isinstance(op, Coll):
                run = CollRun(op=op, seq=s.program.seq(s.it, len(s.colls)), issue_us=s.t)
                s.colls[op.id] = run
                stream = s.streams.setdefault(op.stream or 0, [])
                stream.append(run)
                s.op += 1
                if len(stream) == 1:
                    run.start_us = max(s.t, s.stream_free_us.get(op.stream or 0, 0.0))
                    self._start_coll(self, run)
                continue
            assert isinstance(op, Wait)
            if not self._wait(op.ids):
                return
            s.op += 1

    def _wait(self, ids: tuple[int, ...]) -> bool:
        s = self.s
        runs = [s.colls[i] for i in ids]
        if any(r.end_us is None for r in runs):
            s.waiting = ids
            return False
        s.waiting = None
        end = max((r.end_us for r in runs), default=s.t)
        if end > s.t:
            s.span("wait", "wait", s.t, end)
            s.records[-1].blocked_us += end - s.t
            s.t = end
        return True

    def _end_iteration(self) -> bool:
        s = self.s
        if not self._wait(tuple(s.colls)):
            return False
        rec = s.records[-1]
        rec.end_us = s.t
        rec.comm_us = union_us((r.issue_us, r.end_us) for r in s.colls.values())
        s.it += 1
        s.op = 0
        s.colls = {}
        if s.it >= s.iters:
            s.finished = True
            return True
        s.records.append(IterationRecord(index=s.it, start_us=s.t))
        return True

    def completed(self, run: CollRun, end_us: float) -> None:
        """The host reports that a collective finished on this worker at ``end_us``."""
        s = self.s
        own = s.colls.get(run.op.id)
        if own is not None and own is not run and own.seq == run.seq:
            run = own  # a cohort split since the collective started: the endpoints hold the first's
        run.end_us = max(end_us, run.start_us or end_us)
        role = run.op.group_role
        s.completed[role] = s.completed.get(role, 0) + 1
        key = run.op.stream or 0
        s.stream_free_us[key] = max(s.stream_free_us.get(key, 0.0), run.end_us)
        if s.keep_spans:
            s.span("comm", run.op.kind.value, run.start_us or run.issue_us, run.end_us)
        if s.timed:
            s.coll_times.append((s.it, run.op.id, run.start_us if run.start_us is not None else run.issue_us,
                                 run.end_us))
        stream = s.streams[key]
        stream.remove(run)
        if stream:
            nxt = stream[0]
            nxt.start_us = max(nxt.issue_us, run.end_us)
            self._start_coll(self, nxt)
        if s.waiting is not None and all(s.colls[i].end_us is not None for i in s.waiting):
            self._resume_at(self, max(s.t, max(s.colls[i].end_us for i in s.waiting)))
        elif s.op >= len(self._iteration().ops) and all(r.end_us is not None for r in s.colls.values()):
            self._resume_at(self, max([s.t] + [r.end_us for r in s.colls.values()]))


def copy_state(s: WorkerState) -> WorkerState:
    """A worker's state for a cohort split off (``emu.replay.host.cohorts``): its own records and
    collectives' times, the program and the collectives' ops shared (the host knows an op by its id)."""
    runs = {id(r): replace(r) for r in [*s.colls.values(), *(r for v in s.streams.values() for r in v)]}
    return replace(s, records=[replace(r) for r in s.records], colls={k: runs[id(r)] for k, r in s.colls.items()},
                   streams={k: [runs[id(r)] for r in v] for k, v in s.streams.items()},
                   stream_free_us=dict(s.stream_free_us), spans=list(s.spans), completed=dict(s.completed),
                   coll_times=list(s.coll_times))


def roles_done(state: WorkerState) -> dict[str, int]:
    """A worker's completed collectives by their group's role, as reports name it ("": none)."""
    return {("" if role is None else role.value): n for role, n in state.completed.items()}


def union_us(spans) -> float:
    """The total length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
