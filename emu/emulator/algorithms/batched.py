"""The ring, the parameter server and the binomial broadcast as kernels: one collective's algorithm
on every member a host holds, a window's segments at once, in numpy (docs/design-notes.md, "Hand-offs in batches").

``emu.emulator.algorithms.p2p`` has each worker's algorithm as a state machine called once per
segment: at a thousand workers and more a ring is millions of hand-offs an iteration, and a
Python call per hand-off was the replay's cost. A kernel holds the same state as columns (per
member: its rank, its own chunk, what it got; per member and segment: how often it came) and
turns a window's arrivals into sends with a fixed number of numpy steps, whatever the number of
members. It is the same algorithm, step for step: the same chunks, segments, sends, send times,
payload values and checks (tests/replay/test_batched.py runs both on the same replays).
Kernels run a whole job's collectives on generated dense payload; everything else (sub-groups,
sparse and recorded payload, the other algorithms) runs per segment, through the same endpoint.
The parameter server's shards, which sum what the clients push, are ``emu.emulator.algorithms.server_sums``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.algorithms.p2p import Check, Chunks
from emu.emulator.links.fifo import places
from emu.emulator.payload.generated import dense_parts
from emu.emulator.protocol.rows import every_row, gather, positions, row_bounds, row_lengths

# The real elements of one collective whose values and sums a kernel keeps once made (16 bytes each:
# 64 MB): each element passes every member of a ring; past this they are made per window.
KEEP_PARTS = 1 << 22


@dataclass(frozen=True)
class Arrivals:
    """Segments of one collective reaching members of a kernel, in their order: the members'
    ids, the segment numbers, the times they arrived and their values (row r's are
    ``values[bounds[r]:bounds[r + 1]]``)."""

    dst: np.ndarray
    segment: np.ndarray
    t: np.ndarray
    bounds: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.dst)

    def take(self, rows: np.ndarray) -> Arrivals:
        """Rows ``rows`` (in that order); all of them in order is this one (nothing changes a values
        array in place)."""
        if every_row(rows, len(self)):
            return self
        return Arrivals(self.dst[rows], self.segment[rows], self.t[rows], row_bounds(row_lengths(self.bounds)[rows]),
                        gather(self.values, self.bounds, rows))


@dataclass(frozen=True)
class Sends:
    """Segments a kernel sends: from, to, which, the emulated payload bytes each stands for, when,
    and their values (as ``Arrivals``)."""

    src: np.ndarray
    dst: np.ndarray
    segment: np.ndarray
    emu_bytes: np.ndarray
    t: np.ndarray
    bounds: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @staticmethod
    def none() -> Sends:
        return _NO_SENDS

    @staticmethod
    def concat(parts: list[Sends]) -> Sends:
        parts = [p for p in parts if len(p)]
        if len(parts) <= 1:
            return parts[0] if parts else Sends.none()
        fields = (np.concatenate([getattr(p, f) for p in parts]) for f in ("src", "dst", "segment", "emu_bytes", "t"))
        return Sends(*fields, row_bounds(np.concatenate([row_lengths(p.bounds) for p in parts])),
                     np.concatenate([p.values for p in parts]))


def _no_sends() -> Sends:
    ints = np.zeros(0, np.int64)
    arrays = (ints, ints, ints, np.zeros(0), np.zeros(0), np.zeros(1, np.int64), np.zeros(0))
    for a in arrays:
        a.flags.writeable = False  # one instance for every kernel that sends nothing
    return Sends(*arrays)


_NO_SENDS = _no_sends()


@dataclass(frozen=True)
class Done:
    """Members now done with a kernel's collective: their endpoint ids and end times."""

    ids: np.ndarray  # int64
    end_us: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def of(w: int, t: float) -> Done:
        return Done(np.array([w], np.int64), np.array([t], np.float64))

    @staticmethod
    def none() -> Done:
        return Done(np.zeros(0, np.int64), np.zeros(0))

    @staticmethod
    def concat(parts: list[Done]) -> Done:
        parts = [p for p in parts if len(p)]
        if len(parts) <= 1:
            return parts[0] if parts else Done.none()
        return Done(np.concatenate([p.ids for p in parts]), np.concatenate([p.end_us for p in parts]))


