"""A host process: many fake workers (or parameter-server shards) on one event loop.

One asyncio loop cannot drive hundreds of workers (DESIGN.md's facts: about
7,000 messages a second), so a host runs its own loop over a heap of emulated-time
events and a pyzmq poller, and sends few, large messages: every contribution its
workers make in one pass goes to the switch as one batch, and one result message
serves all of them. Events fire when the wall clock reaches their emulated time
times the dilation factor (absolute deadlines, never relative sleeps); how late
they fire is the lag the report gives.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from emu.emulator import wire
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
from emu.emulator.switch import MULTICAST
from emu.emulator.transport import AGG, HELLO, RESULTS, SEG, AggBatch, FrameError, Segment, control, parse_control
from emu.replay.config import AGGREGATING, ReplayConfig
from emu.replay.programs import WorkerProgram, straggling
from emu.replay.worker import CollRun, FakeWorker, WorkerState
from emu.traces.model import CollKind

_FLOAT = {"float32", "float16", "bfloat16", "float64"}
_PACKET_FIELDS = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit")
_LAG_SAMPLES = 200_000
PROGRESS_S = 0.2


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
    lost: int = 0
    retransmissions: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    reordered: int = 0
    events: int = 0


class Host:
    def __init__(self, setup: HostSetup) -> None:
        self.setup = setup
        cfg = setup.config
        self.cfg = cfg
        self.m = cfg.workers
        self.r = cfg.scale
        self.k = cfg.elements
        self.heap: list[tuple[float, int, str, Any]] = []
        self.order = itertools.count()
        self.counters = Counters()
        self.rng = np.random.default_rng([cfg.seed, setup.index, 99])
        self.retx_scale: dict[tuple[int, int], float] = {}  # what a pending retransmission stands for
        self.pump_due = False
        self.retx_due: list[tuple[int, int, float, float]] = []
        self.check = Check()
        self.ina_check = ResultCheck()
        self.lags: list[float] = []
        self.wall0 = 0.0
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
        self.outgoing_agg: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.outgoing_seg: list[Segment] = []
        params = InaParams(slots=cfg.real_slots, elements=self.k, workers=self.m, job=0, seed=cfg.seed,
                           scale=self.r, emulated_slots=cfg.emulated_slots)
        self.group = InaGroup(endpoints if setup.role == "workers" else np.zeros(0, np.int64), params,
                              PayloadCache(cfg.seed, self.m))
        if setup.role == "workers":
            factor, sigma = straggling(cfg.stragglers, self.m, cfg.seed)
            for prog in setup.programs:
                state = WorkerState(program=prog, iters=setup.iters, straggle=float(factor[prog.worker]),
                                    noise_sigma=float(sigma[prog.worker]), seed=cfg.seed)
                self.workers[prog.worker] = FakeWorker(state, self._start_coll, self._resume_at)
        else:
            for e in setup.endpoints:
                self.servers[e] = PSServer(self.m)

    # -- time -------------------------------------------------------------------------
    def now_us(self) -> float:
        return (time.monotonic() - self.wall0) * 1e6 / self.cfg.dilation

    def _push(self, t: float, kind: str, what: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.order), kind, what))

    def _resume_at(self, worker: FakeWorker, t: float) -> None:
        self._push(t, "run", worker)

    # -- collectives ------------------------------------------------------------------
    def _start_coll(self, worker: FakeWorker, run: CollRun) -> None:
        op, w = run.op, worker.w
        real = -(-op.count // self.r) if op.count else 0
        key = (w, run.seq)
        self.runs[key] = run
        if self.cfg.fabric in AGGREGATING and op.kind == CollKind.ALL_REDUCE and op.dtype.value in _FLOAT:
            coll = self.group.collective(run.seq, op.dtype.value, real, -(-op.count // self.k))
            local = self.index[w]
            coll.start_us[local] = run.start_us
            if coll.data_blocks == 0:
                coll.finished[local] = True
                worker.completed(run, run.start_us)
            else:
                self.ina_runs[(local, run.seq)] = run
                self._pump()
            return
        alg = self._algorithm(w, run, real)
        if alg.fallback and not (self.cfg.fabric == "ring" and op.kind == CollKind.ALL_REDUCE):
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
        if kind == CollKind.ALL_REDUCE and cfg.fabric == "ps":
            servers = [m + j for j in range(cfg.shards)]
            alg = PSClient(**common, layout=Layout(real, len(servers), emu_bytes), servers=servers)
            alg.fallback = False
            return alg
        if kind == CollKind.ALL_REDUCE:
            alg = Ring(**common, layout=Layout(real, m, emu_bytes), reduce=True, gather=True, own=w)
            alg.fallback = cfg.fabric != "ring"
            return alg
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

    # -- sending ----------------------------------------------------------------------
    def _lost_count(self, scale: float) -> float:
        """How many of the emulated packets a lost real packet stands for were lost (at least one):
        only those are sent again."""
        n = max(1, int(round(scale)))
        return float(max(1, self.rng.binomial(n, self.cfg.link.loss))) if n > 1 else 1.0

    def _pump(self, retransmit: list[tuple[int, int, float, float]] | None = None) -> None:
        """Ask for the group's next packets, once per pass of the loop (workers that start
        collectives or get results in one pass share one batch; emulated times are unchanged)."""
        self.pump_due = True
        if retransmit:
            self.retx_due.extend(retransmit)

    def pump(self) -> None:
        if not self.pump_due:
            return
        self.pump_due = False
        retx, self.retx_due = self.retx_due, []
        pk = self.group.next_packets(retx)
        if pk is not None:
            self._push(float(pk.send_us.min()), "ina", pk)

    def _queue_segs(self, src: int, segs: list[Seg], dtype: str) -> None:
        for seg in segs:
            self._push(seg.send_us, "seg", (src, seg, dtype))

    def _split_ina(self, pk: Packets, now: float) -> Packets | None:
        """The part of a batch that is due; the rest waits for its time."""
        due = pk.send_us <= now
        if due.all():
            return pk
        rest = Packets(*(getattr(pk, f)[~due] for f in _PACKET_FIELDS))
        self._push(float(rest.send_us.min()), "ina", rest)
        return Packets(*(getattr(pk, f)[due] for f in _PACKET_FIELDS)) if due.any() else None

    def _send_ina(self, parts: list[Packets]) -> None:
        """Hand every due contribution of this pass to the uplinks at once, each worker's in
        emulated-time order (batches made at different moments interleave)."""
        pk = Packets(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PACKET_FIELDS))
        if len(parts) > 1:
            order = np.lexsort((pk.send_us, pk.local))
            pk = Packets(*(getattr(pk, f)[order] for f in _PACKET_FIELDS))
        sizes = np.where(pk.headers["size"] > 0, wire.agg_wire_bytes(self.k), wire.agg_wire_bytes(0))
        wire_bytes = sizes * pk.emu_packets
        first, last, lost = self.up.transmit(pk.local, pk.send_us, wire_bytes, packets=pk.emu_packets)
        arrival = np.stack([first, last], axis=1)
        self.counters.bytes_sent += float(wire_bytes.sum())
        if lost.any():
            self.counters.lost += int(lost.sum())
            for local, slot, sent, scale in zip(pk.local[lost], pk.headers["slot"][lost], pk.send_us[lost],
                                                pk.emu_packets[lost], strict=True):
                self._push(float(sent) + self.cfg.timeout_rto_us, "retx",
                           (int(local), int(slot), self._lost_count(scale)))
        keep = ~lost
        if keep.any():
            self.outgoing_agg.append((pk.headers[keep], pk.payload[keep], arrival[keep]))

    def _send_seg(self, src: int, seg: Seg, dtype: str) -> None:
        packets = wire.p2p_packets(int(math.ceil(seg.emu_bytes)))
        wire_bytes = seg.emu_bytes + packets * (wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize)
        first, last, resent = self.up.send_segment(self.index[src], seg.send_us, wire_bytes, packets)
        self.counters.bytes_sent += wire_bytes + resent
        header = np.zeros(1, wire.P2P_HEADER)
        header["msg_type"] = wire.MsgType.P2P
        header["dtype"] = wire.DTYPE_CODES.index(dtype)
        header["src"] = src
        header["dst"] = seg.dst
        header["seq"] = seg.seq
        header["segment"] = seg.segment
        self.outgoing_seg.append(Segment(header, seg.emu_bytes, first, last, seg.data))

    def flush(self, sock: zmq.Socket) -> None:
        if self.outgoing_agg:
            headers = np.concatenate([a[0] for a in self.outgoing_agg])
            payload = np.concatenate([a[1] for a in self.outgoing_agg])
            stamps = np.concatenate([a[2] for a in self.outgoing_agg])
            sock.send_multipart(AggBatch(headers, payload, stamps).frames(AGG), copy=False)
            self.outgoing_agg = []
        for seg in self.outgoing_seg:
            sock.send_multipart(seg.frames(), copy=False)
        self.outgoing_seg = []

    # -- receiving --------------------------------------------------------------------
    def receive_results(self, batch: AggBatch) -> None:
        """Results reach the host's downlinks when their stamps come due, in stamp order."""
        order = np.argsort(batch.stamps[:, 0], kind="stable")
        batch = AggBatch(batch.headers[order], batch.payload[order], batch.stamps[order])
        self._push(float(batch.stamps[0, 0]), "results", (batch, np.ones(len(order), bool)))

    def receive_segment(self, seg: Segment) -> None:
        self._push(seg.first_us, "segment", seg)

    def _split_results(self, batch: AggBatch, verify: np.ndarray,
                       now: float) -> tuple[AggBatch, np.ndarray] | None:
        due = batch.stamps[:, 0] <= now
        if due.all():
            return batch, verify
        rest = ~due
        self._push(float(batch.stamps[rest, 0].min()), "results",
                   (AggBatch(batch.headers[rest], batch.payload[rest], batch.stamps[rest]), verify[rest]))
        if not due.any():
            return None
        return AggBatch(batch.headers[due], batch.payload[due], batch.stamps[due]), verify[due]

    def _deliver_results(self, parts: list[tuple[AggBatch, np.ndarray]]) -> None:
        """Every due result of this pass reaches the downlinks at once, in stamp order."""
        if len(parts) == 1:
            batch, verify = parts[0]
        else:
            stamps = np.concatenate([b.stamps for b, _ in parts])
            order = np.argsort(stamps[:, 0], kind="stable")
            batch = AggBatch(np.concatenate([b.headers for b, _ in parts])[order],
                             np.concatenate([b.payload for b, _ in parts])[order], stamps[order])
            verify = np.concatenate([v for _, v in parts])[order]
        self.on_results(batch, verify)

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
        row_bytes = sizes[rb] / per[rb] * scale
        first, last, lost = self.down.transmit(li, batch.stamps[rb, 0], row_bytes, packets=scale,
                                               ready_last_us=batch.stamps[rb, 1])
        self.counters.bytes_sent += float(row_bytes.sum())
        if lost.any():
            self.counters.lost += int(lost.sum())
            for local, slot, lost_scale in zip(li[lost], batch.headers["slot"][rb[lost]], scale[lost], strict=True):
                self._push(float(g.sent_at[local, slot]) + self.cfg.timeout_rto_us, "retx",
                           (int(local), int(slot), self._lost_count(lost_scale)))
        keep = ~lost
        done = g.on_results(li[keep], rb[keep], batch.headers, batch.payload, first[keep], last[keep], verify,
                            self.ina_check)
        for local, coll in done:
            run = self.ina_runs.pop((local, coll.seq))
            self.workers[int(g.wids[local])].completed(run, float(coll.end_us[local]))
        self._pump()

    def on_segment(self, seg: Segment) -> None:
        h = seg.header[0]
        src, dst, seq, segno = int(h["src"]), int(h["dst"]), int(h["seq"]), int(h["segment"])
        if dst not in self.index:
            raise FrameError(f"segment for endpoint {dst}, which host {self.setup.index} does not hold")
        packets = wire.p2p_packets(int(math.ceil(seg.emu_bytes)))
        wire_bytes = seg.emu_bytes + packets * (wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize)
        t, resent = self.down.receive_segment(self.index[dst], seg.first_us, seg.last_us, wire_bytes, packets)
        self.counters.bytes_sent += wire_bytes + resent
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

    # -- the loop ---------------------------------------------------------------------
    def fire_due(self) -> None:
        self.pump()
        now = self.now_us()
        ina: list[Packets] = []
        results: list[tuple[AggBatch, np.ndarray]] = []

        def flush_links() -> None:
            if ina:
                self._send_ina(ina)
                ina.clear()
            if results:
                self._deliver_results(results)
                results.clear()

        while self.heap and self.heap[0][0] <= now:
            t, _, kind, what = heapq.heappop(self.heap)
            self.counters.events += 1
            if len(self.lags) < _LAG_SAMPLES:
                self.lags.append(max(0.0, now - t))
            if kind == "ina":
                part = self._split_ina(what, now)
                if part is not None:
                    ina.append(part)
                continue
            if kind == "results":
                part = self._split_results(*what, now)
                if part is not None:
                    results.append(part)
                continue
            flush_links()
            if kind == "run":
                what.run()
            elif kind == "segment":
                self.on_segment(what)
            elif kind == "seg":
                self._send_seg(*what)
            elif kind == "retx":
                local, slot, lost = what
                self.retx_scale[(local, slot)] = lost
                self._pump([(local, slot, t, lost)])
            if self.pump_due and (not self.heap or self.heap[0][0] > now):
                self.pump()
            now = self.now_us()
        flush_links()
        if self.pump_due:
            self.pump()

    def done(self) -> bool:
        return all(fw.s.finished for fw in self.workers.values()) and not self.heap and not self.pump_due

    def metrics(self) -> dict[str, Any]:
        lags = np.asarray(self.lags) if self.lags else np.zeros(1)
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
            "retransmissions": stream_retx + resent, "late_results": late, "fallbacks": self.counters.fallbacks,
            "reordered": reordered, "events": self.counters.events,
            "reorder_error_us": float((self.up.reorder_error_us + self.down.reorder_error_us).max(initial=0.0)),
            "lag_p99": float(np.percentile(lags, 99)), "lag_max": float(lags.max()),
            "lag_samples": len(self.lags),
            "verify": {"elements": self.check.elements + self.ina_check.elements,
                       "mismatches": self.check.mismatches + self.ina_check.mismatches},
            "ps_bytes": sum(s.aggregated_bytes for s in self.servers.values()),
        }


