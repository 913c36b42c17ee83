"""The switch process: the hub every endpoint's link ends at.

It aggregates contributions with the software INA data plane (``emu.emulator.protocol.switch``)
and forwards point-to-point segments to the host of their destination. A result
for every worker reaches each worker host as one message, which the host fans
out to its workers (their downlinks are still charged one by one there).

On the synchronized clock the switch is also the coordinator of the windows
(``emu.replay.host.loop``): it holds every contribution until no earlier one can
still come, applies them in stamp order (ties by worker and chunk), and tells
the hosts how far they may go.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import zmq

from emu import lifetime
from emu.emulator import fabric as fabrics
from emu.emulator.fabric import Pool
from emu.emulator.protocol.rows import distinct
from emu.emulator.protocol.switch import MULTICAST
from emu.emulator.protocol.transport import (
    AGG,
    DONE,
    HELLO,
    RESULTS,
    SEG,
    SEG_FRAMES,
    AggBatch,
    FrameError,
    SegmentBatch,
)
from emu.emulator.protocol.window import DONE_FRAMES, Departures, Done, Go
from emu.emulator.protocol.wire import MsgType
from emu.errors import RunFailed
from emu.replay.control.messages import (
    Ended,
    Message,
    Ready,
    Stop,
    SwitchResult,
    connect_control,
    decode,
    encode,
    failure,
)
from emu.replay.host.leaves import conserve
from emu.replay.machines import sealed
from emu.replay.machines.sealed import Rejected

HELLO_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SwitchSetup:
    address: str
    control_addr: str
    workers: int
    slots: int  # real slots
    elements: int
    fabric: str  # its name in the registry (emu/emulator/fabric.py)
    worker_hosts: tuple[tuple[int, int], ...]  # per worker host: [first, last) worker ids
    endpoint_host: tuple[int, ...]  # host index of every endpoint (workers, then PS shards)
    sync: bool = False  # coordinate the synchronized clock
    lookahead_us: float = 0.0  # the least delay from an event at a host to its effect elsewhere
    queue_bound: bool = False  # the bound may count the hosts' uplink queues (ReplayConfig.queues_bound_windows)
    # jobs sharing the fabric (emu.replay.jobs): each job's workers and real slots (its share of the
    # pool), and the global number of its endpoint 0; empty: one job of ``workers`` and ``slots``
    job_workers: tuple[int, ...] = ()
    job_slots: tuple[int, ...] = ()
    job_base: tuple[int, ...] = (0,)
    packet_rate: float | None = None  # contributions the pipeline processes a second (None: unlimited)
    # a sharded or split job's sub-groups the switch aggregates for: pool 1 + i holds pools[i]'s
    # workers (numbered 0..g-1 in its headers), and every pool's (real, emulated) slots, the job's first
    pools: tuple[tuple[int, ...], ...] = ()
    pool_slots: tuple[tuple[int, int], ...] = ()
    key: bytes | None = None  # several machines: the run's secret, which seals every message (emu.replay.machines.sealed)


class _Pools:
    """The switch's slot pools, one a job (or, for a sharded or split job, one its whole job and one
    each sub-group it aggregates for), and where each pool's endpoints are: a packet's header names
    its pool (the job field) and its worker in that pool; a result goes to the hosts of the pool's
    workers."""

    def __init__(self, setup: SwitchSetup, aggregates: bool = True) -> None:
        """``aggregates``: with the pools (else only the routes, for a switch that forwards)."""
        workers = setup.job_workers or (setup.workers,)
        slots = setup.job_slots or (setup.slots,)
        # each pool's endpoint ids, by its own numbering of them
        members = [np.arange(b, b + m, dtype=np.int64) for b, m in zip(setup.job_base, workers, strict=True)]
        if setup.pools:
            slots = tuple(real for real, _ in setup.pool_slots)
            members += [np.asarray(g, np.int64) for g in setup.pools]
            workers = tuple(len(g) for g in members)
        net = fabrics.get(setup.fabric)
        self.switches: list[Pool] = []
        try:
            for j, (m, s) in enumerate(zip(workers, slots, strict=True)) if aggregates else ():
                self.switches.append(net.pool(s, m, setup.elements, j))
        except BaseException:
            self.close()
            raise
        self.base = np.asarray(setup.job_base, np.int64)
        self.members = members
        self.endpoint_host = np.asarray(setup.endpoint_host, np.int64)
        self.hosts = len(setup.worker_hosts)
        # the hosts holding each pool's workers (a multicast result goes to each)
        self.job_hosts = [np.unique(self.endpoint_host[g]).tolist() for g in members]
        ends = [*self.base[1:], len(self.endpoint_host)]
        # per job, its endpoints' hosts (asked once per segment forwarded: plain lists)
        self._host_of = [self.endpoint_host[b:e].tolist() for b, e in zip(self.base, ends, strict=True)]
        self._counts = np.asarray(ends, np.int64) - self.base  # each job's endpoints

    def hosts_of(self, jobs: np.ndarray, endpoints: np.ndarray) -> np.ndarray:
        """``host_of`` of many segments at once."""
        bad = (jobs < 0) | (jobs >= len(self.base))
        bad |= (endpoints < 0) | (endpoints >= self._counts[np.where(bad, 0, jobs)])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FrameError(f"segment for unknown endpoint {int(endpoints[i])} of job {int(jobs[i])}")
        return self.endpoint_host[self.base[jobs] + endpoints]

    def host_of(self, job: int, endpoint: int) -> int:
        """The host of a job's endpoint (a segment's destination)."""
        if not 0 <= job < len(self._host_of) or not 0 <= endpoint < len(self._host_of[job]):
            raise FrameError(f"segment for unknown endpoint {endpoint} of job {job}")
        return self._host_of[job][endpoint]

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for sw in self.switches:
            for k, v in sw.stats.as_dict().items():  # type: ignore[attr-defined]
                out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        """Close what a pool holds (a bridge's ports); the software switch's hold nothing."""
        for sw in self.switches:
            close = getattr(sw, "close", None)
            if close is not None:
                close()


def _wait_for_hosts(router: zmq.Socket, idents: list[bytes]) -> None:
    """Until every host said hello: a ROUTER can route only to peers it has heard from."""
    waiting = set(idents)
    deadline = time.monotonic() + HELLO_TIMEOUT_S
    while waiting:
        if not router.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
            raise FrameError(f"hosts {sorted(w.decode() for w in waiting)} never connected to the switch")
        try:
            frames = router.recv_multipart()
        except Rejected:
            continue
        if len(frames) == 2 and frames[1] == HELLO:
            waiting.discard(frames[0])


def _serve_wall(setup: SwitchSetup, ctrl: zmq.Socket, router: zmq.Socket, switch: _Pools | None,
                idents: list[bytes], forwarded: list[int]) -> None:
    """The wall clock: handle what arrives as it arrives, until the orchestrator says stop."""
    route = switch or _Pools(setup, aggregates=False)  # where the endpoints are
    poller = zmq.Poller()
    poller.register(ctrl, zmq.POLLIN)
    poller.register(router, zmq.POLLIN)
    while True:
        events = poller.poll(200)
        if not events:
            lifetime.leave_if_orphaned("the switch")
        for sock, _ in events:
            if sock is ctrl:
                if isinstance(_control(ctrl), Stop):
                    stats = switch.stats() if switch else {}
                    ctrl.send(encode(SwitchResult(stats, forwarded[0], rejected=sealed.rejected(router, ctrl))))
                    return
                continue
            _arrivals(router, switch, route, idents, forwarded)


def _arrivals(router: zmq.Socket, switch: _Pools | None, route: _Pools, idents: list[bytes],
              forwarded: list[int]) -> None:
    """Everything the hosts sent that is waiting: contributions aggregated, segments forwarded to
    the host of their destination."""
    while True:
        try:
            frames = [f.buffer for f in router.recv_multipart(zmq.NOBLOCK, copy=False)]
        except zmq.Again:
            return
        kind = bytes(frames[1])
        if kind == AGG and switch is not None:
            _aggregate(router, switch, AggBatch.parse(frames[1:]), idents)
        elif kind == SEG:
            forwarded[0] += _forward(router, route, idents, SegmentBatch.parse(frames[1:]))
        else:
            raise FrameError(f"unexpected message kind {kind[:8]!r} at the switch")


def _forward(router: zmq.Socket, route: _Pools, idents: list[bytes], batch: SegmentBatch) -> int:
    """Each host its part of a batch of segments (the whole message where it is all one host's);
    returns how many were forwarded."""
    for h, part in _by_host(route, batch):
        _to_host(router, idents[h], part.frames(), "segments")
    return len(batch)


def _by_host(route: _Pools, batch: SegmentBatch) -> list[tuple[int, SegmentBatch]]:
    """Each host's part of a batch of segments (the whole batch where it is all one host's)."""
    dest = route.hosts_of(batch.headers["job"].astype(np.int64), batch.headers["dst"].astype(np.int64))
    hosts = distinct(dest).tolist()
    return [(h, batch if len(hosts) == 1 else batch.take(dest == h)) for h in hosts]


def switch_main(setup: SwitchSetup) -> None:
    """Entry of the forked switch process; it returns when the orchestrator says stop."""
    ctx = zmq.Context()
    ctrl = connect_control(ctx, setup.control_addr, setup.key, b"switch")
    router = sealed.make(ctx, zmq.ROUTER, setup.key, "data")
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.SNDHWM, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(setup.address)
    net = fabrics.get(setup.fabric)
    switch = _Pools(setup) if net.sums_in_switch_process else None
    idents = [f"h{i}".encode() for i in range(max(setup.endpoint_host) + 1)]
    forwarded = [0]  # segments (a list: the coordinator counts into it too)
    try:
        _wait_for_hosts(router, idents)
        ctrl.send(encode(Ready("switch")))
        if setup.sync:
            _Coordinator(setup, ctrl, router, switch, idents, forwarded).serve()
        else:
            _serve_wall(setup, ctrl, router, switch, idents, forwarded)
    except Exception as exc:
        try:
            if not lifetime.orphaned():  # nobody to read it
                ctrl.send(encode(failure("switch", exc)))
            ctrl.close(linger=1000)  # the report must leave before the process does
        except zmq.ZMQError:
            pass
        raise
    finally:
        try:
            if switch is not None:
                switch.close()
        finally:  # every socket closed, whatever interrupts this (a term with one open would wait forever)
            ctx.destroy(linger=0)


def _to_host(router: zmq.Socket, ident: bytes, frames: list, what: str) -> None:
    """Send ``frames`` to host ``ident``; where its connection is gone (ROUTER_MANDATORY), fail
    the run naming the host and what it was sent."""
    try:
        router.send_multipart([ident, *frames], copy=False)
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EHOSTUNREACH:
            raise
        raise RunFailed(f"host process {ident.decode()} left the run: its connection to the switch closed "
                        f"before the switch could send it {what} (killed, or its machine stopped)") from None


def _control(ctrl: zmq.Socket) -> Message | None:
    """The orchestrator's message (None: one that failed authentication, dropped)."""
    try:
        return decode(ctrl.recv())
    except Rejected:
        return None


def _aggregate(router: zmq.Socket, pools: _Pools, batch: AggBatch, idents: list[bytes]) -> None:
    for h, part in aggregate(pools, batch):
        _to_host(router, idents[h], part.frames(RESULTS), "results")


def aggregate(pools: _Pools, batch: AggBatch) -> list[tuple[int, AggBatch]]:
    """Apply contributions (in their order) to their pools; each host's share of the results."""
    # a job the switch has no pool for goes to the last pool, which drops it as invalid (another job's)
    jobs = np.minimum(batch.headers["job"].astype(np.int64), len(pools.switches) - 1)
    if not len(jobs) or (jobs == jobs[0]).all():
        return _results(pools, int(jobs[0]) if len(jobs) else 0, batch)
    out = []
    for job in np.unique(jobs):  # each job's rows in their order, to its own pool
        out += _results(pools, int(job), batch.take(np.flatnonzero(jobs == job)))
    return out


def _results(pools: _Pools, job: int, batch: AggBatch) -> list[tuple[int, AggBatch]]:
    res = pools.switches[job].process(batch.headers, batch.payload, batch.stamps, batch.sparse)
    if not len(res):
        return []
    dest = res.headers["worker"].astype(np.int64)
    # a reduce_scatter's completion goes to every worker of the pool but the one it names
    multi = (dest == MULTICAST) | (res.headers["msg_type"] == MsgType.SCATTER_DONE)
    # a host holds any set of workers
    host = np.where(multi, -1, pools.endpoint_host[pools.members[job][np.where(multi, 0, dest)]])
    out = []
    for h in pools.job_hosts[job]:
        mine = multi | (host == h)
        if mine.all():
            out.append((h, AggBatch(res.headers, res.payload, res.stamps, res.sparse)))
        elif mine.any():
            out.append((h, AggBatch(res.headers, res.payload, res.stamps, res.sparse).take(mine)))
    return out


class Windows:
    """The synchronized clock's windows, whatever carries the messages (docs/design-notes.md): what
    the switch holds, the earliest segment sent in the last window, and where the next window ends.

    ``T`` is the earliest of the hosts' next events, the contributions held and the segments sent
    in the last window (``seg_min``: those the switch forwarded and those a host delivered to its
    own endpoints, ``Done.sent_us``); nothing can reach an endpoint before ``T + lookahead``, so
    that is the bound. The contributions before it are applied in stamp order (ties: job, worker,
    chunk).

    With ``queue_bound`` the bound counts the uplinks' queues (``_queued``): where a slow link is
    busy for a whole pool of packets, a window spans what it carries, not one latency."""

    def __init__(self, setup: SwitchSetup) -> None:
        self.lookahead_us = setup.lookahead_us
        self.queue_bound = setup.queue_bound and setup.lookahead_us > 0
        self.pending: list[AggBatch] = []
        self.seg_min = math.inf  # the earliest segment sent in the last window (at the switch)
        self.window = 0
        self.pipeline = _Pipeline(setup.packet_rate) if setup.packet_rate else None
        self.quiet_us: tuple[float, ...] = ()  # the window's, per pool (``Departures.quiet_us``)

    def bound(self, next_us: list[float], finished: list[bool],
              departures: list[Departures] | None = None) -> tuple[float, bool] | None:
        """Where the next window ends (and whether the bound is inclusive: a lookahead of 0), or
        None where everything is done; ``departures``: per host, when its uplinks can next send
        (``emu.replay.host.runtime.Host.departures``)."""
        held = self.held_us()
        t = min(min(next_us), held, self.seg_min)
        if t == math.inf:
            if all(finished):
                return None
            raise FrameError("the synchronized clock ran out of events while some hosts still have workers that "
                             "have not finished their programs (a protocol error: please report it)")
        self.quiet_us = ()
        if self.queue_bound and departures is not None:
            least = Departures.least(departures)
            t = max(t, self._queued(least, held))
            self.quiet_us = least.quiet_us()
        self.window += 1
        self.seg_min = math.inf
        return t + self.lookahead_us, self.lookahead_us == 0

    def _queued(self, d: Departures, held: float) -> float:
        """The earliest any host can start to send anything it has not sent: on an uplink (a FIFO)
        no earlier than the link is free, and no earlier than what makes it send: an event of an
        endpoint on it (``local_us``), a result of a contribution held here or held at a host
        for its stamp, which crosses a downlink first (one lookahead) and wakes only a link whose
        workers wait for one (``waiting_us``), or a segment just sent (any link). Whatever
        is sent reaches another endpoint one lookahead later still, so every event before that
        plus the lookahead is known. A segment just forwarded makes its endpoint send no earlier
        than it reaches it, a hop past the switch (the least hop: the lookahead; no later than a
        host's count of a segment it holds, ``P2PEndpoint.link_events``). Minima over every link of
        every host: the windows, and so every number, are the same however the endpoints are
        spread over processes. Only valid where no event a host's pass creates falls due at that
        host inside the window after its pass went by (no retransmission timers: ``queue_bound``)."""
        held_by_pool = self.held_by_pool(len(d.waiting))
        results = min((max(w, min(h, r) + self.lookahead_us) for (w, r), h in zip(d.waiting, held_by_pool, strict=True)),
                      default=math.inf)
        if held_by_pool[len(d.waiting):].min(initial=math.inf) < math.inf:  # a pool no host named: anyone
            results = min(results, max(d.free_us, held + self.lookahead_us))
        return min(d.local_us, results, max(d.free_us, self.seg_min + self.lookahead_us))

    def held_by_pool(self, pools: int) -> np.ndarray:
        """The earliest contribution held for each pool (the headers' job field), ``pools`` at least."""
        held = [b for b in self.pending if len(b.headers)]
        jobs = [b.headers["job"].astype(np.int64) for b in held]
        out = np.full(max([pools, *(int(j.max()) + 1 for j in jobs)]), math.inf)
        for b, job in zip(held, jobs, strict=True):
            np.minimum.at(out, job, b.stamps[:, 0].astype(np.float64))
        return out

    def held_us(self) -> float:
        return min((float(b.stamps[:, 0].min()) for b in self.pending if len(b.headers)), default=math.inf)

    def due(self, bound: float, inclusive: bool) -> AggBatch | None:
        """The held contributions before the bound, in stamp order (through the pipeline, with a
        packet rate); the rest stay held."""
        if self.held_us() > bound:
            return None
        batch = AggBatch.concat(self.pending)
        stamps = batch.stamps[:, 0]
        due = stamps <= bound if inclusive else stamps < bound
        rest = np.flatnonzero(~due)
        self.pending = [batch.take(rest)] if len(rest) else []
        rows = np.flatnonzero(due)
        h = batch.headers
        order = rows[np.lexsort((h["chunk"][rows], h["worker"][rows], h["job"][rows], stamps[rows]))]
        batch = batch.take(order)
        return self.pipeline.through(batch) if self.pipeline is not None else batch


class _Coordinator:
    """The switch on the synchronized clock (``Windows``), over sockets: window ``k`` starts when
    every host reported ``Done(k - 1)``, when every message a host sent before it is here; the
    contributions before its bound are applied, their results sent, then ``Go(k, bound)`` to every
    host."""

    def __init__(self, setup: SwitchSetup, ctrl: zmq.Socket, router: zmq.Socket,
                 switch: _Pools | None, idents: list[bytes], forwarded: list[int]) -> None:
        self.setup, self.ctrl, self.router, self.switch = setup, ctrl, router, switch
        self.idents, self.forwarded = idents, forwarded
        self.route = switch or _Pools(setup, aggregates=False)
        self.clock = Windows(setup)
        self.reports: dict[bytes, Done] = {}
        self.ended = False
        # per host, the segments forwarded to it in this window: they go with the next window's Go
        self.held: list[list[SegmentBatch]] = [[] for _ in idents]

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.ctrl, zmq.POLLIN)
        poller.register(self.router, zmq.POLLIN)
        while True:
            events = poller.poll(200)
            if not events:
                lifetime.leave_if_orphaned("the switch")
            for sock, _ in events:
                if sock is self.ctrl:
                    if isinstance(_control(self.ctrl), Stop):
                        stats = self.switch.stats() if self.switch else {}
                        pipe = self.clock.pipeline
                        self.ctrl.send(encode(SwitchResult(stats, self.forwarded[0], self.clock.window,
                                                           pipe.busy_us if pipe else 0.0,
                                                           rejected=sealed.rejected(self.router, self.ctrl))))
                        return
                    continue
                self._drain()
            if len(self.reports) == len(self.idents) and not self.ended:
                self._next_window()

    def _drain(self) -> None:
        while True:
            try:
                frames = [f.buffer for f in self.router.recv_multipart(zmq.NOBLOCK, copy=False)]
            except zmq.Again:
                return
            kind = bytes(frames[1])
            if kind == AGG:
                if self.switch is None:
                    raise FrameError("contributions reached a switch that does not aggregate")
                self.clock.pending.append(AggBatch.parse(frames[1:]))
            elif kind == SEG:  # a host's last batch of a window carries its report (``_Loop._send_out``)
                report = len(frames) == 1 + SEG_FRAMES + DONE_FRAMES
                batch = SegmentBatch.parse(frames[1:1 + SEG_FRAMES] if report else frames[1:])
                for h, part in _by_host(self.route, batch):
                    self.held[h].append(part)
                self.forwarded[0] += len(batch)
                if report:
                    self._report(bytes(frames[0]), frames[1 + SEG_FRAMES:])
            elif kind == DONE:
                self._report(bytes(frames[0]), frames[1:])
            else:
                raise FrameError(f"unexpected message kind {kind[:8]!r} at the switch")

    def _report(self, ident: bytes, frames: list) -> None:
        """A host's report of the window (``Done``)."""
        if bytes(frames[0]) != DONE:
            raise FrameError(f"host {ident.decode()} sent segments with a trailing message that is not a report")
        done = Done.parse(frames)
        if done.window != self.clock.window:
            raise FrameError(f"host {ident.decode()} reported window {done.window} during window {self.clock.window}")
        self.reports[ident] = done
        # every segment it sent in the window, forwarded or kept for its own endpoints
        self.clock.seg_min = min(self.clock.seg_min, done.sent_us)
        self.forwarded[0] += done.kept_segments

    def _next_window(self) -> None:
        reports = list(self.reports.values())
        step = self.clock.bound([d.next_us for d in reports], [d.finished for d in reports],
                                [d.departures for d in reports])
        if step is None:
            self.ended = True
            self.ctrl.send(encode(Ended(self.clock.window)))  # the orchestrator may stop the hosts now
            return
        bound, inclusive = step
        batch = self.clock.due(bound, inclusive)
        if batch is not None:
            assert self.switch is not None
            _aggregate(self.router, self.switch, batch, self.idents)
        self.reports.clear()
        go = Go(self.clock.window, bound, inclusive, self.clock.quiet_us).frames()
        for ident, held in zip(self.idents, self.held, strict=True):
            # the segments forwarded to it, the last batch's message carrying the Go: a message less
            # a window for the host to wake for (a segment is due no earlier than the next window)
            for part in held[:-1]:
                _to_host(self.router, ident, part.frames(), "segments")
            frames = [*held[-1].frames(), *go] if held else go
            _to_host(self.router, ident, frames, f"window {self.clock.window}'s bound")
            held.clear()


class _Pipeline:
    """A switch's aggregation pipeline at ``rate`` packets a second (``--packet-rate``): one server
    that conserves work, as a leaf's link does (emu.replay.host.leaves): a row of ``n`` packets takes
    ``n / rate`` of it from when it arrives or the pipeline is free, rows arriving together
    interleave, and a row leaves as its work is done or its last packet is in, whichever is later.
    Rows come in stamp order, window after window, so it is a FIFO in emulated time."""

    def __init__(self, rate: float) -> None:
        self.per_packet_us = 1e6 / rate
        self.free = np.full(1, -math.inf)
        self.busy_us = 0.0

    def through(self, batch: AggBatch) -> AggBatch:
        if not len(batch.headers):
            return batch
        assert batch.packets is not None
        n = np.maximum(np.asarray(batch.packets, np.float64), 0.0)
        ser = n * self.per_packet_us
        self.busy_us += float(ser.sum())
        out_first, out_last = conserve(np.zeros(len(n), np.int64), batch.stamps[:, 0].astype(np.float64),
                                       batch.stamps[:, 1].astype(np.float64), ser, n, self.free)
        return AggBatch(batch.headers, batch.payload, np.stack([out_first, out_last], axis=1), batch.sparse,
                        batch.packets)