class _Payload:
    """A collective's generated dense payload, element by element (``emu.emulator.payload.generated``):
    where the collective is small enough (``KEEP_PARTS``) each element's two possible values (its
    owner's, everyone else's) and its sum are made once, in float32 (exact: they are small integers
    times powers of two), else its parts are made for each request."""

    def __init__(self, seed: int, seq: int, real: int, workers: int, dtype: str) -> None:
        self.seed, self.seq, self.real, self.workers, self.dtype = seed, seq, real, workers, dtype
        self._kept: tuple[np.ndarray, ...] | None = None

    def _keep(self) -> tuple[np.ndarray, ...] | None:
        if self.real > KEEP_PARTS:
            return None
        if self._kept is None:
            p = dense_parts(self.seed, self.seq, np.arange(self.real, dtype=np.int64), self.workers, self.dtype)
            others = np.ldexp(p.common.astype(np.float64), p.beta).astype(np.float32)
            owner = np.ldexp((p.common + p.own).astype(np.float64), p.beta).astype(np.float32)
            self._kept = (p.owner, others, owner, p.expected_sum(self.workers).astype(np.float32))
        return self._kept

    def values(self, index: np.ndarray | slice, worker: np.ndarray | int) -> np.ndarray:
        """x_w of elements ``index``, ``worker`` its worker (one, or one per element)."""
        kept = self._keep()
        if kept is None:
            return dense_parts(self.seed, self.seq, _indices(index), self.workers, self.dtype).values(worker)
        owner, others, own = kept[0][index], kept[1][index], kept[2][index]
        out = others.astype(np.float64)
        np.copyto(out, own, where=owner == worker)  # measured 1.4 to 2.5 times faster than np.where
        return out

    def total(self, index: np.ndarray | slice) -> np.ndarray:
        """The sums of elements ``index`` over the workers."""
        kept = self._keep()
        if kept is None:
            return dense_parts(self.seed, self.seq, _indices(index), self.workers, self.dtype).expected_sum(self.workers)
        return kept[3][index].astype(np.float64)


def _indices(index: np.ndarray | slice) -> np.ndarray:
    return np.arange(index.start, index.stop, dtype=np.int64) if isinstance(index, slice) else index


class _Layout:
    """A collective's chunks and segments (``Chunks``) as arrays by segment number."""

    def __init__(self, layout: Chunks) -> None:
        rows = [(seg, j, lo, hi) for j in range(layout.parts) for seg, lo, hi in layout.segments(j)]
        seg, chunk, lo, hi = (np.array(c, np.int64) for c in zip(*rows, strict=True))
        self.segments = int(seg.max()) + 1
        self.chunk, self.lo, self.hi = (np.zeros(self.segments, np.int64) for _ in range(3))
        self.chunk[seg], self.lo[seg], self.hi[seg] = chunk, lo, hi
        self.per_chunk = np.bincount(chunk, minlength=layout.parts)  # segments of each chunk
        self.total = int(self.per_chunk.sum())
        self.chunk_bytes = np.array([layout.seg_emu_bytes(j) for j in range(layout.parts)])  # a segment's
        self.by_chunk = [np.array([s for s, _, _ in layout.segments(j)], np.int64) for j in range(layout.parts)]

    def sends(self, src: int, dst: np.ndarray, segs: np.ndarray, t: float, values) -> Sends:
        """Segments ``segs`` (consecutive) from ``src`` to ``dst`` (one each) at ``t``; ``values(span)``
        gives the values of the elements of a slice."""
        k = len(segs)
        if k == 0:
            return Sends.none()
        n = self.hi[segs] - self.lo[segs]
        return Sends(np.full(k, src, np.int64), dst, segs, self.chunk_bytes[self.chunk[segs]], np.full(k, t),
                     row_bounds(n), values(slice(int(self.lo[segs[0]]), int(self.hi[segs[-1]]))))

    def elements(self, a: Arrivals) -> tuple[np.ndarray, np.ndarray]:
        """Each arrived value's row and its element's index in the tensor."""
        n = row_lengths(a.bounds)
        return np.repeat(np.arange(len(n)), n), positions(self.lo[a.segment], n)