def host_main(setup: HostSetup) -> None:
    """Entry of a forked host process; it returns when the orchestrator says stop."""
    ctx = zmq.Context()
    ctrl = ctx.socket(zmq.DEALER)
    ctrl.setsockopt(zmq.LINGER, 0)
    ctrl.connect(setup.control_addr)
    data = ctx.socket(zmq.DEALER)
    data.setsockopt(zmq.LINGER, 2000)
    data.setsockopt(zmq.IDENTITY, f"h{setup.index}".encode())
    data.setsockopt(zmq.SNDHWM, 0)
    data.setsockopt(zmq.RCVHWM, 0)
    data.connect(setup.switch_addr)
    data.send(HELLO)
    try:
        host = Host(setup)
        ctrl.send(control({"type": "ready", "host": setup.index}))
        _serve(host, ctrl, data)
    except Exception as exc:  # reported to the orchestrator, which stops everything
        try:
            ctrl.send(control({"type": "error", "host": setup.index, "error": f"{type(exc).__name__}: {exc}"}))
        except zmq.ZMQError:
            pass
        raise
    finally:
        ctrl.close(0)
        data.close(0)
        ctx.term()


def _serve(host: Host, ctrl: zmq.Socket, data: zmq.Socket) -> None:
    poller = zmq.Poller()
    poller.register(ctrl, zmq.POLLIN)
    poller.register(data, zmq.POLLIN)
    started = reported = False
    last_progress = 0.0
    while True:
        timeout_ms = 100
        if started and host.heap:
            wait_us = (host.heap[0][0] - host.now_us()) * host.cfg.dilation
            timeout_ms = int(min(100, max(0, wait_us / 1000)))
        for sock, _ in poller.poll(timeout_ms):
            if sock is ctrl:
                msg = parse_control(ctrl.recv())
                if msg["type"] == "start":
                    host.wall0 = float(msg["wall0"])
                    started = True
                    for fw in host.workers.values():
                        fw.begin()
                elif msg["type"] == "stop":
                    if not reported:
                        ctrl.send(control(host.metrics()))
                    return
            else:
                while True:
                    try:
                        frames = data.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames[0] == RESULTS:
                        host.receive_results(AggBatch.parse(frames))
                    elif frames[0] == SEG:
                        host.receive_segment(Segment.parse(frames))
                    else:
                        raise FrameError(f"unknown message kind {frames[0][:8]!r}")
        if not started:
            continue
        host.fire_due()
        host.flush(data)
        wall = time.monotonic()
        if wall - last_progress > PROGRESS_S and host.workers:
            last_progress = wall
            done_its = min(fw.s.it for fw in host.workers.values())
            ctrl.send(control({"type": "progress", "host": host.setup.index, "iterations": done_its}))
        if host.workers and not reported and host.done():
            ctrl.send(control(host.metrics()))
            reported = True
