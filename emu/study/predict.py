"""``emu predict``: the analytic estimate of a replay, without running one.

It owns the schedule model: the trace's programs run exactly as the fake workers run them
(``emu.replay.host.worker``: compute advances the worker's clock; a collective is issued onto the
worker's FIFO stream and the program goes on; a wait blocks until the listed collectives ended;
an iteration ends when its last op ran and all its collectives completed, and the next begins
then; iterations reused cyclically), but every collective takes its closed form
(its mechanism's, ``emu.emulator.mechanisms.time_us``) instead of crossing an emulated network. The programs
carry the replay's job-wide sparsity (``--sparsity``), so a sparse all_reduce on ``ring`` or ``ps``
takes its sparse closed form where the replay would run the sparse algorithm (docs/sparse.md). On a
topology a dense all_reduce on ``ina`` or ``ring`` takes the topology's form
(``emu.emulator.topology_physics``), and what those forms do not cover is refused by name.

Collective ``k`` (its number in the stream, the same on every worker) starts when every worker
has issued it and every worker's stream is free (its collective ``k-1`` ended), and ends its
closed form later on every worker (a send on its sender at the start, as emu's sender finishes
when its segments leave). Workers that run the same program at the same compute speed have the
same timeline, so one is simulated per (program, straggler factor) class: the cost does not grow
with M (worker ``w`` runs the program of the file's rank ``w mod len(ranks)``; M enters the
formulas only).

Stragglers: the factors are drawn exactly as the replay draws them (``straggling`` with the
configuration's seed), so a random fraction picks the same workers as a replay with the same
``--seed``; the per-op lognormal noise (sigma) is ignored, and so is jitter.

Left out (docs/physics.md, "Predictions"): queueing between collectives of different workers
that overlap on a link (the model starts a collective when the last worker can, where emu lets the
early workers' segments go ahead), loss on point-to-point links beyond one chain's expectation.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from emu.emulator import mechanisms
from emu.errors import ConfigError
from emu.replay import (
    CompressOption,
    IterationRecord,
    ReplayConfig,
    SparsityOption,
    WorkerProgram,
    choose_payload_scale,
    has_subgroups,
    plan_mesh,
    plan_programs,
    straggling,
    union_us,
)
from emu.traces.model import Coll, CollKind, Compute, Sparsity, Trace, Wait

# Past this many workers the programs are planned for fewer (plan_programs builds one per worker):
# the first len(ranks) workers' programs are the same at any M but for send/recv peers and
# broadcast roots, which wrap modulo the planned count (the model uses neither).
PLAN_LIMIT = 1024


@dataclass(frozen=True)
class Prediction:
    """The estimate, with the replay report's meanings (docs/design.md, "Reports")."""

    iteration_us_median: float
    iteration_us_p99: float
    compute_us: float  # of the critical (last) worker in the median iteration
    comm_us: float  # the union of its collectives' issue-to-completion intervals
    exposed_comm_us: float  # its compute blocked in waits
    iterations: tuple[float, ...]  # emulated_us of every iteration
    method: str  # one line: how the numbers were made


@dataclass
class _Class:
    """Every worker that runs one program at one compute speed."""

    program: WorkerProgram
    factor: float
    first_worker: int  # the lowest worker id in the class (the replay's tie-break for the critical one)
    t: float = 0.0
    it: int = 0
    op: int = 0
    finished: bool = False
    seqs: dict[int, int] = field(default_factory=dict)  # this iteration's trace id -> stream number
    issued: int = 0  # collectives issued so far (the next one's stream number)
    lead: float = 0.0  # how much sooner its first worker began this iteration
    lag: float = 0.0  # how far its first worker is ahead of its last since the last blocking wait
    records: list[IterationRecord] = field(default_factory=list)


def _programs(trace: Trace, workers: int, sparsity: SparsityOption | None = None,
              compress: CompressOption | None = None, switch_sums: bool = False) -> list[WorkerProgram]:
    """The programs of workers 0..min(M, len(ranks))-1, checked as a replay checks them."""
    n, r = trace.meta.world_size, len(trace.ranks)
    m = workers
    if workers > PLAN_LIMIT and workers != n:
        m = PLAN_LIMIT + (workers - PLAN_LIMIT) % r  # same residue: the same last worker's program
        if m == n:
            m += r
    return plan_programs(trace, m, sparsity=sparsity, compress=compress, job_workers=workers,
                         switch_sums=switch_sums)[:min(r, workers)]