class _Members:
    """The members a kernel holds, a slot each in the order they started, and their columns."""

    _COLUMNS = ("ids", "rank", "start_us", "end_us", "got", "need")

    def __init__(self, ids: int) -> None:
        self.slot_of = np.full(ids, -1, np.int64)  # endpoint id -> slot
        self.n = 0
        self.ids, self.rank = np.zeros(8, np.int64), np.zeros(8, np.int64)
        self.start_us, self.end_us = np.zeros(8), np.zeros(8)
        self.got, self.need = np.zeros(8, np.int64), np.zeros(8, np.int64)

    def add(self, w: int, rank: int, t: float, need: int) -> int:
        return int(self.add_many(np.array([w], np.int64), np.array([rank], np.int64), t, need)[0])

    def add_many(self, ws: np.ndarray, ranks: np.ndarray, t: float, need: int | np.ndarray) -> np.ndarray:
        """Members ``ws`` (ranks ``ranks``) start at ``t``, each needing ``need`` segments: their slots."""
        lo, hi = self.n, self.n + len(ws)
        if hi > len(self.rank):
            size = max(2 * len(self.rank), hi)
            for name in self._COLUMNS:
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[:lo] = old[:lo]
                setattr(self, name, new)
        self.slot_of[ws] = np.arange(lo, hi)
        self.ids[lo:hi], self.rank[lo:hi], self.start_us[lo:hi], self.need[lo:hi] = ws, ranks, t, need
        self.n = hi
        return np.arange(lo, hi)

    def started(self, dst: np.ndarray) -> np.ndarray:
        return self.slot_of[dst] >= 0

    def took(self, slot: np.ndarray, t: np.ndarray) -> None:
        """A segment each reached members ``slot`` (a member as often as it has rows) at ``t``."""
        np.add.at(self.got, slot, 1)
        np.maximum.at(self.end_us, slot, t)

    def done(self, slot: np.ndarray) -> Done:
        """Those of ``slot`` that now have every segment they need."""
        now = self.got[slot] == self.need[slot]
        if not now.any():  # most often: none
            return Done.none()
        s = np.unique(slot[now])
        return Done(self.ids[s], self.end_us[s])


class _Kernel:
    """What the kernels' members share: members, payload, checks."""

    def __init__(self, size: int, seq: int, real: int, layout: Chunks, seed: int, dtype: str, check: Check,
                 ids: int) -> None:
        self.m, self.seq, self.check = size, seq, check
        self.lay = _Layout(layout)
        self.payload = _Payload(seed, seq, real, size, dtype)
        self.members = _Members(ids)

    def started(self, dst: np.ndarray) -> np.ndarray:
        return self.members.started(dst)

    def start(self, w: int, rank: int, t: float) -> tuple[Sends, Done]:
        raise NotImplementedError

    def start_many(self, ws: np.ndarray, t: float) -> tuple[Sends, Done]:
        """Members ``ws`` of a whole job (each's rank its id) start at ``t``, in their order: what
        they send, and those done at once."""
        got = [self.start(w, w, t) for w in ws.tolist()]
        return Sends.concat([g[0] for g in got]), Done.concat([g[1] for g in got])

    def arrive(self, a: Arrivals) -> tuple[Sends, Done]:
        """Segments reaching started members, in their order (a member's rows as its algorithm
        would take them one after another): what they send on, and the members now done with the
        collective (their ids and end times)."""
        slot = self.members.slot_of[a.dst]
        return self._turn(a, slot), self.members.done(slot)

    def _turn(self, a: Arrivals, slot: np.ndarray) -> Sends:
        """The rows' sends, a member's rows among them in its order (``slot``: each row's member)."""
        raise NotImplementedError

    def _check(self, got: np.ndarray, want, n: np.ndarray, rows: np.ndarray, distinct: np.ndarray) -> None:
        """``Check.compare`` of the rows ``rows`` (a mask) of an arrival, of ``n`` elements each,
        their values ``got``; ``want(at)``: what the elements ``at`` (a mask of the values, or every
        one: ``slice(None)``) should be."""
        elements = int(n[rows].sum())
        if not elements:
            return
        self.check.elements += elements
        self.check.distinct += int(n[rows & distinct].sum())
        if rows.all():  # every element (most often): no mask to make
            self.check.mismatches += int(np.count_nonzero(got != want(slice(None))))
            return
        at = np.repeat(rows, n)
        self.check.mismatches += int(np.count_nonzero(got[at] != want(at)))


