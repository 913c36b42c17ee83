"""A host process's endpoints: many fake workers (or parameter-server shards) and their links.

The host owns the links, the local events (the workers' programs, retransmission timers)
and the order of things; its aggregation endpoint (``emu.replay.host.ina``) and its
point-to-point endpoint (``emu.replay.host.p2p``) own their traffic. One process runs many endpoints and sends few, large messages: every contribution
its workers make in a window goes to the switch as one batch, and one result
message serves all of them. ``Host.advance(bound)`` handles everything due before
``bound`` in emulated time, in an order that does not depend on how the endpoints
are spread over processes:

1. downlinks: results and segments from the switch, per link in stamp order (their
   effects, arrivals at the endpoints, lie at least one lookahead later);
2. local events (a worker's program, retransmission timers) in (time, kind, endpoint)
   order;
3. uplinks: every packet and segment whose send time is before the bound, per link in
   send-time order.

Which bound, and when, is the clock's business (``emu.replay.host.loop``): the
synchronized clock's windows, or the wall clock times the dilation. What a host tells the
synchronized clock besides its next event (when its uplinks can next send, its pools' lagging
members, the leaves' horizons) is ``emu.replay.host.horizons``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from emu.emulator.links.array import GIVE_UP_ROUNDS
from emu.emulator.mechanisms import Mechanism, choose
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.protocol.transport import AggBatch, Segment, SegmentRows
from emu.errors import RunFailed
from emu.replay.config.options import ReplayConfig
from emu.replay.control.messages import HostResult, WorkerRecord
from emu.replay.host.cohorts import Cohorts, cohorts_allowed, cohorts_of
from emu.replay.host.horizons import RETX, RUN, Horizons, leaf_horizons
from emu.replay.host.ina import InaEndpoint, Pool, take
from emu.replay.host.lag import LagHistogram
from emu.replay.host.leaves import LeafStage
from emu.replay.host.p2p import P2PEndpoint
from emu.replay.host.p2p_batched import BatchedP2P
from emu.replay.host.pools import InaPools, pools_of
from emu.replay.host.wiring import Wiring
from emu.replay.host.worker import CollRun, FakeWorker, WorkerState, roles_done
from emu.replay.plan.programs import WorkerProgram, straggling

# No progress (docs/reliability.md), counted in emulated events so that the outcome does not
# depend on the machine's load. Real rows and segments: one packet resent GIVE_UP_ROUNDS times in a
# row without its result coming back, which loss alone does to a packet with probability
# loss ** GIVE_UP_ROUNDS (4e-15 at 50% loss). Only lost packets are resent, so the many timeouts
# of workers whose slots wait for a straggler's compute never count (they did: issue 31's stall
# was that). Payload scale (emulated packets, drawn per chunk as it completes): since a
# collective last completed here, more than STALL_TIMEOUTS emulated timeouts and more than
# STALL_RATIO per emulated packet position delivered.
STALL_TIMEOUTS = 1000
STALL_RATIO = 50
_STALL_EVERY = 64  # windows between checks


class NoProgress(RunFailed):
    """A collective stopped making progress (the links lose nearly everything)."""


@dataclass(frozen=True)
class HostSetup:
    """What the orchestrator hands a host process when it forks it."""

    index: int
    role: str  # "workers" or "ps"
    endpoints: tuple[int, ...]  # worker ids, or parameter-server endpoint ids
    config: ReplayConfig
    programs: tuple[WorkerProgram, ...]
    iters: int
    switch_addr: str
    control_addr: str
    spans: bool
    payload: RecordedPayload | None = None  # the real ranks' tensors to send (emu run), else generated
    job: int = 0  # its number among jobs sharing the fabric (their headers carry it)
    # jobs sharing the fabric (emu.replay.host.jobs): each job's endpoints here, and every job's configuration
    parts: tuple[HostSetup, ...] = ()
    jobs: tuple[ReplayConfig, ...] = ()
    # a sharded or split job's groups: per collective number within an iteration, its workers
    # (emu.replay.plan.programs.group_table; what parameter-server shards sum over)
    groups: tuple[tuple[int, ...] | None, ...] = ()
    # sub-groups the switch aggregates for, each a pool of its own (pool 1 + i: emu.replay.host.pools),
    # and every pool's (real, emulated) slots, the job's pool first; empty: the job's pool alone
    pools: tuple[tuple[int, ...], ...] = ()
    pool_slots: tuple[tuple[int, int], ...] = ()
    key: bytes | None = None  # several machines: the run's secret, which seals every message (emu.replay.machines.sealed)


@dataclass
class Counters:
    fallbacks: dict[str, int] = field(default_factory=dict)
    events: int = 0
    real_bytes: int = 0  # bytes of data messages this process really sent and received


class Host(Horizons):
    def __init__(self, setup: HostSetup, leaves: LeafStage | None = None) -> None:
        """``leaves``: the leaves' links, where jobs sharing the fabric share them; whoever holds
        the jobs moves their traffic (``emu.replay.host.jobs``)."""
        self.setup = setup
        self.job = setup.job
        self.own_leaves = leaves is None
        self._mechs: dict[int, Mechanism] = {}  # per op (by id): what runs it (emu.emulator.mechanisms.choose)
        self._leaf_of_link: np.ndarray | None = None  # per uplink, its leaf's index in the leaves' stage
        cfg = setup.config
        self.cfg = cfg
        self.net = cfg.network
        self.m = cfg.workers
        self.r = cfg.scale
        # local events: (time, kind, endpoint, detail, lost packets): a total order that does not
        # depend on when they were pushed
        self.heap: list[tuple[float, int, int, int, float]] = []
        self.counters = Counters()
        self.lag = LagHistogram()
        self.measure_lag = False
        self._advances = 0
        # payload scale: emulated timeouts and positions when a collective last completed here
        self._progress_mark = (0, 0)
        endpoints = np.asarray(setup.endpoints, dtype=np.int64)
        index = {int(e): i for i, e in enumerate(endpoints)}
        workers = setup.role == "workers"
        # one uplink and one downlink per endpoint (or, on a topology, per NIC), shared by its
        # aggregation and point-to-point traffic (emu.replay.host.wiring)
        self.wiring = Wiring.build(cfg, endpoints, workers, leaves)
        self.up, self.down = self.wiring.up, self.wiring.down
        self._link_of = np.zeros(int(endpoints.max(initial=0)) + 1, np.int64)  # endpoint -> its uplink
        self._own = np.zeros(len(self._link_of), bool)  # the job's endpoints held here
        self._own[endpoints] = True
        for e, i in self.wiring.link.items():
            self._link_of[e] = i
        # the heap's events by kind, for the clock's bound (``departures``) without reading the heap:
        # each worker's pending resumptions, sorted (the first per worker in ``_run_t``), and the timers
        self._runs: dict[int, list[float]] = {}
        self._run_t = np.full(len(self._link_of), math.inf)
        self._timers = 0
        if workers and setup.pools:  # a sharded or split job: the job's pool and its sub-groups'
            real, emulated = setup.pool_slots[0]
            job_pool = Pool(job=setup.job, workers=cfg.workers, real_slots=real, emulated_slots=emulated,
                            ranks=endpoints, ids=endpoints, locals=np.arange(len(endpoints), dtype=np.int64))
            pools = {0: InaEndpoint(cfg, endpoints, self.wiring, index, self._timer, self._completed,
                                    setup.payload, setup.job, pool=job_pool)}
            for pool in pools_of(endpoints, index, setup.pools, setup.pool_slots[1:]):
                pools[pool.job] = InaEndpoint(cfg, endpoints, self.wiring, index,
                                              InaPools.timer_for(pool.job, self._timer), self._completed,
                                              pool=pool)
            self.ina: InaEndpoint | InaPools = InaPools(pools, {g: 1 + i for i, g in enumerate(setup.pools)})
        else:
            self.ina = InaEndpoint(cfg, endpoints if workers else np.zeros(0, np.int64), self.wiring, index,
                                   self._timer, self._completed, setup.payload, setup.job)
        endpoint = BatchedP2P if cfg.batched_p2p else P2PEndpoint
        self.p2p = endpoint(cfg, self.net, () if workers else setup.endpoints, self.wiring, index,
                            setup.index, self._completed, setup.payload, setup.job, setup.groups)
        # the fake workers, as cohorts where they run in step (emu.replay.host.cohorts): per worker, its cohort
        self.workers: dict[int, FakeWorker] = {}
        if workers:
            self._make_workers(setup, cohorts_allowed(setup, self.p2p.split_inside))
        self.cohorts = Cohorts(self.workers, self._resume_at, lambda fw: self._runs.get(fw.token, []), self._forget)

    def _make_workers(self, setup: HostSetup, together: bool) -> None:
        cfg = self.cfg
        factor, sigma = straggling(cfg.stragglers, self.m, cfg.seed)
        for token, (kind, progs) in enumerate(cohorts_of(setup.programs, factor, sigma, together).items()):
            prog = progs[0]
            state = WorkerState(program=prog, iters=setup.iters, straggle=float(factor[prog.worker]),
                                noise_sigma=float(sigma[prog.worker]), seed=cfg.seed,
                                timed=cfg.compress.adaptive, keep_spans=setup.spans)
            fw = FakeWorker(state, self._start_coll, self._resume_at, members=[p.worker for p in progs], token=token,
                            pause=self._pause if together else None, kind=kind)
            for p in progs:
                self.workers[p.worker] = fw

    def begin(self) -> None:
        for fw in list(self.cohorts.live.values()):
            fw.begin()
        self._settle()
        self.ina.pump()

    # -- local events -----------------------------------------------------------------
    def _resume_at(self, worker: FakeWorker, t: float) -> None:
        heapq.heappush(self.heap, (t, RUN, worker.w, worker.token, 0.0))
        runs = self._runs.setdefault(worker.token, [])
        bisect.insort(runs, t)
        self._run_t[worker.at] = runs[0]

    def _forget(self, worker: FakeWorker) -> None:
        """A cohort merged into another: its resumptions are the other's (``Cohorts``)."""
        self._runs.pop(worker.token, None)

    def _pause(self, worker: FakeWorker) -> None:
        self.cohorts.pause(worker)

    def _settle(self) -> None:
        """Complete the cohorts' gathered completions; run on those stopped between iterations."""
        cohorts, heap = self.cohorts, self.heap
        while cohorts.arrived or cohorts.paused:
            cohorts.settle()
            # the cohorts stopped at a time go on once every resumption at that time ran (to meet there)
            if not cohorts.paused or (heap and heap[0][1] == RUN and heap[0][0] <= cohorts.paused[-1].s.t):
                return
            cohorts.resume_paused()

    def _timer(self, t: float, local: int, slot: int, lost: float) -> None:
        heapq.heappush(self.heap, (t, RETX, local, slot, lost))
        self._timers += 1

    def _completed(self, ws: np.ndarray, run: CollRun, ts: np.ndarray) -> None:
        """Workers ``ws`` completed ``run`` (a cohort's members share it) at ``ts``."""
        self._progress_mark = self._scaled()
        self.cohorts.arrive(ws, run, ts)

    def _scaled(self) -> tuple[int, int]:
        """Payload scale's emulated timeouts and packet positions: per chunk, the same on every
        host, so their ratio does not depend on how workers are spread over processes."""
        s = self.ina.scaled
        return (s.rounds, s.positions) if s is not None else (0, 0)

    def next_us(self) -> float:
        """The earliest emulated time at which something is left to do here (inf: nothing)."""
        self.ina.pump()
        heap = self.heap
        while heap and heap[0][1] == RUN and heap[0][3] not in self.cohorts.live:
            heapq.heappop(heap)  # a merged cohort's: the cohort it joined resumes then too
        leaves = self.wiring.leaves
        return min(heap[0][0] if heap else math.inf, self.ina.next_us(), self.p2p.next_us(),
                   leaves.next_us() if leaves is not None else math.inf)

    # -- collectives ------------------------------------------------------------------
    def _start_coll(self, worker: FakeWorker, run: CollRun) -> None:
        op = run.op
        real = -(-op.count // self.r) if op.count else 0
        mech = self._mechs.get(id(op))  # the programs hold their ops: an id stays theirs
        if mech is None:
            mech = self._mechs[id(op)] = choose(op, self.cfg.setting)
        if mech.stream:
            if self.ina.start(worker.ids, run, real):  # an empty collective
                worker.completed(run, run.start_us)
            return
        if mech.fallback(op, self.cfg.setting):  # what the fabric could not run its own way
            name = op.kind.value
            self.counters.fallbacks[name] = self.counters.fallbacks.get(name, 0) + worker.size
        self.p2p.start_many(worker.ids, run, real, mech)

    # -- the links ----------------------------------------------------------------------
    def _uplinks(self, bound: float, inclusive: bool) -> None:
        """Hand every packet and segment due before the bound to its uplink, per link in send
        order: a worker's packets and segments share its uplink (``_interleave``)."""
        pk = self.ina.due_up(bound, inclusive)
        seg_t, segments = self.p2p.due_up(bound, inclusive)
        if pk is None or not len(seg_t):  # nothing to interleave: each as it is
            segments(0, len(seg_t))
            if pk is not None:
                self.ina.send(pk)
            return
        by_time = np.argsort(pk.send_us, kind="stable")
        _interleave(pk.send_us[by_time], seg_t, lambda lo, hi: self.ina.send(take(pk, np.sort(by_time[lo:hi]))),
                    segments)

    def take_outgoing(self) -> tuple[AggBatch | None, SegmentRows]:
        """What the uplinks delivered since the last call: one batch of contributions, the segments."""
        p2p = self.p2p
        return self.ina.take_outgoing(), (p2p.take_rows() if isinstance(p2p, BatchedP2P)
                                          else SegmentRows.of(p2p.take_outgoing()))

    def take_segments(self) -> tuple[AggBatch | None, list[Segment]]:
        """``take_outgoing`` with the segments as the objects the endpoint made, where it hands them
        over one at a time (``emu.replay.control.inprocess``: no rows between hosts of one process)."""
        assert not isinstance(self.p2p, BatchedP2P)
        return self.ina.take_outgoing(), self.p2p.take_outgoing()

    def holds(self, job: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Per segment (its job and destination), whether its endpoint is held here."""
        own = self._own
        inside = (job == self.job) & (dst >= 0) & (dst < len(own))
        return inside & own[np.where(inside, dst, 0)]

    def receive_results(self, batch: AggBatch) -> None:
        self.ina.arrive(batch)

    def receive_rows(self, rows: SegmentRows) -> None:
        """Segments from the switch, for endpoints of this host."""
        if isinstance(self.p2p, BatchedP2P):
            self.p2p.arrive_rows(rows)
            return
        for seg in rows.segments():
            self.p2p.arrive(seg)

    def receive_segment(self, seg: Segment) -> None:
        """A segment from the switch for an endpoint of this host, as ``receive_rows`` hands each on."""
        self.p2p.arrive(seg)

    def _downlinks(self, bound: float, inclusive: bool, now: float | None) -> None:
        """Hand every result and segment due before the bound to its downlink, per link in stamp
        order; the cohorts' completions settled after them."""
        self._deliver(bound, inclusive, now)
        self._settle()

    def _deliver(self, bound: float, inclusive: bool, now: float | None) -> None:
        """Hand every result and segment due before the bound to its downlink: a worker's results
        and segments share its downlink, in stamp order (``_interleave``)."""
        results = self.ina.due_down(bound, inclusive)
        seg_t, segments = self.p2p.due_down(bound, inclusive)
        if now is not None and self.measure_lag:  # the wall clock's (never batched)
            stamps = [] if results is None else [results[0].stamps[:, 0]]
            self.lag.add_many(now - np.concatenate(stamps + [seg_t]))
        if results is None or not len(seg_t):  # nothing to interleave: each as it is
            segments(0, len(seg_t))
            if results is not None:
                self.ina.on_results(*results)
            return
        batch, verify, tags = results
        _interleave(batch.stamps[:, 0], seg_t,
                    lambda lo, hi: self.ina.on_results(batch.take(slice(lo, hi)), verify[lo:hi], tags[lo:hi]),
                    segments)

    # -- a window -----------------------------------------------------------------------
    def advance(self, bound: float, inclusive: bool = False, now: float | None = None,
                quiet_us: tuple[float, ...] = ()) -> None:
        """Handle everything due before ``bound`` (or at it, when ``inclusive``): downlinks, then
        local events in order, then uplinks (module docstring). ``now``: the wall clock's
        emulated time, to measure lag (the wall clock only); ``quiet_us``: the clock's, per slot
        pool (``Departures.quiet_us``: for the leaves' horizons)."""
        leaves = self.wiring.leaves if self.own_leaves else None
        if leaves is not None:  # from the spine down the leaves' links, on to the NICs' downlinks later
            leaves.advance(1, bound, inclusive, self.p2p.receive, self.ina.receive)
        self._downlinks(bound, inclusive, now)
        if self.p2p.split_inside:
            self._node_passes(bound)
        else:
            self._events(bound, inclusive, now)
        self.ina.pump()
        self._uplinks(bound, inclusive)
        if leaves is not None:  # what the NICs delivered to the leaves, on up to the spine
            leaves.advance(0, bound, inclusive, self.p2p.outgoing.append, lambda b, _: self.ina.outgoing.append(b),
                           leaf_horizons([self], leaves, bound, quiet_us))
        self._advances += 1
        self._check_segments()  # every window: a segment that gave up must not reach a report
        if self._advances % _STALL_EVERY == 0:
            self._check_progress()

    def _events(self, bound: float, inclusive: bool, now: float | None, stop: Callable[[], float] | None = None) -> None:
        """The local events due before the bound, in (time, kind, endpoint) order; ``stop``: a
        bound that may come closer as they run (``_node_passes``)."""
        lags = []
        heap, cohorts = self.heap, self.cohorts
        while True:
            self._settle()
            if not (heap and (heap[0][0] <= bound if inclusive else heap[0][0] < bound)) or (
                    stop is not None and heap[0][0] >= stop()):
                if not cohorts.paused:
                    break
                cohorts.resume_paused()
                continue
            t, kind, a, b, lost = heapq.heappop(heap)
            if kind == RUN:
                fw = cohorts.live.get(b)
                if fw is None:  # a cohort merged into another, whose resumption this one is too
                    continue
                runs = self._runs[b]
                runs.pop(0)  # the heap's least: this cohort's first
                self._run_t[fw.at] = runs[0] if runs else math.inf
            self.counters.events += 1
            if now is not None:
                lags.append(now - t)
            if kind == RUN:
                fw.run()
            else:
                self._timers -= 1
                self.ina.timer_fired(a, b, t, lost)
        if lags and self.measure_lag:
            self.lag.add_many(np.asarray(lags))

    def _node_passes(self, bound: float) -> None:
        """The window's local events and the traffic inside its nodes, in passes a hop inside a node
        apart while a segment is on its way inside a node (``ReplayConfig.node_passes``): a pass
        hands the node ports what arrives before its end, runs the events before it (stopping
        where a segment they send inside a node could arrive), then sends what is due inside a
        node. The network's traffic (``_downlinks`` before, ``_uplinks`` after) crosses the NICs once
        a window, in time order, as without a topology: nothing a node does inside reaches the
        switch before the window's bound."""
        hop = self.cfg.node_lookahead_us()
        p2p = self.p2p

        def reach() -> float:  # how far events may run: what is sent inside a node arrives a hop later
            return min(bound, p2p.inside_us() + hop)

        while True:
            end = reach()
            for seg, inside in p2p.due_inside_down(end):
                p2p.on_segment(seg, inside)
            self._events(end, False, None, stop=reach)
            done = min(end, reach())  # everything before it has run
            for _, _, _, src, _, seg, dtype in p2p.due_inside_up(done):
                p2p.send(src, seg, dtype)
            if p2p.inside_us() >= bound and not (self.heap and self.heap[0][0] < bound):
                return

    def _check_progress(self) -> None:
        """Stop a replay that cannot finish (``GIVE_UP_ROUNDS``), saying what was seen."""
        p = self.cfg.link.loss
        resends, worker, slot, chunk = self.ina.most_resent()
        if resends >= GIVE_UP_ROUNDS:
            raise NoProgress(f"no progress: worker {worker}'s packet on slot {slot} (chunk {chunk} of the stream) was "
                             f"resent {resends} times in a row without its result coming back, on host "
                             f"{self.setup.index} ({self._pending()}); loss alone does that to one packet with "
                             f"probability {p ** resends:.1e} at --loss {p:g}")
        rounds, positions = (a - b for a, b in zip(self._scaled(), self._progress_mark, strict=True))
        if rounds > STALL_TIMEOUTS and rounds > STALL_RATIO * max(1, positions):
            raise NoProgress(f"no progress: {rounds:,} emulated timeouts since a collective last completed on host "
                             f"{self.setup.index}, for {positions:,} emulated packet positions delivered "
                             f"({self._pending()}; payload scale {self.r}, --loss {p:g})")

    def _check_segments(self) -> None:
        rounds, link = max(a.most_rounds for a in self.wiring.all_links())
        if rounds >= GIVE_UP_ROUNDS:
            p = self.cfg.link.loss
            raise NoProgress(f"no progress: a packet of a point-to-point segment on link {link} was resent {rounds} "
                             f"times in a row, on host {self.setup.index} ({self._pending()}); loss alone does that to "
                             f"one packet with probability {p ** rounds:.1e} at --loss {p:g}")

    def _pending(self) -> str:
        pending = sorted([*self.ina.pending(), *self.p2p.pending()], key=lambda r: r.seq)
        return (f"{pending[0].op.kind.value} #{pending[0].seq} ({pending[0].op.bytes / 1e6:.3g} MB) and "
                f"{len(pending) - 1} more pending" if pending else "nothing pending")

    def finished(self) -> bool:
        return all(fw.s.finished for fw in self.cohorts.live.values())

    def done(self) -> bool:
        return self.finished() and self.next_us() == math.inf and not self.ina.busy()

    def metrics(self) -> HostResult:
        workers = {
            str(w): WorkerRecord(
                iterations=[[r.start_us, r.end_us, r.compute_us, r.blocked_us, r.comm_us] for r in fw.records_of(w)],
                spans=[list(s) for s in fw.s.spans] if self.setup.spans else [],
                colls=[list(c) for c in fw.s.coll_times])
            for w, fw in self.workers.items()}
        ina = self.ina.counters
        leaves = self.wiring.leaves
        leaf_bytes = 0.0 if leaves is None else leaves.bytes_sent if self.own_leaves else leaves.bytes_by_job.get(self.job, 0.0)
        return HostResult(
            host=self.setup.index, job=self.job, workers=workers, lost=ina.lost,
            bytes_sent=ina.bytes_sent + self.p2p.bytes_sent + leaf_bytes,
            packets_lost=ina.packets_lost + sum(a.resent_packets for a in self.wiring.all_links()),
            retransmissions=self.ina.group.retransmissions, fallbacks=dict(self.counters.fallbacks),
            reordered=sum(a.reordered for a in self.wiring.all_links()),
            reorder_error_us=max([float((self.up.reorder_error_us + self.down.reorder_error_us).max(initial=0.0)),
                                  *(float(a.reorder_error_us.max(initial=0.0)) for a in self.wiring.all_links()[2:])]),
            events=self.counters.events, real_bytes=self.counters.real_bytes,
            verify_elements=self.p2p.check.elements + self.ina.check.elements,
            verify_mismatches=self.p2p.check.mismatches + self.ina.check.mismatches,
            verify_distinct=self.p2p.check.distinct + self.ina.check.distinct,
            packets_lost_modelled=ina.packets_lost_modelled + sum(a.resent_packets for a in self.wiring.all_links()),
            payload_segments=self.p2p.payload_segments, empty_segments=self.p2p.empty_segments,
            carried=_carried(self.p2p.carried, self.ina.carried),
            lag=self.lag.to_dict() if self.measure_lag else None,
            completed=_sum_counts(roles_done(fw.s) for fw in self.workers.values()),
            links=self.wiring.usage(np.asarray(self.setup.endpoints, np.int64), self.setup.role == "workers",
                                    leaves=self.own_leaves))


def _carried(*parts: dict[int, list[int]]) -> dict[str, list[int]]:
    """Per collective (its seq, as a string for the message), its payload and header bytes summed."""
    out: dict[str, list[int]] = {}
    for part in parts:
        for seq, (payload, header) in part.items():
            got = out.setdefault(str(seq), [0, 0])
            got[0] += payload
            got[1] += header
    return out


def _sum_counts(counts) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _interleave(stream_t: np.ndarray, seg_t: np.ndarray, stream: Callable[[int, int], None],
                segments: Callable[[int, int], None]) -> None:
    """Hand a window's stream rows (their times ``stream_t``, sorted) and segments (``seg_t``,
    sorted) to the links they share, in time order: a segment goes after the stream's rows at or
    before its time, segments between the same rows as one run. ``stream(lo, hi)`` hands stream
    rows lo to hi, ``segments(a, b)`` segments a to b: per link, the order one at a time gives."""
    upto = np.searchsorted(stream_t, seg_t, side="right")
    cuts = [0, *(np.flatnonzero(np.diff(upto)) + 1).tolist(), len(upto)] if len(upto) else [0]
    done = 0
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        if upto[a] > done:
            stream(done, int(upto[a]))
            done = int(upto[a])
        segments(a, b)
    if done < len(stream_t):
        stream(done, len(stream_t))
