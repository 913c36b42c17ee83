"""A host's point-to-point endpoint that hands segments over a window's at once (docs/design-notes.md,
"Hand-offs in batches").

The same traffic as ``emu.replay.host.p2p.P2PEndpoint``, in the same order, with the same
numbers: segments wait as columns (``SegmentRows``), cross their links a window's at once
(``LinkArray.send_segments`` / ``receive_segments``: each link's rows one after another, every
link's k-th row in one numpy step) and reach their algorithms by collective: a whole job's ring,
parameter server or binomial broadcast on generated dense payload as one kernel for all the
members this host holds (``emu.emulator.algorithms.batched``), every other collective one segment
at a time through its per-worker algorithm, as before. The shards' sums are made a window's at once too.

It runs where every endpoint has a link of its own (``ReplayConfig.batched_p2p``: the synchronized
clock, no topology); elsewhere the host runs ``P2PEndpoint``, one segment at a time. Where the
switch sums, a worker's stream shares its links with its segments: the host hands a window's
segments over in runs between the stream's rows, in time order (``emu.replay.host.runtime.Host``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from emu.emulator.algorithms.batched import Arrivals, Done, Sends
from emu.emulator.algorithms.p2p import Seg
from emu.emulator.algorithms.server_sums import ServerSums
from emu.emulator.algorithms.sparse_p2p import SPARSE_SEGMENT
from emu.emulator.mechanisms import Mechanism
from emu.emulator.protocol import wire
from emu.emulator.protocol.rows import lexsort, one_value, row_bounds
from emu.emulator.protocol.transport import FrameError, SegmentRows
from emu.emulator.protocol.wire import DTYPE_CODES
from emu.replay.control.messages import CARRIED_UNIT
from emu.replay.host.p2p import Hand, P2PEndpoint
from emu.replay.host.worker import CollRun, complete_by_run

_HEADERS = wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize


def wires(emu_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's packets and bytes on a link (``emu.replay.host.p2p._wire``, for many)."""
    packets = np.maximum(1, -(-np.ceil(emu_bytes).astype(np.int64) // wire.P2P_PAYLOAD_MAX))
    return packets, emu_bytes + packets * _HEADERS


class _Waiting:
    """Segments waiting for their time, as columns, each part sorted by time; ``due`` takes those
    before a bound in order: to be sent (``up``) by (send time, collective, segment, source, key),
    arriving by (first packet, destination, source, collective, segment), the orders of
    ``P2PEndpoint``'s heaps. A row is copied when it comes and when it goes, not each window."""

    MERGE = 48  # parts kept apart at most
    FAN = 8  # parts of a tier that merge

    def __init__(self, up: bool) -> None:
        self.up = up
        self.parts: list[SegmentRows] = []
        self._first = math.inf

    def push(self, rows: SegmentRows) -> None:
        if not len(rows):
            return
        if len(rows) > 1 and (rows.t[1:] < rows.t[:-1]).any():
            rows = rows.take(np.argsort(rows.t, kind="stable"))
        self.parts.append(rows)
        self._first = min(self._first, float(rows.t[0]))
        # parts of falling sizes in tiers, as a counter's in base FAN: the last FAN parts merge when
        # they are within a factor 2 of each other, so a row is copied about log_FAN(rows) times,
        # not once every few pushes (a parameter server's answers wait long in a large queue)
        parts, fan = self.parts, self.FAN
        while len(parts) > 1 and ((len(parts) >= fan and len(parts[-fan]) <= 2 * len(parts[-1]))
                                  or len(parts) > self.MERGE):
            j = min(fan, len(parts))
            merged = SegmentRows.concat(parts[-j:])
            parts[-j:] = [merged.take(np.argsort(merged.t, kind="stable"))]

    def first(self) -> float:
        return self._first

    def due(self, bound: float, inclusive: bool) -> SegmentRows:
        if not self.parts or self._first > bound or (self._first == bound and not inclusive):
            return SegmentRows.empty()
        side = "right" if inclusive else "left"
        due, rest = [], []
        for p in self.parts:
            k = int(np.searchsorted(p.t, bound, side=side))
            if not k:  # nothing due in it: kept as it is
                rest.append(p)
            elif k == len(p):
                due.append(p)
            else:
                due.append(p.slice(0, k))
                rest.append(p.slice(k, len(p)))
        self.parts = rest
        self._first = min((float(p.t[0]) for p in rest), default=math.inf)
        rows = SegmentRows.concat(due)
        keys = ((rows.key, rows.src, rows.segment, rows.seq, rows.t) if self.up else
                (rows.segment, rows.seq, rows.src, rows.dst, rows.t))
        return rows.take(lexsort(keys))

    def earliest(self, nxt: np.ndarray, link_of: np.ndarray) -> None:
        """Into ``nxt`` (per link): the earliest of its rows (by source up, by destination down)."""
        for p in self.parts:
            np.minimum.at(nxt, link_of[p.src if self.up else p.dst], p.t)


class BatchedP2P(P2PEndpoint):
    """``P2PEndpoint`` with a window's segments at once (module docstring)."""

    batched = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        ids = self.m + self.cfg.shards + 1
        self.link_of = np.full(max(ids, max(self.wiring.link, default=0) + 1), -1, np.int64)
        for e, i in self.wiring.link.items():
            self.link_of[e] = i
        self.waiting_up, self.waiting_down = _Waiting(True), _Waiting(False)
        self._queued: list[tuple[int, list[Seg], str]] = []  # per-worker algorithms' sends, made rows once a window
        self.kernels: dict[int, object] = {}  # collective -> its kernel (emu.emulator.algorithms.batched)
        self._per_segment: set[int] = set()  # collectives that run per segment
        self._kernel_done: dict[int, int] = {}  # members of each kernel done here
        self._kernel_runs: dict[int, np.ndarray] = {}  # per kernel: each member's run (object), by endpoint id
        self.sums = ServerSums(self.m, self.groups) if self.servers else None
        self.sent: list[SegmentRows] = []

    # -- what waits --------------------------------------------------------------------
    def next_us(self) -> float:
        self._flush()
        return min(self.waiting_up.first(), self.waiting_down.first())

    def departs_us(self, free: np.ndarray, down_free: np.ndarray) -> float:
        """The least over every waiting segment of the earliest it can make its link send: the
        later of the link's free time and the segment's own time, or, for one still to arrive,
        a downlink's hop (``P2PEndpoint.down_hop_us``) after its downlink can start on it, a FIFO
        busy until ``down_free`` (``Host.departures``: per link, the later of its free time and its
        next event, least over links)."""
        self._flush()
        parts = [(p, p.src, None) for p in self.waiting_up.parts]
        hop = self.down_hop_us
        if self.servers:  # a shard sends once a sum has all its pushes (``ShardWakes``)
            wakes = np.full(len(free), math.inf)
            self.shard_wakes.earliest(wakes)
            least = float(np.maximum(free, np.maximum(down_free, wakes) + hop).min(initial=math.inf))
        else:
            parts += [(p, p.dst, down_free) for p in self.waiting_down.parts]
            least = math.inf

        def starts(p: SegmentRows, ends: np.ndarray, down: np.ndarray | None, k: int) -> np.ndarray:
            links = self.link_of[ends[:k]]
            t = p.t[:k] if down is None else np.maximum(p.t[:k], down[links]) + hop
            return np.maximum(free[links], t)
        least = min([least, *(float(starts(p, ends, down, 1)[0]) for p, ends, down in parts)])
        for p, ends, down in parts:  # each part is sorted by time: a row at or past ``least`` cannot lower it
            k = int(np.searchsorted(p.t, least, side="left"))
            if k > 1:
                least = min(least, float(starts(p, ends, down, k).min()))
        return least

    def inside_us(self) -> float:
        return math.inf

    def _queue(self, src: int, segs: list[Seg], dtype: str) -> None:
        if segs:
            self._queued.append((src, segs, dtype))

    def _flush(self) -> None:
        """The per-worker algorithms' sends, as rows."""
        if not self._queued:
            return
        segs = [(src, s, s.wire_dtype or dtype) for src, part, dtype in self._queued for s in part]
        self._queued = []
        n = np.array([len(s.data) for _, s, _ in segs], np.int64)
        ints = np.array([(self.job, src, s.dst, s.seq, s.segment, DTYPE_CODES.index(d), s.dst) for src, s, d in segs],
                        np.int64).reshape(len(segs), 7).T
        emu = np.array([s.emu_bytes for _, s, _ in segs], np.float64)
        t = np.array([s.send_us for _, s, _ in segs], np.float64)
        values = np.concatenate([np.asarray(s.data, np.float64) for _, s, _ in segs])
        self.waiting_up.push(SegmentRows.packed([*ints, emu, t, t.copy()], row_bounds(n), values))

    def _push(self, sends: Sends, seq: int, code: int) -> None:
        """A kernel's sends, to wait for their time."""
        k = len(sends)
        if k:
            self.waiting_up.push(SegmentRows.packed(
                [np.full(k, self.job, np.int64), sends.src, sends.dst, np.full(k, seq, np.int64), sends.segment,
                 np.full(k, code, np.int64), sends.dst, sends.emu_bytes, sends.t, sends.t], sends.bounds, sends.values))

    # -- collectives --------------------------------------------------------------------
    def pending(self) -> list[CollRun]:
        return super().pending() + [r for runs in self._kernel_runs.values() for r in runs.tolist() if r is not None]

    def start(self, w: int, run: CollRun, real_elements: int, mech: Mechanism) -> None:
        self.start_many(np.array([w], np.int64), run, real_elements, mech)

    def start_many(self, ws: np.ndarray, run: CollRun, real_elements: int, mech: Mechanism) -> None:
        """Workers ``ws`` start one collective: on its kernel all at once where it has one (each
        one's segments that came before it, after it started), else one by one."""
        kernel = self._kernel(int(ws[0]), run, real_elements, mech)
        if kernel is None:
            for w in ws.tolist():
                super().start(w, run, real_elements, mech)
            return
        seq = run.seq
        runs = self._kernel_runs.get(seq)
        if runs is None:
            runs = self._kernel_runs[seq] = np.full(len(self.link_of), None, object)
        runs[ws] = run
        code = DTYPE_CODES.index(run.op.dtype.value)
        sends, done = kernel.start_many(ws, run.start_us)  # a whole job's: a member's rank is its id
        self._push(sends, seq, code)
        for w in ([w for w in ws.tolist() if (w, seq) in self.early] if self.early else ()):
            early = self.early.pop((w, seq))
            n = np.array([len(e[2]) for e in early], np.int64)
            got = Arrivals(np.full(len(early), w, np.int64), np.array([e[1] for e in early], np.int64),
                           np.array([e[3] for e in early], np.float64), row_bounds(n),
                           np.concatenate([np.asarray(e[2], np.float64) for e in early]))
            sends, more = kernel.arrive(got)
            self._push(sends, seq, code)
            done = Done.concat([done, more])
        self._finished(seq, done)

    def _kernel(self, w: int, run: CollRun, real: int, mech: Mechanism):
        seq = run.seq
        kernel = self.kernels.get(seq)
        if kernel is None and seq not in self._per_segment:
            kernel = mech.kernel(self._start_of(w, run, real, mech), len(self.link_of))
            if kernel is None:
                self._per_segment.add(seq)
            else:
                self.kernels[seq] = kernel
                self._kernel_done[seq] = 0
        return kernel

    def _finished(self, seq: int, done: Done) -> None:
        if not len(done):
            return
        runs = self._kernel_runs[seq]
        got = runs[done.ids]
        runs[done.ids] = None
        complete_by_run(done.ids, got, done.end_us, self.completed)
        self._kernel_done[seq] += len(done)
        if self._kernel_done[seq] == len(self.index):  # every worker here is done with it
            del self.kernels[seq], self._kernel_done[seq], self._kernel_runs[seq]

    # -- uplinks ------------------------------------------------------------------------
    def due_up(self, bound: float, inclusive: bool) -> tuple[np.ndarray, Hand]:
        """Every segment due before the bound, in (time, collective, segment, source, key) order
        (``P2PEndpoint.due_up``'s), as rows: a run of them at once onto their uplinks."""
        self._flush()
        rows = self.waiting_up.due(bound, inclusive)
        return rows.t, lambda a, b: self.send_rows(rows.slice(a, b))

    def send_rows(self, rows: SegmentRows) -> None:
        """Segments (``due_up``'s, in their order) onto their uplinks, per link in order."""
        if not len(rows):
            return
        packets, wire_bytes = wires(rows.emu_bytes)
        first, last, extra = self.up.send_segments(self.link_of[rows.src], rows.t, wire_bytes, packets)
        self.bytes_sent += float(np.rint(wire_bytes + extra).sum())
        payload = rows.emu_bytes > 0
        self.payload_segments += int(payload.sum())
        self.empty_segments += int((payload & (rows.lengths() == 0)).sum())
        carried = np.rint(rows.emu_bytes * CARRIED_UNIT).astype(np.int64)
        framing = np.rint(wire_bytes * CARRIED_UNIT).astype(np.int64) - carried
        if one_value(rows.seq):
            seqs, pay, head = [int(rows.seq[0])], [carried.sum()], [framing.sum()]
        else:
            u, which = np.unique(rows.seq, return_inverse=True)
            seqs, pay, head = u.tolist(), np.bincount(which, carried), np.bincount(which, framing)
        for i, seq in enumerate(seqs):
            got = self.carried.setdefault(seq, [0, 0])
            got[0] += int(pay[i])
            got[1] += int(head[i])
        self.sent.append(replace(rows, t=first, last=last))

    def take_rows(self) -> SegmentRows:
        out, self.sent = SegmentRows.concat(self.sent), []
        return out

    # -- downlinks ----------------------------------------------------------------------
    def arrive_rows(self, rows: SegmentRows) -> None:
        self.waiting_down.push(rows)
        if self.servers and len(rows):
            self.shard_wakes.arrive(self.link_of[rows.dst], np.stack([rows.dst, rows.seq, rows.segment], 1),
                                    rows.t)

    def due_down(self, bound: float, inclusive: bool) -> tuple[np.ndarray, Hand]:
        """Every segment from the switch due before the bound, in (stamp, destination, source,
        collective, segment) order (``P2PEndpoint.due_down``'s), as rows: a run of them at once."""
        rows = self.waiting_down.due(bound, inclusive)
        self.shard_wakes.passed(bound)
        return rows.t, lambda a, b: self.deliver_rows(rows.slice(a, b))

    def deliver_rows(self, rows: SegmentRows) -> None:
        """Segments (``due_down``'s, in their order) across their downlinks, then to their
        algorithms: collective by collective, in the order they were issued."""
        if not len(rows):
            return
        dst = rows.dst
        bad = (dst < 0) | (dst >= len(self.link_of))
        if bad.any() or (self.link_of[np.where(bad, 0, dst)] < 0).any():
            e = int(dst[bad | (self.link_of[np.where(bad, 0, dst)] < 0)][0])
            raise FrameError(f"segment for endpoint {e}, which host {self.host} does not hold")
        packets, wire_bytes = wires(rows.emu_bytes)
        t, extra = self.down.receive_segments(self.link_of[dst], rows.t, rows.last, wire_bytes, packets)
        self.bytes_sent += float(np.rint(wire_bytes + extra).sum())
        if self.servers:
            self._serve(rows, t)
            return
        one = one_value(rows.seq)
        for seq in [int(rows.seq[0])] if one else np.unique(rows.seq).tolist():
            sel = np.arange(len(rows)) if one else np.flatnonzero(rows.seq == seq)
            kernel = self.kernels.get(seq)
            if kernel is None:
                self._one_by_one(rows, sel, t)
                continue
            on = kernel.started(dst[sel])
            if not on.all():  # for workers that have not started it: until they do
                self._one_by_one(rows, sel[~on], t)
                sel = sel[on]
            if not len(sel):
                continue
            part = rows if len(sel) == len(rows) else rows.take(sel)  # the window's one collective: most often
            got = Arrivals(part.dst, part.segment, t if part is rows else t[sel], *part.flat())
            sends, done = kernel.arrive(got)
            self._push(sends, seq, int(rows.code[sel[0]]))
            self._finished(seq, done)

    def _one_by_one(self, rows: SegmentRows, sel: np.ndarray, t: np.ndarray) -> None:
        """Segments to per-worker algorithms (``P2PEndpoint.on_segment``'s second half)."""
        for r in sel.tolist():
            dst, seq = int(rows.dst[r]), int(rows.seq[r])
            key = (dst, seq)
            values = rows.row_values(r)
            alg = self.algs.get(key)
            if alg is None:
                self.early.setdefault(key, []).append((int(rows.src[r]), int(rows.segment[r]), values, float(t[r])))
                continue
            self._queue(dst, self._out(key, alg.on_segment(self._in(key, int(rows.src[r])), int(rows.segment[r]),
                                                            values, float(t[r]))), alg.dtype)
            if alg.finished and key in self.runs:
                self._finish(dst, seq)

    def _serve(self, rows: SegmentRows, t: np.ndarray) -> None:
        """Pushes reaching the parameter-server shards held here: sparse ones one by one, dense ones
        summed a window's at once."""
        assert self.sums is not None
        sparse = (rows.segment & SPARSE_SEGMENT) != 0
        for r in np.flatnonzero(sparse).tolist():
            dst = int(rows.dst[r])
            self._queue(dst, self.sparse_servers[dst].on_segment(dst, int(rows.seq[r]), rows.row_values(r),
                                                                 float(t[r])), DTYPE_CODES[int(rows.code[r])])
        dense = np.flatnonzero(~sparse)
        if not len(dense):
            return
        part = rows.take(dense)
        sends, by = self.sums.arrive(part.dst, part.seq, part.segment, part.emu_bytes, t[dense], *part.flat())
        k = len(sends)
        if k:  # every worker's answer of one sum shares its elements (``Answers``)
            self.waiting_up.push(SegmentRows(
                np.full(k, self.job, np.int64), sends.src, sends.dst, part.seq[by], sends.segment, part.code[by],
                sends.dst, sends.emu_bytes, sends.t, sends.t, sends.lo, sends.n, sends.values))