class RingKernel(_Kernel):
    """``emu.emulator.algorithms.p2p.Ring`` on every member a host holds of one whole-job collective:
    reduce-scatter and/or all-gather among ``size`` workers, each sending to rank + 1; ``own_offset``
    makes a member's own chunk (the one it sends first) ``rank + own_offset``."""

    def __init__(self, size: int, seq: int, real: int, emu_bytes: float, reduce: bool, gather: bool, own_offset: int,
                 seed: int, dtype: str, check: Check, ids: int) -> None:
        super().__init__(size, seq, real, Chunks.shared(real, size, emu_bytes), seed, dtype, check, ids)
        self.reduce, self.gather, self.own_offset = reduce, gather, own_offset
        # a middle chunk passes an all_reduce's member twice: summed into the first time, passed on the second
        self.seen = np.zeros((0, self.lay.segments), np.uint8) if reduce and gather and size > 2 else None

    def start(self, w: int, rank: int, t: float) -> tuple[Sends, Done]:
        """Member ``w`` (rank ``rank``) starts at ``t``: its first sends, and it if done at once."""
        m, lay = self.m, self.lay
        o = (rank + self.own_offset) % m
        need = (lay.total - lay.per_chunk[o] if self.reduce else 0) + \
            (lay.total - lay.per_chunk[(o + 1) % m] if self.gather else 0)
        slot = self.members.add(w, rank, t, int(need) if m > 1 else 0)
        if self.seen is not None and slot >= len(self.seen):
            seen = np.zeros((max(8, 2 * len(self.seen)), lay.segments), np.uint8)
            seen[:len(self.seen)] = self.seen
            self.seen = seen
        if m == 1:  # alone: done at once, nothing sent
            self.members.end_us[slot] = t
            return Sends.none(), Done.of(w, t)
        segs = lay.by_chunk[o if self.reduce else (o + 1) % m]
        return lay.sends(w, np.full(len(segs), (rank + 1) % m), segs, t,
                         lambda span: self.payload.values(span, rank)), Done.none()

    def _turn(self, a: Arrivals, slot: np.ndarray) -> Sends:
        """``Ring.on_segment`` for each row."""
        m, lay, mem = self.m, self.lay, self.members
        t = np.maximum(a.t, mem.start_us[slot])  # a segment that came before its member started waited
        rank = mem.rank[slot]
        o = (rank + self.own_offset) % m
        chunk = lay.chunk[a.segment]
        last_reduce = chunk == (o + 1) % m  # this member completes the chunk's sum
        if self.reduce and self.gather:
            first_time = True
            if self.seen is not None:  # the first time here: seen before neither now nor earlier in these rows
                seen, key = self.seen.reshape(-1), slot * lay.segments + a.segment  # a view: (slot, segment) flat
                again = places(key)  # None: each (slot, segment) once in these rows (most often)
                first_time = seen[key] == 0 if again is None else seen[key] + again == 0
                if again is None:  # an increment by index: 16 times faster than np.add.at (1,000 rows)
                    seen[key] += 1
                else:
                    np.add.at(seen, key, 1)
            reducing = last_reduce | ((chunk != o) & first_time)
        else:
            reducing = np.full(len(slot), self.reduce)
        row, index = lay.elements(a)
        pay = self.payload
        out = a.values.copy()
        if reducing.all():  # every row sums into (most often): no mask to make
            out += pay.values(index, rank[row])
        elif reducing.any():
            red = reducing[row]
            out[red] += pay.values(index[red], rank[row][red])
        distinct = (rank == 0) | (not self.gather)  # a reduce_scatter's shards: each member its own
        n = row_lengths(a.bounds)
        self._check(out, lambda at: pay.total(index[at]), n, (reducing & last_reduce) | (~reducing & self.reduce),
                    distinct)
        if not self.reduce:  # an all_gather: chunk c is worker c's shard
            first = np.where(rank == 0, chunk != 0, (rank == 1) & (chunk == 0))
            self._check(out, lambda at: pay.values(index[at], chunk[row][at]), n, np.ones(len(slot), bool), first)
        mem.took(slot, t)
        rows = np.flatnonzero(np.where(reducing, ~last_reduce | self.gather, chunk != (o + 2) % m))
        return Sends(a.dst[rows], (rank[rows] + 1) % m, a.segment[rows], lay.chunk_bytes[chunk[rows]], t[rows],
                     row_bounds(n[rows]), gather(out, a.bounds, rows))


