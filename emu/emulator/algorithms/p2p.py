"""Point-to-point collective algorithms as transport-free state machines.

Every fabric runs these for what it does not aggregate itself: ring all_reduce
(reduce-scatter then all-gather, 2(M-1) steps between neighbours), ring
reduce_scatter and all_gather, binomial-tree broadcast from the root, direct all_to_all
and send/recv, and the parameter server's push and pull. Data moves in segments
(a message of at most ``seg_elements`` real elements, many packets on the
emulated wire); a worker forwards a segment as soon as it has it, so steps
pipeline as in NCCL. Each algorithm turns arrivals into new ``Seg`` sends with
emulated send times; the host moves the bytes and runs the link model.

Chunks: the real tensor of a collective is cut into ``parts`` chunks
(``j * n // parts``), each into segments; a segment's number identifies it on
the wire. The emulated size of a chunk is its share of the collective's bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import accumulate

import numpy as np

from emu.emulator.payload.generated import Block, block
from emu.emulator.payload.recorded import RecordedPayload
from emu.traces.model import Sparsity

SEG_ELEMENTS = 1 << 18  # real elements a message carries at most
# Emulated payload bytes a message stands for: 1 MB, pipelining without huge messages; the grain is
# the same at every payload scale, so a ring's or a parameter server's time is too (a message of
# SEG_ELEMENTS real elements stood for R MB, and pipelining coarsened with R)
SEGMENT_BYTES = 1 << 20


def segment_elements(real: int, emu_bytes: float, segment_bytes: float = SEGMENT_BYTES) -> int:
    """Real elements a segment carries so that it stands for ``segment_bytes`` on the emulated
    wire (at most SEG_ELEMENTS), for a collective of ``real`` real elements and ``emu_bytes``
    emulated ones."""
    if real == 0 or emu_bytes <= 0:
        return SEG_ELEMENTS
    return int(min(SEG_ELEMENTS, max(1, round(segment_bytes * real / emu_bytes))))
SHARED_BLOCK = 4096  # elements up to which a payload block is kept for the other workers (at most 1,024 blocks)


@dataclass
class Seg:
    """One segment to send: real data and the payload bytes it stands for on the emulated wire."""

    dst: int
    seq: int
    segment: int
    data: np.ndarray  # float64, exact values of the collective's dtype
    emu_bytes: float
    send_us: float
    wire_dtype: str | None = None  # the real message's dtype where not the collective's (emu.emulator.algorithms.sparse_p2p)


@dataclass(frozen=True)
class Chunks:
    """Chunks and segments of a collective's real tensor, the same on every worker."""

    real: int
    parts: int
    emu_bytes: float  # payload bytes of the whole collective on the emulated wire
    seg_elements: int = SEG_ELEMENTS
    # chunk -> its segments, asked for at every step (made once per instance: ``shared``)
    _memo: dict[int, tuple[tuple[int, int, int], ...]] = field(default_factory=dict, compare=False, hash=False,
                                                              repr=False)

    def chunk_range(self, j: int) -> tuple[int, int]:
        return j * self.real // self.parts, (j + 1) * self.real // self.parts

    @staticmethod
    def shared(real: int, parts: int, emu_bytes: float, seg_elements: int | None = None) -> Chunks:
        """The layout, one instance for every worker of the collective (its memo is then made
        once: a ring's M workers each ask for every chunk); its segments stand for SEGMENT_BYTES
        each unless ``seg_elements`` says otherwise."""
        return _shared_layout(real, parts, emu_bytes,
                              segment_elements(real, emu_bytes) if seg_elements is None else seg_elements)

    def segments(self, j: int) -> tuple[tuple[int, int, int], ...]:
        """(segment number, lo, hi) of chunk j; an empty chunk still has one (empty) segment."""
        got = self._memo.get(j)
        if got is None:
            got = self._memo[j] = self._segments(j)
        return got

    def _segments(self, j: int) -> tuple[tuple[int, int, int], ...]:
        lo, hi = self.chunk_range(j)
        per = max(1, -(-(hi - lo) // self.seg_elements))
        first = self._firsts[j]
        bounds = [lo + i * (hi - lo) // per for i in range(per + 1)]
        return tuple((first + i, bounds[i], bounds[i + 1]) for i in range(per))

    @cached_property
    def _firsts(self) -> list[int]:
        """Each chunk's first segment number (a running count: asked per segment sent, so once)."""
        counts = (max(1, -(-(hi - lo) // self.seg_elements)) for lo, hi in map(self.chunk_range, range(self.parts)))
        return list(accumulate(counts, initial=0))

    def segment_map(self) -> dict[int, tuple[int, int, int]]:
        """segment number -> (chunk, lo, hi), built once per layout (read only: every worker's
        algorithm of the collective shares it)."""
        return self._segment_map

    @cached_property
    def _segment_map(self) -> dict[int, tuple[int, int, int]]:
        out = {}
        for j in range(self.parts):
            for seg, lo, hi in self.segments(j):
                out[seg] = (j, lo, hi)
        return out

    def seg_emu_bytes(self, j: int) -> float:
        return self.emu_bytes / self.parts / len(self.segments(j))


@lru_cache(maxsize=1024)
def _shared_layout(real: int, parts: int, emu_bytes: float, seg_elements: int) -> Chunks:
    return Chunks(real, parts, emu_bytes, seg_elements)


@lru_cache(maxsize=1024)
def _shared_block(seed: int, seq: int, lo: int, n: int, workers: int, dtype: str, sparsity: Sparsity | None) -> Block:
    """A small block, made once for every worker that sends or checks it (a ring's chunk is asked
    for by each of its M workers), read only."""
    return _read_only(block(seed, seq, lo, n, workers, dtype, sparsity))


def _arrays(blk: Block) -> list[np.ndarray]:
    return [a for a in (blk.owner, blk.common, blk.own, blk.beta, blk.scale, blk.holders, blk.mul, blk.add)
            if a is not None]


def _read_only(blk: Block) -> Block:
    for a in _arrays(blk):
        a.setflags(write=False)
    return blk


LARGE_BLOCKS_BYTES = 64 << 20  # the large blocks kept at once (least recently used out)


class _LargeBlocks:
    """Blocks above ``SHARED_BLOCK`` elements, read only, kept while they fit in ``limit`` bytes:
    the workers of a ring, and the rings of other groups running the same collective, ask for
    the same chunk one after another (the tp sample at dp=8: each block 7 times, 33,000
    elements of four hashes each)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self.blocks: OrderedDict[tuple, tuple[Block, int]] = OrderedDict()
        self._lock = threading.Lock()  # one set for the process (emu run serves its ranks in a thread)

    def get(self, key: tuple) -> Block:
        with self._lock:
            got = self.blocks.get(key)
            if got is not None:
                self.blocks.move_to_end(key)
                return got[0]
        blk = _read_only(block(*key))
        size = sum(a.nbytes for a in _arrays(blk))
        if size <= self.limit // 4:
            with self._lock:
                if key not in self.blocks:
                    self.blocks[key] = (blk, size)
                    self.bytes += size
                while self.bytes > self.limit:
                    _, (_, old) = self.blocks.popitem(last=False)
                    self.bytes -= old
        return blk


_large_blocks = _LargeBlocks(LARGE_BLOCKS_BYTES)


@lru_cache(maxsize=1024)
def _shared_sum(seed: int, seq: int, lo: int, n: int, workers: int, dtype: str, sparsity: Sparsity | None) -> np.ndarray:
    """A small block's sum over the workers, made once for every worker that checks it (each of a
    ring's M workers checks every chunk), read only."""
    out = _shared_block(seed, seq, lo, n, workers, dtype, sparsity).expected_sum(workers)
    out.setflags(write=False)
    return out


@dataclass
class Check:
    elements: int = 0  # element deliveries checked: a result reaching M workers counts M times
    mismatches: int = 0
    # distinct elements of the results checked: a result every member receives (an all_reduce's,
    # an all_gather's, a broadcast's) counts at one member of the group (``Algorithm.distinct``),
    # a part only one member receives (a reduce_scatter's shard, a direct algorithm's message) at it
    distinct: int = 0

    def compare(self, got: np.ndarray, want: np.ndarray, slack: np.ndarray | None = None,
                distinct: bool = True) -> None:
        """Count ``got``'s elements and those that are not ``want`` (exactly, or within ``slack``:
        recorded payload's sums, whose rounding depends on the order they were formed in);
        ``distinct``: this worker is the one whose checks count as distinct elements."""
        self.elements += len(want)
        if distinct:
            self.distinct += len(want)
        bad = got != want if slack is None else np.abs(got - want) > slack
        self.mismatches += int(np.count_nonzero(bad))


class Algorithm:
    """A collective on one worker: ``start`` then ``on_segment`` until ``finished``."""

    def __init__(self, rank: int, size: int, seq: int, dtype: str, layout: Chunks, seed: int,
                 check: Check, sparsity: Sparsity | None = None, recorded: RecordedPayload | None = None) -> None:
        self.rank, self.size, self.seq, self.dtype = rank, size, seq, dtype
        self.layout, self.seed, self.check = layout, seed, check
        self.sparsity = sparsity  # the payload's, where the collective has one (emu.emulator.payload.generated)
        self.recorded = recorded  # the real ranks' tensors, sent in place of generated payload (emu run)
        self.summed_over = size  # the workers whose data the payload and its sums are (a sub-ring's job: more)
        self.finished = False
        self.end_us = 0.0
        self._map = layout.segment_map()
        # a result every member receives is counted as distinct elements at the group's first
        # member (``Check``); subclasses whose members receive different parts say so
        self.distinct = rank == 0

    def _block(self, lo: int, hi: int, workers: int | None = None):
        if self.recorded is not None:
            return self.recorded.block(self.seq, lo, hi)
        n, w = hi - lo, workers or self.summed_over
        if n <= SHARED_BLOCK:
            return _shared_block(self.seed, self.seq, lo, n, w, self.dtype, self.sparsity)
        return _large_blocks.get((self.seed, self.seq, lo, n, w, self.dtype, self.sparsity))

    def own(self, lo: int, hi: int, worker: int | None = None) -> np.ndarray:
        return self._block(lo, hi).values(self.rank if worker is None else worker)

    def total(self, lo: int, hi: int) -> np.ndarray:
        if self.recorded is None and hi - lo <= SHARED_BLOCK:
            return _shared_sum(self.seed, self.seq, lo, hi - lo, self.summed_over, self.dtype, self.sparsity)
        return self._block(lo, hi).expected_sum(self.summed_over)

    def check_sum(self, got: np.ndarray, lo: int, hi: int) -> None:
        """Check a reduced segment against the sum over the workers: exactly for generated
        payload, within the rounding of its dtype for the real ranks' tensors."""
        if self.recorded is None:
            self.check.compare(got, self.total(lo, hi), distinct=self.distinct)
            return
        blk = self._block(lo, hi)
        self.check.compare(got, blk.expected_sum(self.summed_over), blk.slack(self.summed_over), self.distinct)

    def _sends(self, dst: int, chunk: int, t: float, values) -> list[Seg]:
        return [Seg(dst, self.seq, seg, values(lo, hi), self.layout.seg_emu_bytes(chunk), t)
                for seg, lo, hi in self.layout.segments(chunk)]

    def _received(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        """A segment of ``src``'s own data (a direct algorithm's): checked and counted, nothing to send."""
        _, lo, hi = self._map[segment]
        self.check.compare(data, self.own(lo, hi, worker=src))  # src's message to this worker alone: distinct
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        return []

    def _done(self, t: float) -> None:
        self.end_us = max(self.end_us, t)

    def start(self, t: float) -> list[Seg]:
        raise NotImplementedError

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        raise NotImplementedError


class Ring(Algorithm):
    """Ring reduce-scatter and/or all-gather among ``size`` workers (right neighbour rank + 1).

    ``own`` is the chunk a worker sends first: rank for all_reduce (it ends the
    reduce-scatter holding chunk rank + 1), rank - 1 for reduce_scatter (so that it
    ends with chunk rank, as torch's output) and for all_gather (its first send is
    its own shard, chunk rank).
    """

    def __init__(self, *args, reduce: bool, gather: bool, own: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.reduce, self.gather = reduce, gather
        self.distinct = self.distinct or not gather  # a reduce_scatter's shards: each worker its own
        self.own_chunk = own % self.size
        self.right = (self.rank + 1) % self.size
        self.seen: dict[int, int] = {}
        self.need = sum(len(self.layout.segments(j)) for j in self._expected_chunks())
        self.got = 0
        # told each segment's final values as they become known (emu.emulator.algorithms.p2p_hier: a node's
        # leader passes them on to its node)
        self.on_final: Callable[[int, int, np.ndarray], None] | None = None

    def _expected_chunks(self) -> list[int]:
        m, o = self.size, self.own_chunk
        chunks = []
        if self.reduce:
            chunks += [(o - 1 - s) % m for s in range(m - 1)]
        if self.gather:
            first = (o + 1) % m
            chunks += [(first - 1 - s) % m for s in range(m - 1)]
        return chunks

    def start(self, t: float) -> list[Seg]:
        if self.size == 1:
            self._finish_alone(t)
            return []
        if self.reduce:
            return self._sends(self.right, self.own_chunk, t, lambda lo, hi: self.own(lo, hi))
        # all_gather: the first send is this worker's shard: chunk own + 1 holds worker rank's data
        first = (self.own_chunk + 1) % self.size
        return self._sends(self.right, first, t, lambda lo, hi: self.own(lo, hi))

    def _finish_alone(self, t: float) -> None:
        self.finished = True
        self.end_us = t

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        chunk, lo, hi = self._map[segment]
        m, o = self.size, self.own_chunk
        count = self.seen.get(segment, 0) + 1
        self.seen[segment] = count
        if not self.gather:
            reducing = True
        elif not self.reduce:
            reducing = False
        elif chunk == (o + 1) % m:
            reducing = True  # the last reduce-scatter step: this worker completes the chunk
        elif chunk == o:
            reducing = False  # a worker's own first chunk comes back only in the all-gather
        else:
            reducing = count == 1
        seg_bytes = self.layout.seg_emu_bytes(chunk)
        out: list[Seg] = []
        if reducing:
            partial = data + self.own(lo, hi)
            if chunk == (o + 1) % m:
                self.check_sum(partial, lo, hi)
                if self.on_final is not None:
                    self.on_final(lo, hi, partial)
                if self.gather:
                    out.append(Seg(self.right, self.seq, segment, partial, seg_bytes, t))
            else:
                out.append(Seg(self.right, self.seq, segment, partial, seg_bytes, t))
        else:
            if self.reduce:
                self.check_sum(data, lo, hi)
                if self.on_final is not None:
                    self.on_final(lo, hi, data)
            else:
                # an all_gather: chunk c is worker c's shard, which every worker but c receives;
                # rank 0 counts the others' as distinct, rank 1 rank 0's
                first = chunk != 0 if self.rank == 0 else self.rank == 1 and chunk == 0
                self.check.compare(data, self.own(lo, hi, worker=chunk), distinct=first)
            if chunk != (o + 2) % m:
                out.append(Seg(self.right, self.seq, segment, data, seg_bytes, t))
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        return out


class BinomialBroadcast(Algorithm):
    """Broadcast down a binomial tree from the root: log2(M) hops instead of a chain's M - 1.

    Relative to the root, worker v receives from v with its highest bit cleared and sends
    to v + 2**j for every 2**j above v's highest bit; each segment moves on as soon as it
    arrives. (Broadcasts in data-parallel training are small buffers: latency-bound.)
    """

    def __init__(self, *args, root: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.root = root % self.size
        self.distinct = self.rank == (self.root + 1) % self.size  # the root checks nothing
        v = (self.rank - self.root) % self.size
        self.children = []
        step = 1 << v.bit_length() if v else 1
        while v + step < self.size:
            self.children.append((v + step + self.root) % self.size)
            step <<= 1
        self.need = sum(len(self.layout.segments(j)) for j in range(self.layout.parts))
        self.got = 0

    def _forward(self, segment: int, chunk: int, data: np.ndarray, t: float) -> list[Seg]:
        return [Seg(c, self.seq, segment, data, self.layout.seg_emu_bytes(chunk), t) for c in self.children]

    def start(self, t: float) -> list[Seg]:
        if self.rank != self.root:
            return []
        self.finished, self.end_us = True, t
        out = []
        for j in range(self.layout.parts):
            for seg, lo, hi in self.layout.segments(j):
                out += self._forward(seg, j, self.own(lo, hi), t)
        return out

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        chunk, lo, hi = self._map[segment]
        self.check.compare(data, self.own(lo, hi, worker=self.root), distinct=self.distinct)
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        return self._forward(segment, chunk, data, t)


class Barrier(Algorithm):
    """Dissemination barrier: in round j every worker signals rank + 2**j and waits for
    rank - 2**j; ceil(log2 M) rounds of empty messages."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.rounds = max(0, (self.size - 1).bit_length())
        self.round = 0
        self.arrived: set[int] = set()

    def _signal(self, t: float) -> list[Seg]:
        out = []
        while self.round < self.rounds:
            dst = (self.rank + (1 << self.round)) % self.size
            out.append(Seg(dst, self.seq, self.round, np.zeros(0), 0.0, t))
            if self.round not in self.arrived:
                return out
            self.round += 1  # the peer's signal for this round came first: go on
        self.finished, self.end_us = True, max(self.end_us, t)
        return out

    def start(self, t: float) -> list[Seg]:
        return self._signal(t)

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        self.arrived.add(segment)
        self._done(t)
        if segment == self.round:
            self.round += 1
            return self._signal(t)
        return []


class AllToAll(Algorithm):
    """Direct exchange: chunk j of every worker's tensor goes to worker j."""

    def start(self, t: float) -> list[Seg]:
        self.need = sum(len(self.layout.segments(self.rank)) for j in range(self.size) if j != self.rank)
        self.got = 0
        if self.need == 0:
            self.finished, self.end_us = True, t
        out = []
        for j in range(self.size):
            if j != self.rank:
                out += self._sends(j, j, t, lambda lo, hi: self.own(lo, hi))
        return out

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        return self._received(src, segment, data, t)


# An uneven all_to_all's message to member j is elements [j * PAIR_STRIDE, j * PAIR_STRIDE + n) of
# its sender's generated payload (any index works: emu.emulator.payload.generated.block), so member j
# checks what i sent it from its own receive sizes alone, without i's offsets.
PAIR_STRIDE = 1 << 40


class UnevenAllToAll(Algorithm):
    """Direct exchange with per-peer sizes (``Coll.splits``): ``send_real[j]`` real elements
    (``send_emu[j]`` bytes on the emulated wire) go to member j, ``recv_real[i]`` come from member
    i, each pair's message in segments of its own (``Chunks`` of one part); what a member keeps for
    itself is not sent."""

    def __init__(self, *args, send_real: tuple[int, ...], recv_real: tuple[int, ...], send_emu: tuple[float, ...],
                 recv_emu: tuple[float, ...], **kw) -> None:
        super().__init__(*args, **kw)
        self.out = [Chunks.shared(n, 1, b) for n, b in zip(send_real, send_emu, strict=True)]
        self.inn = [Chunks.shared(n, 1, b) for n, b in zip(recv_real, recv_emu, strict=True)]
        self.need = sum(len(lay.segments(0)) for i, lay in enumerate(self.inn) if i != self.rank)
        self.got = 0

    def start(self, t: float) -> list[Seg]:
        if self.need == 0:
            self.finished, self.end_us = True, t
        out = []
        for j, lay in enumerate(self.out):
            if j != self.rank:
                base = j * PAIR_STRIDE
                out += [Seg(j, self.seq, seg, self.own(base + lo, base + hi), lay.seg_emu_bytes(0), t)
                        for seg, lo, hi in lay.segments(0)]
        return out

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        _, lo, hi = self.inn[src].segment_map()[segment]
        base = self.rank * PAIR_STRIDE
        self.check.compare(data, self.own(base + lo, base + hi, worker=src))  # src's message to this one: distinct
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        return []


class SendRecv(Algorithm):
    """One side of a send/recv pair: the whole tensor goes from sender to receiver."""

    def __init__(self, *args, peer: int, sending: bool, **kw) -> None:
        super().__init__(*args, **kw)
        self.peer, self.sending = peer, sending
        self.need = len(self.layout.segments(0))
        self.got = 0

    def start(self, t: float) -> list[Seg]:
        if not self.sending:
            return []
        self.finished, self.end_us = True, t
        return self._sends(self.peer, 0, t, lambda lo, hi: self.own(lo, hi))

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        return self._received(src, segment, data, t)


class PSClient(Algorithm):
    """A worker's side of a parameter-server all_reduce: push each shard, pull the sums."""

    def __init__(self, *args, servers: list[int], **kw) -> None:
        super().__init__(*args, **kw)
        self.servers = servers
        self.need = sum(len(self.layout.segments(j)) for j in range(self.layout.parts))
        self.got = 0

    def start(self, t: float) -> list[Seg]:
        out = []
        for j, server in enumerate(self.servers):
            out += self._sends(server, j, t, lambda lo, hi: self.own(lo, hi))
        return out

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        _, lo, hi = self._map[segment]
        self.check_sum(data, lo, hi)
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        return []


class PSServer:
    """One parameter-server shard: sums each segment over all workers (or, for a sub-group's
    collective, over its members), then sends it to each."""

    def __init__(self, workers: int, groups: tuple[tuple[int, ...] | None, ...] = ()) -> None:
        """``groups``: per collective number within an iteration (``seq`` modulo their count), its
        group's workers in the algorithms' rank order (None: the whole job; empty: always)."""
        self.workers = workers
        self.groups = groups
        self.partial: dict[tuple[int, int], tuple[np.ndarray, int, float, float]] = {}

    def needed(self, seq: int) -> int:
        """The pushes a sum of collective ``seq`` takes: its group's, or every worker's."""
        group = self.groups[seq % len(self.groups)] if self.groups else None
        return self.workers if group is None else len(group)

    def on_segment(self, me: int, src: int, seq: int, segment: int, data: np.ndarray, emu_bytes: float,
                   t: float) -> list[Seg]:
        key = (seq, segment)
        acc, n, latest, _ = self.partial.get(key, (np.zeros(len(data)), 0, 0.0, emu_bytes))
        acc = acc + data
        n += 1
        latest = max(latest, t)
        if n < self.needed(seq):
            self.partial[key] = (acc, n, latest, emu_bytes)
            return []
        self.partial.pop(key, None)
        group = self.groups[seq % len(self.groups)] if self.groups else None
        return [Seg(w, seq, segment, acc, emu_bytes, latest) for w in (range(self.workers) if group is None else group)]