def _classes(trace: Trace, config: ReplayConfig) -> list[_Class]:
    programs = _programs(trace, config.workers, config.sparsity, config.compress, config.switch_sums)
    factor, _ = straggling(config.stragglers, config.workers, config.seed)  # numpy over M, as replay draws
    prog = np.arange(config.workers) % len(programs)
    keys, first = np.unique(np.stack([prog.astype(float), factor], axis=1), axis=0, return_index=True)
    return [_Class(program=programs[int(k[0])], factor=float(k[1]), first_worker=int(w))
            for k, w in zip(keys, first, strict=True)]


class _Schedule:
    """The classes' programs in lockstep with the collectives' closed forms."""

    def __init__(self, classes: list[_Class], config: ReplayConfig, iters: int, scale: int) -> None:
        self.classes, self.cfg, self.iters, self.scale = classes, config, iters, scale
        self.per_iteration = classes[0].program.colls_per_iteration
        self.issue: list[dict[int, tuple[float, Coll]]] = []  # per stream number: class -> (time, op)
        self.end: list[list[float]] = []  # per stream number: per class
        self.times: dict[tuple[CollKind, int, str, Sparsity | None], float] = {}
        self.spreads: dict[tuple[CollKind, int, str, Sparsity | None], float] = {}
        self.setting = replace(config.setting, payload_scale=scale, real_slots=max(1, -(-config.emulated_slots // scale)))

    def duration_us(self, op: Coll) -> float:
        key = (op.kind, op.count, op.dtype.value, op.sparsity)
        t = self.times.get(key)
        if t is None:  # alone on the links, as its mechanism runs it (its topology form on a topology)
            mech = mechanisms.choose(op, self.setting)
            t = self.times[key] = mech.time_us(op, self.setting)
            self.spreads[key] = mech.spread_us(op, self.setting)
        return t

    def spread_us(self, op: Coll) -> float:
        return self.spreads[(op.kind, op.count, op.dtype.value, op.sparsity)]

    def run(self) -> None:
        while not all(c.finished for c in self.classes):
            moved = False
            for i, c in enumerate(self.classes):
                moved |= self._advance(i, c)
            moved |= self._resolve()
            if not moved:
                raise ConfigError("the trace's waits cannot all be met (a wait names a collective that some "
                                  "rank never issues): check it with emu inspect")

    def _resolve(self) -> bool:
        """Give every collective that all classes have issued its start and end, in stream order."""
        moved = False
        n = len(self.classes)
        while len(self.end) < len(self.issue) and len(self.issue[len(self.end)]) == n:
            k = len(self.end)
            issued = self.issue[k]
            prev = self.end[k - 1] if k else [0.0] * n
            start = max(max(issued[i][0], prev[i]) for i in range(n))
            self.end.append([start if issued[i][1].kind == CollKind.SEND else start + self.duration_us(issued[i][1])
                             for i in range(n)])
            moved = True
        return moved

    def _ended(self, i: int, seq: int) -> float | None:
        return self.end[seq][i] if seq < len(self.end) else None

    def _wait(self, i: int, c: _Class, seqs) -> bool:
        ends = [self._ended(i, s) for s in seqs]
        if any(e is None for e in ends):
            return False
        end = max(ends, default=c.t)
        if end > c.t:
            c.records[-1].blocked_us += end - c.t
            # the class's first worker got the collective that ended the wait this much sooner (its
            # spread), and goes on ahead of the last until a later wait blocks them all again
            last = max(seqs, key=lambda s: self.end[s][i])
            c.lag = min(self.spread_us(self.issue[last][i][1]), end - c.t)
            c.t = end
        return True

    def _advance(self, i: int, c: _Class) -> bool:
        """Run class i's program until it must wait for a collective; True if it moved."""
        moved = False
        its = c.program.iterations
        while not c.finished:
            if not c.records or len(c.records) <= c.it:  # its earliest worker's start
                c.records.append(IterationRecord(index=len(c.records), start_us=c.t - c.lead))
            ops = its[c.it % len(its)].ops
            if c.op >= len(ops):
                if not self._wait(i, c, c.seqs.values()):
                    return moved
                rec = c.records[-1]
                rec.end_us = c.t
                rec.comm_us = union_us((self.issue[s][i][0], self.end[s][i]) for s in c.seqs.values())
                c.lead, c.lag = c.lag, 0.0  # the replay's iteration runs from its earliest worker's start
                c.it, c.op, c.seqs = c.it + 1, 0, {}
                c.finished = c.it >= self.iters
                moved = True
                continue
            op = ops[c.op]
            if isinstance(op, Compute):
                dur = op.dur_us * c.factor
                c.records[-1].compute_us += dur
                c.t += dur
            elif isinstance(op, Coll):
                seq = c.issued
                c.issued += 1
                c.seqs[op.id] = seq
                while len(self.issue) <= seq:
                    self.issue.append({})
                self.issue[seq][i] = (c.t, op)
            else:
                assert isinstance(op, Wait)
                if not self._wait(i, c, [c.seqs[x] for x in op.ids]):
                    return moved
            c.op += 1
            moved = True
        return moved


def predict(trace: Trace, config: ReplayConfig) -> Prediction:
    """The analytic estimate of ``replay(trace, config)`` (module docstring). Raises ConfigError for
    what a replay would refuse (bad options, sub-groups that cannot be scaled), a bandwidth
    schedule (the closed forms take one bandwidth) and adaptive compression (it follows the run)."""
    config.check()
    if config.link.schedule:
        raise ConfigError("--bandwidth-schedule: emu predict's closed forms take one bandwidth; replay the schedule "
                          "(emu replay --bandwidth-schedule), or predict each step's bandwidth apart")
    if config.topology is not None:
        _check_topology(config)
    if config.packet_rate is not None and (config.topology is not None or config.compress.active):
        raise ConfigError("--packet-rate on a topology or with --compress: emu predict's pipeline form takes dense "
                          "all_reduces on one switch (docs/topology.md, 'Switch limits'); replay it (emu replay)")
    if config.compress.adaptive:
        raise ConfigError("--compress adaptive: its choices follow what the replay measures as it runs; emu predict "
                          "takes one compressor (--compress topk:R), or replay it (emu replay --compress adaptive)")
    plan_mesh(trace, config.workers, config.mesh, "the trace")  # a mesh given must fit the trace's
    if has_subgroups(trace) or any(op.stream is not None for r in trace.ranks for it in r.iterations for op in it.colls):
        mesh = trace.meta.mesh
        raise ConfigError(f"emu predict's closed forms run the collectives of the whole job on one stream; this "
                          f"trace is sharded or split ({'mesh ' + mesh.text() if mesh else 'sub-groups'}), with groups "
                          f"and streams of their own: replay it (emu replay; docs/parallelism.md)")
    iters = config.iters or trace.iterations
    scale = config.payload_scale or choose_payload_scale(trace, config)
    classes = _classes(trace, config)
    sched = _Schedule(classes, config, iters, scale)
    sched.run()
    times, crits = [], []
    for k in range(iters):
        rows = [c.records[k] for c in classes]
        start = min(r.start_us for r in rows)
        crit = max(range(len(classes)), key=lambda j: (rows[j].end_us, -classes[j].first_worker))
        times.append(rows[crit].end_us - start)
        crits.append(rows[crit])
    median = statistics.median(times)
    mid = crits[times.index(statistics.median_low(times))]
    ignored = ["queueing between overlapping collectives"]
    if any(s.sigma for s in config.stragglers):
        ignored.append("stragglers' noise")
    if config.link.jitter_us:
        ignored.append("jitter")
    link = config.link
    bw = "ideal links" if link.bandwidth_bps == float("inf") else f"{link.bandwidth_bps / 1e9:g} Gb/s"
    method = (f"closed-form collectives ({config.fabric}, {bw}, {config.workers} workers, payload scale {scale}) "
              f"on the programs' schedule ({len(classes)} worker classes); ignores {', '.join(ignored)}")
    return Prediction(iteration_us_median=median, iteration_us_p99=float(np.percentile(times, 99)),
                      compute_us=mid.compute_us, comm_us=mid.comm_us, exposed_comm_us=mid.blocked_us,
                      iterations=tuple(times), method=method)


def _check_topology(config: ReplayConfig) -> None:
    """What the forms of docs/physics.md ('On a topology') cover: dense all_reduces on ina and ring
    without loss (each collective is checked as it is met, ``_on_topology``)."""
    why = None
    if config.network.parameter_server:
        # its form holds for one all_reduce (tests/replay/test_topology_replay.py), but a schedule of
        # them alone is 4-6% fast on the shipped mlp behind shared NICs (docs/physics.md)
        why = "a parameter server"
    elif config.link.loss or config.link.jitter_us:
        why = "loss or jitter"
    elif config.compress.active:
        why = "--compress"
    elif config.sparsity.source == "option":
        why = "--sparsity"
    if why is not None:
        raise ConfigError(f"{why} on a topology: emu predict's topology forms take dense all_reduces on ina and "
                          "ring without loss (docs/physics.md, 'On a topology'); replay it (emu replay)")
