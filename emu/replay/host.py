"""A host process's endpoints: many fake workers (or parameter-server shards) and their links.

One process runs many endpoints and sends few, large messages: every contribution
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

Which bound, and when, is the clock's business (``emu.replay.hostloop``): the
synchronized clock's windows, or the wall clock times the dilation.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emu.emulator import wire
from emu.emulator.fabric import AllReduce
from emu.emulator.ina import InaGroup, InaParams, Packets, PayloadCache, ResultCheck
from emu.emulator.links import LinkArray
from emu.emulator.p2p import (
    Algorithm,
    AllToAll,
    Barrier,
    Check,
    Layout,
    PSClient,
    PSServer,
    Ring,
    Seg,
    SendRecv,
    Tree,
)
from emu.emulator.scaled_loss import ScaledLoss
from emu.emulator.switch import MULTICAST
from emu.emulator.transport import AggBatch, FrameError, Segment
from emu.replay.config import ReplayConfig
from emu.replay.lag import LagHistogram
from emu.replay.programs import WorkerProgram, straggling
from emu.replay.worker import CollRun, FakeWorker, WorkerState
from emu.traces.model import CollKind

_PACKET_FIELDS = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit")
_RUN, _RETX = 0, 1  # local event kinds, in the order they are handled at equal times


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


@dataclass
class Counters:
    bytes_sent: float = 0.0  # emulated wire bytes, every link direction, retransmissions included
    lost: int = 0  # real aggregation rows the links dropped
    packets_lost: int = 0  # emulated packets the links lost (each is resent), every kind
    retransmissions: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    events: int = 0
    real_bytes: int = 0  # bytes of data messages this process really sent and received


def _take(pk: Packets, rows: np.ndarray) -> Packets:
    return Packets(*(getattr(pk, f)[rows] for f in _PACKET_FIELDS))


def _concat(parts: list[Packets]) -> Packets:
    if len(parts) == 1:
        return parts[0]
    return Packets(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PACKET_FIELDS))


def _due(times: np.ndarray, bound: float, inclusive: bool) -> np.ndarray:
    return times <= bound if inclusive else times < bound


class Host:
    def __init__(self, setup: HostSetup) -> None:
        self.setup = setup
        cfg = setup.config
        self.cfg = cfg
        self.net = cfg.network
        self.m = cfg.workers
        self.r = cfg.scale
        self.k = cfg.elements
        # local events: (time, kind, endpoint, detail, lost packets): a total order that does not
        # depend on when they were pushed
        self.heap: list[tuple[float, int, int, int, float]] = []
        self.counters = Counters()
        self.retx_scale: dict[tuple[int, int], float] = {}  # what a pending retransmission stands for
        self.pump_due = False
        self.retx_due: list[tuple[int, int, float, float]] = []
        self.check = Check()
        self.ina_check = ResultCheck()
        self.lag = LagHistogram()
        self.measure_lag = False
        endpoints = np.asarray(setup.endpoints, dtype=np.int64)
        self.index = {int(e): i for i, e in enumerate(endpoints)}
        self.up = LinkArray(cfg.link, endpoints, cfg.seed, 0, cfg.timeout_rto_us)
        self.down = LinkArray(cfg.link, endpoints, cfg.seed, 1, cfg.timeout_rto_us)
        self.workers: dict[int, FakeWorker] = {}
        self.algs: dict[tuple[int, int], Algorithm] = {}
        self.runs: dict[tuple[int, int], CollRun] = {}
        self.ina_runs: dict[tuple[int, int], CollRun] = {}
        self.early: dict[tuple[int, int], list[tuple[int, int, np.ndarray, float]]] = {}
        self.servers: dict[int, PSServer] = {}
        # what waits for its time: contributions and segments to send (uplinks), results and
        # segments received (downlinks)
        self.up_ina: list[tuple[float, int, Packets]] = []
        self.up_segs: list[tuple[float, int, int, int, int, Seg, str]] = []
        self.down_results: list[tuple[float, int, AggBatch, np.ndarray]] = []
        self.down_segs: list[tuple[float, int, int, int, int, Segment]] = []
        self._parts = 0  # a counter that only keeps heap entries of equal keys apart
        self.outgoing_agg: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.outgoing_seg: list[Segment] = []
        params = InaParams(slots=cfg.real_slots, elements=self.k, workers=self.m, job=0, seed=cfg.seed,
                           scale=self.r, emulated_slots=cfg.emulated_slots)
        self.group = InaGroup(endpoints if setup.role == "workers" else np.zeros(0, np.int64), params,
                              PayloadCache(cfg.seed, self.m))
        # with payload scale, loss is drawn per emulated packet and the real rows always cross
        self.scaled = (ScaledLoss(cfg.seed, self.m, cfg.link.loss, cfg.real_slots,
                                  -(-cfg.emulated_slots // cfg.real_slots), cfg.timeout_rto_us)
                       if self.r > 1 and cfg.link.loss > 0 else None)
        if setup.role == "workers":
            factor, sigma = straggling(cfg.stragglers, self.m, cfg.seed)
            for prog in setup.programs:
                state = WorkerState(program=prog, iters=setup.iters, straggle=float(factor[prog.worker]),
                                    noise_sigma=float(sigma[prog.worker]), seed=cfg.seed)
                self.workers[prog.worker] = FakeWorker(state, self._start_coll, self._resume_at)
        else:
            for e in setup.endpoints:
                self.servers[e] = PSServer(self.m)

    def begin(self) -> None:
        for fw in self.workers.values():
            fw.begin()
        self.pump()

    # -- local events -----------------------------------------------------------------
    def _resume_at(self, worker: FakeWorker, t: float) -> None:
        heapq.heappush(self.heap, (t, _RUN, worker.w, 0, 0.0))

    def _timer(self, t: float, local: int, slot: int, lost: float) -> None:
        heapq.heappush(self.heap, (t, _RETX, local, slot, lost))

    def next_us(self) -> float:
        """The earliest emulated time at which something is left to do here (inf: nothing)."""
        self.pump()
        return min(self.heap[0][0] if self.heap else math.inf,
                   self.up_ina[0][0] if self.up_ina else math.inf,
                   self.up_segs[0][0] if self.up_segs else math.inf,
                   self.down_results[0][0] if self.down_results else math.inf,
                   self.down_segs[0][0] if self.down_segs else math.inf)

    # -- collectives ------------------------------------------------------------------
    def _start_coll(self, worker: FakeWorker, run: CollRun) -> None:
        op, w = run.op, worker.w
        real = -(-op.count // self.r) if op.count else 0
        key = (w, run.seq)
        self.runs[key] = run
        aggregated = op.kind == CollKind.ALL_REDUCE and op.dtype.is_float
        if aggregated and self.net.all_reduce == AllReduce.STREAM:
            coll = self.group.collective(run.seq, op.dtype.value, real, -(-op.count // self.k))
            local = self.index[w]
            coll.start_us[local] = run.start_us
            if coll.data_blocks == 0:
                coll.finished[local] = True
                worker.completed(run, run.start_us)
            else:
                self.ina_runs[(local, run.seq)] = run
                self.pump_due = True
            return
        alg = self._algorithm(w, run, real)
        if self.net.counts_as_fallback(op.kind, aggregated):
            name = op.kind.value
            self.counters.fallbacks[name] = self.counters.fallbacks.get(name, 0) + 1
        self.algs[key] = alg
        self._queue_segs(w, alg.start(run.start_us), alg.dtype)
        for src, seg, data, t in self.early.pop(key, []):
            self._queue_segs(w, alg.on_segment(src, seg, data, max(t, run.start_us)), alg.dtype)
        if alg.finished:
            self._finish(w, run.seq)
    def _algorithm(self, w: int, run: CollRun, real: int) -> Algorithm:
        op, cfg, m = run.op, self.cfg, self.m
        itemsize = op.dtype.itemsize
        emu_bytes = float(op.count * itemsize)
        common = dict(rank=w, size=m, seq=run.seq, dtype=op.dtype.value, seed=cfg.seed, check=self.check)
        kind = op.kind
        if kind == CollKind.BARRIER:
            rounds = max(1, (m - 1).bit_length())
            return Barrier(**{**common, "dtype": "uint8"}, layout=Layout(0, rounds, 0.0))
        if kind == CollKind.ALL_REDUCE and self.net.all_reduce == AllReduce.SERVER:
            servers = [m + j for j in range(cfg.shards)]
            return PSClient(**common, layout=Layout(real, len(servers), emu_bytes), servers=servers)
        if kind == CollKind.ALL_REDUCE:
            return Ring(**common, layout=Layout(real, m, emu_bytes), reduce=True, gather=True, own=w)
        if kind == CollKind.REDUCE_SCATTER:
            return Ring(**common, layout=Layout(real, m, emu_bytes), reduce=True, gather=False, own=w - 1)
        if kind == CollKind.ALL_GATHER:
            return Ring(**common, layout=Layout(real, m, emu_bytes), reduce=False, gather=True, own=w - 1)
        if kind == CollKind.BROADCAST:
            return Tree(**common, layout=Layout(real, 1, emu_bytes), root=op.root or 0)
        if kind == CollKind.ALL_TO_ALL:
            return AllToAll(**common, layout=Layout(real, m, emu_bytes))
        return SendRecv(**common, layout=Layout(real, 1, emu_bytes), peer=op.peer or 0,
                        sending=kind == CollKind.SEND)

    def _finish(self, w: int, seq: int) -> None:
        alg = self.algs.pop((w, seq))
        run = self.runs.pop((w, seq))
        self.workers[w].completed(run, alg.end_us)

    # -- uplinks ----------------------------------------------------------------------
    def pump(self) -> None:
        """The group's next packets (every chunk any worker may send, with its send time, and the
        retransmissions due): asked once per window, since they depend only on the state."""
        if not self.pump_due and not self.retx_due:
            return
        self.pump_due = False
        retx, self.retx_due = self.retx_due, []
        pk = self.group.next_packets(retx)
        if pk is not None:
            self._parts += 1
            heapq.heappush(self.up_ina, (float(pk.send_us.min()), self._parts, pk))

    def _queue_segs(self, src: int, segs: list[Seg], dtype: str) -> None:
        for seg in segs:
            heapq.heappush(self.up_segs, (seg.send_us, src, seg.seq, seg.segment, seg.dst, seg, dtype))

    def _uplinks(self, bound: float, inclusive: bool) -> None:
        """Hand every packet and segment due before the bound to its uplink, per link in send order."""
        parts: list[Packets] = []
        while self.up_ina and (self.up_ina[0][0] <= bound if inclusive else self.up_ina[0][0] < bound):
            _, _, pk = heapq.heappop(self.up_ina)
            due = _due(pk.send_us, bound, inclusive)
            if not due.all():
                rest = _take(pk, np.flatnonzero(~due))
                self._parts += 1
                heapq.heappush(self.up_ina, (float(rest.send_us.min()), self._parts, rest))
                pk = _take(pk, np.flatnonzero(due))
            parts.append(pk)
        segs = []
        while self.up_segs and (self.up_segs[0][0] <= bound if inclusive else self.up_segs[0][0] < bound):
            segs.append(heapq.heappop(self.up_segs))
        if not parts:
            for _, src, _, _, _, seg, dtype in segs:
                self._send_seg(src, seg, dtype)
            return
        pk = _concat(parts)
        order = np.lexsort((pk.headers["chunk"], pk.send_us, pk.local))  # each uplink's FIFO
        pk = _take(pk, order)
        if not segs:
            self._send_ina(pk)
            return
        # a worker's packets and segments share its uplink: hand them over in time order
        by_time = np.argsort(pk.send_us, kind="stable")
        done = 0
        for t, src, _, _, _, seg, dtype in segs:
            upto = int(np.searchsorted(pk.send_us[by_time], t, side="right"))
            if upto > done:
                self._send_ina(_take(pk, np.sort(by_time[done:upto])))
                done = upto
            self._send_seg(src, seg, dtype)
        if done < len(pk.send_us):
            self._send_ina(_take(pk, np.sort(by_time[done:])))

    def _scaled_lost(self, chunks: np.ndarray, per: np.ndarray, local: np.ndarray, down: bool) -> np.ndarray:
        """With payload scale: the emulated packets each row's link lost (and resent)."""
        assert self.scaled is not None
        out = np.zeros(len(chunks))
        wids = self.group.wids[local]
        for c in np.unique(chunks):
            rows = np.flatnonzero(chunks == c)
            fate = self.scaled.fate(int(c), float(per[rows[0]]))
            out[rows] = (fate.k_down if down else fate.k_up)[wids[rows]]
        return out

    def _send_ina(self, pk: Packets) -> None:
        sizes = np.where(pk.headers["size"] > 0, wire.agg_wire_bytes(self.k), wire.agg_wire_bytes(0))
        packets = pk.emu_packets
        if self.scaled is not None:
            resent = self._scaled_lost(pk.headers["chunk"].astype(np.int64), pk.emu_packets, pk.local, down=False)
            self.counters.packets_lost += int(resent.sum())
            packets = packets + resent
        wire_bytes = sizes * packets
        sent = self.up.transmit(pk.local, pk.send_us, wire_bytes, packets=packets, lossy=self.scaled is None)
        arrival = np.stack([sent.first_us, sent.last_us], axis=1)
        self.counters.bytes_sent += float(np.rint(wire_bytes).sum())  # whole bytes: exact in any order
        lost = sent.lost
        if lost.any():
            self.counters.lost += int(lost.sum())
            self.counters.packets_lost += int(np.rint(sent.lost_packets[lost]).sum())
            for local, slot, at, n in zip(pk.local[lost], pk.headers["slot"][lost], pk.send_us[lost],
                                          sent.lost_packets[lost], strict=True):
                self._timer(float(at) + self.cfg.timeout_rto_us, int(local), int(slot), float(n))
        keep = ~lost
        if keep.any():
            self.outgoing_agg.append((pk.headers[keep], pk.payload[keep], arrival[keep]))

    def _send_seg(self, src: int, seg: Seg, dtype: str) -> None:
        packets = wire.p2p_packets(int(math.ceil(seg.emu_bytes)))
        wire_bytes = seg.emu_bytes + packets * (wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize)
        first, last, resent = self.up.send_segment(self.index[src], seg.send_us, wire_bytes, packets)
        self.counters.bytes_sent += round(wire_bytes + resent)
        header = np.zeros(1, wire.P2P_HEADER)
        header["msg_type"] = wire.MsgType.P2P
        header["dtype"] = wire.DTYPE_CODES.index(dtype)
        header["src"] = src
        header["dst"] = seg.dst
        header["seq"] = seg.seq
        header["segment"] = seg.segment
        self.outgoing_seg.append(Segment(header, seg.emu_bytes, first, last, seg.data))

    def take_outgoing(self) -> tuple[AggBatch | None, list[Segment]]:
        """What the uplinks delivered since the last call: one batch of contributions, the segments."""
        batch = None
        if self.outgoing_agg:
            batch = AggBatch(np.concatenate([a[0] for a in self.outgoing_agg]),
                             np.concatenate([a[1] for a in self.outgoing_agg]),
                             np.concatenate([a[2] for a in self.outgoing_agg]))
            self.outgoing_agg = []
        segs, self.outgoing_seg = self.outgoing_seg, []
        return batch, segs

    # -- downlinks --------------------------------------------------------------------
    def receive_results(self, batch: AggBatch) -> None:
        if not len(batch.headers):
            return
        order = np.lexsort((batch.headers["chunk"], batch.stamps[:, 0]))
        batch = AggBatch(batch.headers[order], batch.payload[order], batch.stamps[order])
        self._parts += 1
        heapq.heappush(self.down_results, (float(batch.stamps[0, 0]), self._parts, batch,
                                           np.full(len(order), -1, np.int64)))

    def receive_segment(self, seg: Segment) -> None:
        h = seg.header[0]
        heapq.heappush(self.down_segs, (seg.first_us, int(h["dst"]), int(h["src"]), int(h["seq"]),
                                        int(h["segment"]), seg))

    def _downlinks(self, bound: float, inclusive: bool, now: float | None) -> None:
        """Hand every result and segment due before the bound to its downlink, per link in stamp order."""
        parts: list[tuple[AggBatch, np.ndarray]] = []
        while self.down_results and (self.down_results[0][0] <= bound if inclusive
                                     else self.down_results[0][0] < bound):
            _, _, batch, verify = heapq.heappop(self.down_results)
            due = _due(batch.stamps[:, 0], bound, inclusive)
            if not due.all():
                rest = ~due
                self._parts += 1
                heapq.heappush(self.down_results, (float(batch.stamps[rest, 0].min()), self._parts,
                                                   AggBatch(batch.headers[rest], batch.payload[rest],
                                                            batch.stamps[rest]), verify[rest]))
                batch, verify = AggBatch(batch.headers[due], batch.payload[due], batch.stamps[due]), verify[due]
            parts.append((batch, verify))
        segs = []
        while self.down_segs and (self.down_segs[0][0] <= bound if inclusive else self.down_segs[0][0] < bound):
            segs.append(heapq.heappop(self.down_segs)[-1])
        if now is not None and self.measure_lag:
            self.lag.add_many(now - np.concatenate([b.stamps[:, 0] for b, _ in parts] + [
                np.array([s.first_us for s in segs])]))
        if not parts:
            for seg in segs:
                self.on_segment(seg)
            return
        if len(parts) == 1:
            batch, verify = parts[0]
        else:
            stamps = np.concatenate([b.stamps for b, _ in parts])
            headers = np.concatenate([b.headers for b, _ in parts])
            order = np.lexsort((headers["chunk"], stamps[:, 0]))
            batch = AggBatch(headers[order], np.concatenate([b.payload for b, _ in parts])[order], stamps[order])
            verify = np.concatenate([v for _, v in parts])[order]
        done = 0
        for seg in segs:  # a worker's results and segments share its downlink: in time order
            upto = int(np.searchsorted(batch.stamps[:, 0], seg.first_us, side="right"))
            if upto > done:
                self.on_results(AggBatch(batch.headers[done:upto], batch.payload[done:upto],
                                         batch.stamps[done:upto]), verify[done:upto])
                done = upto
            self.on_segment(seg)
        if done < len(verify):
            self.on_results(AggBatch(batch.headers[done:], batch.payload[done:], batch.stamps[done:]),
                            verify[done:])

    def on_results(self, batch: AggBatch, verify: np.ndarray) -> None:
        g = self.group
        dest = batch.headers["worker"].astype(np.int64)
        chunks = batch.headers["chunk"].astype(np.int64)
        per, data = g.emu_packets_of(chunks)
        sizes = np.where(data, wire.agg_wire_bytes(self.k), wire.agg_wire_bytes(0)) * per
        multi = np.flatnonzero(dest == MULTICAST)
        li_parts, rb_parts = [], []
        if len(multi):  # every worker of the host receives these, each on its own downlink
            li_parts.append(np.repeat(np.arange(g.m), len(multi)))
            rb_parts.append(np.tile(multi, g.m))
        uni = np.flatnonzero((dest != MULTICAST) & np.isin(dest, g.wids))
        if len(uni):
            li_parts.append(np.array([self.index[int(d)] for d in dest[uni]]))
            rb_parts.append(uni)
        if not li_parts:
            return
        li, rb = np.concatenate(li_parts), np.concatenate(rb_parts)
        scale = per[rb]
        if len(uni):  # an answer to a retransmission stands for the packets that were resent
            n_uni = len(uni)
            scale = scale.copy()
            scale[-n_uni:] = [min(scale[-n_uni + i], self.retx_scale.get(
                (int(li[-n_uni + i]), int(batch.headers["slot"][uni[i]])), 1.0)) for i in range(n_uni)]
        if len(uni) and len(multi):  # each downlink in the message's (stamp) order
            order = np.lexsort((rb, li))
            li, rb, scale = li[order], rb[order], scale[order]
        delay = None
        if self.scaled is not None:
            resent = self._scaled_lost(chunks[rb], per[rb], li, down=True)
            self.counters.packets_lost += int(resent.sum())
            scale = scale + resent
            delay = np.zeros(len(chunks))
            slots = batch.headers["slot"].astype(np.int64)
            which = g.locate(chunks)
            for i in np.unique(rb):  # the slowest sub-chain of each row (emu.emulator.scaled_loss)
                coll = g.colls[int(which[i])]
                last = int(chunks[i]) >= coll.base + coll.chunks - g.p.slots
                delay[i] = self.scaled.delay(int(chunks[i]), int(slots[i]), int(which[i]), float(per[i]), last)
        row_bytes = sizes[rb] / per[rb] * scale
        got = self.down.transmit(li, batch.stamps[rb, 0], row_bytes, packets=scale,
                                 ready_last_us=batch.stamps[rb, 1], lossy=self.scaled is None)
        first, last, lost = got.first_us, got.last_us, got.lost
        if delay is not None:
            first, last = first + delay[rb], last + delay[rb]
        self.counters.bytes_sent += float(np.rint(row_bytes).sum())
        if lost.any():
            self.counters.lost += int(lost.sum())
            self.counters.packets_lost += int(np.rint(got.lost_packets[lost]).sum())
            rto = self.cfg.timeout_rto_us
            for local, slot, arrival, n in zip(li[lost], batch.headers["slot"][rb[lost]], first[lost],
                                               got.lost_packets[lost], strict=True):
                # the worker's timer, armed when it sent, fires every rto until the result is in:
                # the first firing after the lost result would have arrived resends
                sent = float(g.sent_at[local, slot])
                self._timer(sent + rto * max(1.0, math.ceil((float(arrival) - sent) / rto)), int(local),
                            int(slot), float(n))
        keep = ~lost
        done = g.on_results(li[keep], rb[keep], batch.headers, batch.payload, first[keep], last[keep], verify,
                            self.ina_check)
        for local, coll in done:
            run = self.ina_runs.pop((local, coll.seq))
            self.workers[int(g.wids[local])].completed(run, float(coll.end_us[local]))
        self.pump_due = True

    def on_segment(self, seg: Segment) -> None:
        h = seg.header[0]
        src, dst, seq, segno = int(h["src"]), int(h["dst"]), int(h["seq"]), int(h["segment"])
        if dst not in self.index:
            raise FrameError(f"segment for endpoint {dst}, which host {self.setup.index} does not hold")
        packets = wire.p2p_packets(int(math.ceil(seg.emu_bytes)))
        wire_bytes = seg.emu_bytes + packets * (wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize)
        t, resent = self.down.receive_segment(self.index[dst], seg.first_us, seg.last_us, wire_bytes, packets)
        self.counters.bytes_sent += round(wire_bytes + resent)
        if dst in self.servers:
            replies = self.servers[dst].on_segment(dst, src, seq, segno, seg.values, seg.emu_bytes, t)
            self._queue_segs(dst, replies, seg.dtype)
            return
        key = (dst, seq)
        alg = self.algs.get(key)
        if alg is None:
            self.early.setdefault(key, []).append((src, segno, seg.values, t))
            return
        self._queue_segs(dst, alg.on_segment(src, segno, seg.values, t), alg.dtype)
        if alg.finished and key in self.runs:
            self._finish(dst, seq)

    # -- a window -----------------------------------------------------------------------
    def advance(self, bound: float, inclusive: bool = False, now: float | None = None) -> None:
        """Handle everything due before ``bound`` (or at it, when ``inclusive``): downlinks, then
        local events in order, then uplinks (module docstring). ``now``: the wall clock's
        emulated time, to measure lag (the wall clock only)."""
        self._downlinks(bound, inclusive, now)
        lags = []
        heap = self.heap
        while heap and (heap[0][0] <= bound if inclusive else heap[0][0] < bound):
            t, kind, a, b, lost = heapq.heappop(heap)
            self.counters.events += 1
            if now is not None:
                lags.append(now - t)
            if kind == _RUN:
                self.workers[a].run()
            else:
                self.retx_scale[(a, b)] = lost
                self.retx_due.append((a, b, t, lost))
        if lags and self.measure_lag:
            self.lag.add_many(np.asarray(lags))
        self.pump()
        self._uplinks(bound, inclusive)

    def finished(self) -> bool:
        return all(fw.s.finished for fw in self.workers.values())

    def done(self) -> bool:
        return self.finished() and self.next_us() == math.inf and not self.pump_due and not self.retx_due

    def metrics(self) -> dict[str, Any]:
        workers = {}
        for w, fw in self.workers.items():
            s = fw.s
            workers[str(w)] = {
                "iterations": [[r.start_us, r.end_us, r.compute_us, r.blocked_us, r.comm_us] for r in s.records],
                "spans": s.spans if self.setup.spans else [],
            }
        stream_retx = self.group.retransmissions
        late = self.group.late_results
        reordered = self.up.reordered + self.down.reordered
        resent = self.up.resent_packets + self.down.resent_packets
        return {
            "type": "result", "host": self.setup.index, "workers": workers,
            "bytes_sent": self.counters.bytes_sent, "lost": self.counters.lost,
            "packets_lost": self.counters.packets_lost + resent,
            "retransmissions": stream_retx, "late_results": late, "fallbacks": self.counters.fallbacks,
            "reordered": reordered, "events": self.counters.events, "real_bytes": self.counters.real_bytes,
            "reorder_error_us": float((self.up.reorder_error_us + self.down.reorder_error_us).max(initial=0.0)),
            "lag": self.lag.to_dict() if self.measure_lag else None,
            "verify": {"elements": self.check.elements + self.ina_check.elements,
                       "mismatches": self.check.mismatches + self.ina_check.mismatches},
            "ps_bytes": sum(s.aggregated_bytes for s in self.servers.values()),
        }