class ClientKernel(_Kernel):
    """``emu.emulator.algorithms.p2p.PSClient`` on every member a host holds of one whole-job
    all_reduce: chunk j to shard j (endpoint ``servers[j]``), each shard's sums checked."""

    def __init__(self, size: int, seq: int, real: int, emu_bytes: float, servers: tuple[int, ...], seed: int,
                 dtype: str, check: Check, ids: int) -> None:
        super().__init__(size, seq, real, Chunks.shared(real, len(servers), emu_bytes), seed, dtype, check, ids)
        lay = self.lay
        self.all_segments = np.concatenate(lay.by_chunk)
        self.to = np.asarray(servers, np.int64)[lay.chunk[self.all_segments]]

    def start(self, w: int, rank: int, t: float) -> tuple[Sends, Done]:
        self.members.add(w, rank, t, self.lay.total)
        return self.lay.sends(w, self.to, self.all_segments, t, lambda span: self.payload.values(span, rank)), \
            Done.none()

    def _turn(self, a: Arrivals, slot: np.ndarray) -> Sends:
        mem = self.members
        t = np.maximum(a.t, mem.start_us[slot])
        index = self.lay.elements(a)[1]
        self._check(a.values, lambda at: self.payload.total(index[at]), row_lengths(a.bounds), np.ones(len(slot), bool),
                    mem.rank[slot] == 0)
        mem.took(slot, t)
        return Sends.none()


class BroadcastKernel(_Kernel):
    """``emu.emulator.algorithms.p2p.BinomialBroadcast`` on every member a host holds of one
    whole-job broadcast: the root sends each segment to its children, every other member checks
    it against the root's values and passes it on to its own children when it arrives."""

    def __init__(self, size: int, seq: int, real: int, emu_bytes: float, root: int, seed: int, dtype: str,
                 check: Check, ids: int) -> None:
        super().__init__(size, seq, real, Chunks.shared(real, 1, emu_bytes), seed, dtype, check, ids)
        self.root = root % size

    def start(self, w: int, rank: int, t: float) -> tuple[Sends, Done]:
        """Member ``w`` (rank ``rank``) starts at ``t``: the root sends every segment and is done."""
        lay = self.lay
        if rank != self.root:
            self.members.add(w, rank, t, lay.total)
            return Sends.none(), Done.none()
        slot = self.members.add(w, rank, t, 0)
        self.members.end_us[slot] = t
        segs = np.concatenate(lay.by_chunk)
        sends = [lay.sends(w, np.full(len(segs), c), segs, t, lambda span: self.payload.values(span, rank))
                 for c in self._children(np.zeros(1, np.int64))[0]]
        return Sends.concat(sends), Done.of(w, t)

    def start_many(self, ws: np.ndarray, t: float) -> tuple[Sends, Done]:
        """``_Kernel.start_many``: every member but the root only waits, added at once (in
        their order, the root's slot among them)."""
        at = np.flatnonzero(ws == self.root)
        if not len(at):
            self.members.add_many(ws, ws, t, self.lay.total)
            return Sends.none(), Done.none()
        i = int(at[0])
        self.members.add_many(ws[:i], ws[:i], t, self.lay.total)
        got = self.start(int(ws[i]), int(ws[i]), t)
        self.members.add_many(ws[i + 1:], ws[i + 1:], t, self.lay.total)
        return got

    def _children(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of members ``v`` ranks from the root: their children's ranks (absolute) and, for each,
        the row of ``v`` it is a child of (v + 2**j for every 2**j past v's highest bit)."""
        step = np.ones_like(v)
        high = v.copy()
        while high.any():
            step[high > 0] <<= 1
            high >>= 1
        kids, rows = [], []
        while True:
            at = np.flatnonzero(v + step < self.m)
            if not len(at):
                break
            kids.append((v[at] + step[at] + self.root) % self.m)
            rows.append(at)
            step = step << 1
        if not kids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(kids), np.concatenate(rows)

    def _turn(self, a: Arrivals, slot: np.ndarray) -> Sends:
        """``BinomialBroadcast.on_segment`` for each row."""
        mem, lay, root = self.members, self.lay, self.root
        t = np.maximum(a.t, mem.start_us[slot])
        rank = mem.rank[slot]
        index = lay.elements(a)[1]
        self._check(a.values, lambda at: self.payload.values(index[at], root), row_lengths(a.bounds),
                    np.ones(len(slot), bool), rank == (root + 1) % self.m)
        mem.took(slot, t)
        kids, rows = self._children((rank - root) % self.m)
        return Sends(a.dst[rows], kids, a.segment[rows], lay.chunk_bytes[lay.chunk[a.segment[rows]]], t[rows],
                     row_bounds(row_lengths(a.bounds)[rows]), gather(a.values, a.bounds, rows))
