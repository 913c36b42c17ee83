"""``emu predict``: the analytic estimate of a replay, without running one.

The trace's programs run on the fake workers' own executor (``emu.replay.host.worker``: compute
advances the worker's clock; a collective is issued onto its stream, FIFO, and the program goes
on; a wait blocks until the listed collectives ended; an iteration ends when its last op ran and
all its collectives completed, and the next begins then; iterations reused cyclically), so a
program means here what it means in a replay, process groups and streams included. In place of
the network, every collective takes its mechanism's closed form (``emu.emulator.mechanisms``):
it starts when every member has started it (issued, its stream free) and ends its form later on
each (a send on its sender at the start, as emu's sender finishes when its segments leave). The
programs carry the replay's job-wide sparsity and compression, so each collective takes the form
of the algorithm the replay would run (docs/sparse.md, docs/compression.md). On a topology the
whole job's dense all_reduces on ``ina`` and ``ring`` take the topology's forms
(``emu.emulator.physics.topology``), and what those do not cover is refused by name.

Workers that run the same program at the same compute speed have the same timeline, so one is
simulated per (program, straggler factor) class: the cost does not grow with M (worker ``w`` of a
whole-job trace runs the program of the file's rank ``w mod len(ranks)``; M enters the formulas
only), except where each worker has its own all_to_all sizes (a mixture of experts' layout, emu
run's shifted copies): there every worker is a class. A sub-group's collective starts when the
classes among its members started it.

Stragglers: the factors are drawn exactly as the replay draws them (``straggling`` with the
configuration's seed), so a random fraction picks the same workers as a replay with the same
``--seed``; the per-op lognormal noise (sigma) is ignored, and so is jitter.

Left out (docs/physics.md, "Predictions"): queueing between collectives of different workers
that overlap on a link (the model starts a collective when the last member can, where emu lets the
early workers' segments go ahead), and between groups' collectives that share a worker's links;
loss on point-to-point links beyond one chain's expectation; where stragglers sit in sub-groups,
the members of a class wait as its first worker's groups do.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, replace

import numpy as np

from emu.emulator import mechanisms
from emu.emulator.mechanisms import Setting
from emu.errors import ConfigError
from emu.replay import (
    CollRun,
    FakeWorker,
    ReplayConfig,
    WorkerProgram,
    WorkerState,
    choose_payload_scale,
    has_subgroups,
    plan_mesh,
    programs_for,
    straggling,
)
from emu.traces.model import Coll, CollKind, Sparsity, Splits, Trace

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


@dataclass(frozen=True)
class _Class:
    """Every worker that runs one program at one compute speed (one of them is simulated)."""

    program: WorkerProgram  # its first worker's
    factor: float
    first_worker: int  # the lowest worker id in the class (the replay's tie-break for the critical one)


def _programs(trace: Trace, config: ReplayConfig) -> list[WorkerProgram]:
    """The programs to draw the classes from, checked as a replay checks them: every worker's for a
    trace with sub-groups (each worker's groups are its own); else those of workers
    0..min(M, len(ranks))-1, planned for at most about PLAN_LIMIT workers."""
    if _regrouped(trace, config) or any(op.splits is not None for r in trace.ranks for it in r.iterations
                                        for op in it.colls):  # each worker its own sizes (emu run's shift too)
        return programs_for(trace, config)
    n, r, workers = trace.meta.world_size, len(trace.ranks), config.workers
    m = workers
    if workers > PLAN_LIMIT and workers != n:
        m = PLAN_LIMIT + (workers - PLAN_LIMIT) % r  # same residue: the same last worker's program
        if m == n:
            m += r
    return programs_for(trace, config, workers=m)[:min(r, workers)]


def _regrouped(trace: Trace, config: ReplayConfig) -> bool:
    """Whether the replay runs collectives on sub-groups, or gives each worker its own sizes (a
    mixture of experts at a new layout): every worker's program is planned."""
    layout = plan_mesh(trace, config.workers, config.mesh, "the trace", config.moe_imbalance, config.seed)
    return has_subgroups(trace) or layout is not None and (layout.regroups or layout.experts is not None)


def _classes(trace: Trace, config: ReplayConfig) -> tuple[list[_Class], np.ndarray]:
    """The classes, and every worker's class."""
    programs = _programs(trace, config)
    factor, _ = straggling(config.stragglers, config.workers, config.seed)  # numpy over M, as replay draws
    whole = len(programs) < config.workers  # the first workers' programs stand for everyone's, round robin
    # an uneven all_to_all gives each worker its own sizes (a mixture of experts): a class a worker
    own = any(op.splits is not None for it in programs[0].iterations for op in it.colls)
    prog = (np.arange(config.workers) % len(programs) if whole else
            np.array([p.worker if own else p.rank for p in programs]))
    keys, first, class_of = np.unique(np.stack([prog.astype(float), factor], axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    classes = [_Class(program=programs[int(k[0]) if whole else int(w)], factor=float(k[1]), first_worker=int(w))
               for k, w in zip(keys, first, strict=True)]
    return classes, class_of.reshape(-1)


class _Forms:
    """The network of a prediction: each collective takes its mechanism's closed form once every
    class among its members has started it, and ends that much later on each (a send on its sender
    at the start, as emu's sender is done when its segments leave). The programs run on the fake
    workers' own executor (``emu.replay.host.worker``), one worker a class, completions delivered
    in time order before the programs resume at the same time, as a host hands them over."""

    def __init__(self, classes: list[_Class], class_of: np.ndarray, setting: Setting, iters: int) -> None:
        self.class_of, self.setting = class_of, setting
        self.first = [c.first_worker for c in classes]
        self.all = frozenset(range(len(classes)))
        self.workers = [FakeWorker(WorkerState(program=c.program, iters=iters, straggle=c.factor),
                                   self._start, self._resume) for c in classes]
        self.index = {id(fw): i for i, fw in enumerate(self.workers)}
        self.heap: list[tuple[float, int, int, int, CollRun | None]] = []
        self.pending: dict[tuple[frozenset[int], int], dict[int, CollRun]] = {}
        self.forms: dict[tuple[CollKind, int, str, Sparsity | None, int], float] = {}
        self._order = 0

    def run(self) -> None:
        for fw in self.workers:
            fw.begin()
        while self.heap:
            t, kind, i, _, run = heapq.heappop(self.heap)
            if run is not None:
                self.workers[i].completed(run, t)
            else:
                self.workers[i].run()
        if not all(fw.s.finished for fw in self.workers):
            raise ConfigError("the trace's waits cannot all be met (a wait names a collective that some rank never "
                              "issues, or a group's members issue different collectives): check it with emu inspect")

    def _push(self, t: float, kind: int, i: int, run: CollRun | None) -> None:
        self._order += 1
        heapq.heappush(self.heap, (t, kind, i, self._order, run))

    def _resume(self, worker: FakeWorker, t: float) -> None:
        self._push(t, 1, self.index[id(worker)], None)

    def _members(self, worker: FakeWorker, op: Coll) -> frozenset[int]:
        if op.kind in (CollKind.SEND, CollKind.RECV) and op.peer is not None:
            return frozenset((self.index[id(worker)], int(self.class_of[op.peer])))
        if op.group is None:
            return self.all
        return frozenset(int(c) for c in self.class_of[list(op.group)])

    def _start(self, worker: FakeWorker, run: CollRun) -> None:
        key = (self._members(worker, run.op), run.seq)
        if run.op.kind in (CollKind.SEND, CollKind.RECV):
            self._point_to_point(self.index[id(worker)], key, run)
            return
        entry = self.pending.setdefault(key, {})
        entry[self.index[id(worker)]] = run
        if len(entry) < len(key[0]):
            return
        del self.pending[key]
        if any(r.op.splits is not None for r in entry.values()):
            for i, end in self._exchange(entry).items():
                self._end(i, entry[i], end)
            return
        start = max(r.start_us or r.issue_us for r in entry.values())
        duration = self.form(run.op)
        for i, r in entry.items():
            self._end(i, r, start + duration)

    def _end(self, i: int, run: CollRun, end: float) -> None:
        self._push(end, 0, i, run)

    def _point_to_point(self, i: int, key: tuple[frozenset[int], int], run: CollRun) -> None:
        """A send is done when it starts (its segments leave); its receive when they arrived, or when
        it starts where they came first (the replay's early segments wait for it)."""
        start = run.start_us if run.start_us is not None else run.issue_us
        other = self.pending.pop(key, None)
        if run.op.kind == CollKind.SEND:
            self._end(i, run, start)
            if other is None:
                self.pending[key] = {-1: run}  # the receive will find when the segments left
                return
            (j, recv), = other.items()
            recv_start = recv.start_us if recv.start_us is not None else recv.issue_us
            self._end(j, recv, max(recv_start, start + self.form(run.op)))
            return
        if other is None:
            self.pending[key] = {i: run}
            return
        send = other[-1]
        sent = send.start_us if send.start_us is not None else send.issue_us
        self._end(i, run, max(start, sent + self.form(run.op)))

    def _exchange(self, entry: dict[int, CollRun]) -> dict[int, float]:
        """An uneven all_to_all's end on each member from every member's splits and start (each member
        a class of its own: a layout of experts gives every worker its own sizes): a member that
        starts early sends early, and one that receives little ends early, as in the replay."""
        op = next(iter(entry.values())).op
        members = op.group if op.group is not None else range(len(self.class_of))
        position = {w: p for p, w in enumerate(members)}
        sent: list[list[int]] = [[] for _ in members]
        starts = [0.0] * len(members)
        for i, run in entry.items():
            sent[position[self.first[i]]] = list(Splits.of(run.op).send_elements)
            starts[position[self.first[i]]] = run.start_us or run.issue_us
        if any(not row for row in sent):
            raise ConfigError(f"all_to_all {op.id} has per-peer sizes, and members of its group run one program: "
                              "emu predict needs each member's sizes; replay it (emu replay)")
        ends = mechanisms.DIRECT.exchange_ends(sent, op, self.setting, starts)
        return {i: ends[position[self.first[i]]] for i in entry}

    def form(self, op: Coll) -> float:
        """Its closed form alone on the links, to its last member's completion (``Mechanism``)."""
        key = (op.kind, op.count, op.dtype.value, op.sparsity, len(op.group) if op.group is not None else 0)
        got = self.forms.get(key)
        if got is None:
            got = self.forms[key] = mechanisms.choose(op, self.setting).time_us(op, self.setting)
        return got


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
    regrouped = _regrouped(trace, config)  # checks that a mesh given fits the trace's
    if config.topology is not None and regrouped:
        raise ConfigError("a sharded or split trace on a topology: emu predict's topology forms take the whole "
                          "job's dense all_reduces (docs/physics.md, 'On a topology'); replay it (emu replay)")
    iters = config.iters or trace.iterations
    scale = config.payload_scale or choose_payload_scale(trace, config)
    classes, class_of = _classes(trace, config)
    setting = replace(config.setting, payload_scale=scale, real_slots=max(1, -(-config.emulated_slots // scale)))
    forms = _Forms(classes, class_of, setting, iters)
    forms.run()
    times, crits = [], []
    last_end = min(fw.s.records[0].start_us for fw in forms.workers)
    for k in range(iters):  # each iteration's period, as the report's: last end to last end
        rows = [fw.s.records[k] for fw in forms.workers]
        crit = max(range(len(classes)), key=lambda j: (rows[j].end_us, -classes[j].first_worker))
        times.append(rows[crit].end_us - last_end)
        crits.append(rows[crit])
        last_end = rows[crit].end_us
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
