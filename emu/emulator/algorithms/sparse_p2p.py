"""Sparse ring and parameter-server all_reduce: only the non-zero blocks cross the links.

A float all_reduce whose payload is sparse (``emu.emulator.payload.generated``: blocks of ``K`` elements,
worker ``w`` non-zero only in the blocks it holds) runs, on ``ring`` and ``ps``, as:

- ``SparseRing``: a sparse all-gather. Each worker's non-zero blocks (values and block indices)
  go around the ring in M-1 steps: a worker sends its own block set to its right neighbour,
  then forwards every set it receives unless the neighbour is that set's origin. Sets travel
  in parts of at most ``SEG_ELEMENTS`` values (whole blocks), each forwarded as it arrives, so
  the steps pipeline as in the dense ring. Each worker sums what it received with its own.
- ``SparsePSClient`` / ``SparsePSServer``: a worker pushes, to the shard owning each range of
  blocks, only its non-zero blocks there; the shard sums them, and once every worker's push is
  in sends back only the union's blocks of its range to every worker.

The choice between these and the dense algorithms (``ring_sparse`` / ``ps_sparse``) is per
collective, from its job-wide ``Sparsity`` that every worker knows, so it is the same on every
worker: sparse when its bytes per link are below the dense algorithm's.

Messages. A block index costs ``INDEX_BYTES`` (4) on the emulated wire, next to the block's
values in the collective's dtype; with payload scale ``R`` each real block stands for ``R``
emulated ones, indices included (``emu_bytes``). The real message is self-describing, as a real
sparse protocol's is: a float64 array of a small header, the block indices and the values
(every value exact in the collective's dtype: they are rounded through it when packed), so the
receiver places what it got without knowing the sender's blocks. Its segment number carries
``SPARSE_SEGMENT`` so that a shard tells sparse pushes from dense ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.algorithms.p2p import SEG_ELEMENTS, Algorithm, Seg
from emu.emulator.payload.generated import hold_probability, holding
from emu.emulator.protocol.rows import positions
from emu.emulator.protocol.transport import ITEMSIZE, decode_values, encode_values
from emu.emulator.protocol.wire import DTYPE_CODES
from emu.traces.model import Sparsity

INDEX_BYTES = 4  # a block index on the emulated wire (uint32: 2^32 blocks of any K)
SPARSE_SEGMENT = 1 << 31  # set in the segment number of every sparse message
WIRE_DTYPE = "float64"  # the real message's dtype: holds every value and index exactly
# origin, part, parts, K, real elements, blocks, dtype code, emu bytes per value, emu bytes per index
_HEAD = 9


# -- the choice ----------------------------------------------------------------------------------

def index_overhead(block_elements: int, itemsize: int) -> float:
    """Index bytes per value byte of a sent block."""
    return INDEX_BYTES / (block_elements * itemsize)


def worker_fraction(sparsity: Sparsity, workers: int) -> float:
    """The expected fraction of blocks a worker holds: ``f``, or ``u/M`` where f < u/M (the anchors
    alone hold that much; docs/sparse.md)."""
    m = max(1, workers)
    return sparsity.union * (1 / m + (1 - 1 / m) * hold_probability(sparsity, m))


def ring_sparse(sparsity: Sparsity | None, workers: int, itemsize: int) -> bool:
    """Whether the ring runs the sparse all-gather: its bytes per link, ``(M-1) f S (1 + o)``, below
    the dense ring's ``2 (M-1)/M S`` (o: ``index_overhead``)."""
    if sparsity is None or workers < 2:
        return False
    if sparsity.sparse_tensor:  # the framework's sparse all_reduce is this all-gather, whatever the cost
        return True
    o = index_overhead(sparsity.block_elements, itemsize)
    return worker_fraction(sparsity, workers) * (1 + o) < 2 / workers


def ps_sparse(sparsity: Sparsity | None, workers: int, itemsize: int) -> bool:
    """Whether the parameter server runs sparse: a worker's push and pull, ``(f + u) S (1 + o)``,
    below the dense ``2 S`` (and so each shard's, M times its share of that)."""
    if sparsity is None:
        return False
    if sparsity.sparse_tensor:  # a sparse tensor travels sparse
        return True
    o = index_overhead(sparsity.block_elements, itemsize)
    return (worker_fraction(sparsity, workers) + sparsity.union) * (1 + o) < 2


# -- messages ------------------------------------------------------------------------------------

def block_positions(blocks: np.ndarray, k: int, real: int) -> np.ndarray:
    """The element positions of ``blocks`` (sorted), in order; the tensor's last block may be short."""
    if len(blocks) == 0:
        return np.zeros(0, np.int64)
    starts = blocks.astype(np.int64) * k
    return positions(starts, np.minimum(k, real - starts))


@dataclass(frozen=True)
class Message:
    """A sparse message's contents: ``blocks`` and their ``values`` (positions in block order)."""

    origin: int  # whose block set (ring) or which endpoint sent it (ps)
    part: int
    parts: int
    k: int
    real: int
    blocks: np.ndarray  # int64
    values: np.ndarray  # float64
    dtype: str  # the collective's
    value_bytes: float  # emulated bytes per value (itemsize x R)
    index_bytes: float  # emulated bytes per index (INDEX_BYTES x R)

    @property
    def emu_bytes(self) -> float:
        return len(self.values) * self.value_bytes + len(self.blocks) * self.index_bytes

    def pack(self) -> np.ndarray:
        head = [self.origin, self.part, self.parts, self.k, self.real, len(self.blocks),
                DTYPE_CODES.index(self.dtype), self.value_bytes, self.index_bytes]
        return np.concatenate([np.array(head, np.float64), self.blocks.astype(np.float64), self.values])

    @classmethod
    def unpack(cls, data: np.ndarray) -> Message:
        origin, part, parts, k, real, n, code = (int(x) for x in data[:7])
        blocks = data[_HEAD:_HEAD + n].astype(np.int64)
        return cls(origin, part, parts, k, real, blocks, data[_HEAD + n:], DTYPE_CODES[code], float(data[7]),
                   float(data[8]))


def split(origin: int, blocks: np.ndarray, dense: np.ndarray, k: int, real: int, value_bytes: float,
          index_bytes: float, dtype: str) -> list[Message]:
    """A block set cut into even parts of whole blocks, at most SEG_ELEMENTS values each (an empty set is
    one empty part: the receiver learns there is nothing); values taken from ``dense``, rounded
    through ``dtype`` (exact by the payload model; a value that is not would fail verification)."""
    per = max(1, SEG_ELEMENTS // k)
    g = max(1, -(-len(blocks) // per))  # parts of even size, as the dense layout's segments
    groups = [blocks[i * len(blocks) // g:(i + 1) * len(blocks) // g] for i in range(g)]
    out = []
    for i, b in enumerate(groups):
        values = decode_values(encode_values(dense[block_positions(b, k, real)], dtype), dtype)
        out.append(Message(origin, i, len(groups), k, real, b, values, dtype, value_bytes, index_bytes))
    return out


class _Parts:
    """Counts the parts received per origin: complete when ``origins`` origins sent all theirs."""

    def __init__(self, origins: int) -> None:
        self.origins = origins
        self.expected: dict[int, int] = {}
        self.got: dict[int, int] = {}

    def add(self, msg: Message) -> None:
        self.expected[msg.origin] = msg.parts
        self.got[msg.origin] = self.got.get(msg.origin, 0) + 1

    @property
    def complete(self) -> bool:
        return len(self.expected) == self.origins and all(self.got[o] == n for o, n in self.expected.items())


# -- algorithms ----------------------------------------------------------------------------------

class _Sparse(Algorithm):
    """What both sparse algorithms share: this worker's blocks and the emulated sizes."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        assert self.sparsity is not None
        self.k = self.sparsity.block_elements
        real = self.layout.real
        self.nblocks = -(-real // self.k)
        itemsize = ITEMSIZE[self.dtype]
        scale = self.layout.emu_bytes / (real * itemsize) if real else 0.0  # R: emulated per real
        self.value_bytes, self.index_bytes = scale * itemsize, scale * INDEX_BYTES
        self.values = self.own(0, real)  # this worker's gradient, zero outside its blocks
        held = holding(self.seed, self.seq, np.arange(self.nblocks), self.size, self.sparsity).held(self.rank)
        self.mine = np.flatnonzero(held).astype(np.int64)

    def _split(self, origin: int, blocks: np.ndarray, dense: np.ndarray) -> list[Message]:
        return split(origin, blocks, dense, self.k, self.layout.real, self.value_bytes, self.index_bytes,
                     self.dtype)

    def _seg(self, dst: int, segment: int, msg: Message, t: float) -> Seg:
        return Seg(dst, self.seq, SPARSE_SEGMENT | segment, msg.pack(), msg.emu_bytes, t, wire_dtype=WIRE_DTYPE)

    def _verify(self, got: np.ndarray, t: float) -> None:
        self.check.compare(got, self.total(0, self.layout.real), distinct=self.distinct)
        self.finished = True
        self._done(t)


class SparseRing(_Sparse):
    """A worker's side of the sparse all-gather (module docstring). Segment ``part * M + origin``."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.right = (self.rank + 1) % self.size
        self.acc = self.values  # the sum builds on this worker's own (its parts are copies, made at start)
        self.parts = _Parts(self.size - 1)

    def start(self, t: float) -> list[Seg]:
        if self.size == 1:
            self._verify(self.acc, t)
            return []
        return [self._seg(self.right, m.part * self.size + self.rank, m, t)
                for m in self._split(self.rank, self.mine, self.values)]

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        msg = Message.unpack(data)
        self.acc[block_positions(msg.blocks, msg.k, msg.real)] += msg.values
        self.parts.add(msg)
        self._done(t)
        out = []
        if self.right != msg.origin:  # the set's last hop is the origin's left neighbour
            out.append(Seg(self.right, self.seq, segment, data, msg.emu_bytes, t, wire_dtype=WIRE_DTYPE))
        if self.parts.complete:
            self._verify(self.acc, t)
        return out


class SparsePSClient(_Sparse):
    """A worker's side of the sparse parameter server: shard ``j`` of ``P`` owns blocks
    ``[j B / P, (j+1) B / P)``; pushes are segment ``part * M + rank``."""

    def __init__(self, *args, servers: list[int], **kw) -> None:
        super().__init__(*args, **kw)
        self.servers = servers
        self.acc = np.zeros(self.layout.real)
        self.parts = _Parts(len(servers))

    def start(self, t: float) -> list[Seg]:
        out = []
        p = len(self.servers)
        for j, server in enumerate(self.servers):
            lo, hi = j * self.nblocks // p, (j + 1) * self.nblocks // p
            mine = self.mine[(self.mine >= lo) & (self.mine < hi)]
            out += [self._seg(server, m.part * self.size + self.rank, m, t)
                    for m in self._split(self.rank, mine, self.values)]
        self.values = self.values[:0]  # pushed: only the sums are kept from here
        return out

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        msg = Message.unpack(data)
        self.acc[block_positions(msg.blocks, msg.k, msg.real)] = msg.values
        self.parts.add(msg)
        self._done(t)
        if self.parts.complete:
            self._verify(self.acc, t)
        return []


@dataclass
class _Shard:
    acc: np.ndarray  # float64 over the real tensor (only this shard's range is touched)
    present: np.ndarray  # bool per block: some worker sent it
    parts: _Parts
    latest: float = 0.0


class SparsePSServer:
    """One shard's sparse side: sums the pushed blocks; once every worker's push is in, sends the
    union's blocks (those some worker sent) to every worker, at the last push's arrival, from
    worker ``me mod M`` on."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pending: dict[int, _Shard] = {}

    def on_segment(self, me: int, seq: int, data: np.ndarray, t: float) -> list[Seg]:
        msg = Message.unpack(data)
        shard = self.pending.get(seq)
        if shard is None:
            nblocks = -(-msg.real // msg.k)
            shard = self.pending[seq] = _Shard(np.zeros(msg.real), np.zeros(nblocks, bool), _Parts(self.workers))
        shard.acc[block_positions(msg.blocks, msg.k, msg.real)] += msg.values
        shard.present[msg.blocks] = True
        shard.parts.add(msg)
        shard.latest = max(shard.latest, t)
        if not shard.parts.complete:
            return []
        del self.pending[seq]
        union = np.flatnonzero(shard.present).astype(np.int64)
        # the sums are rounded through the collective's dtype, as a real shard would send them
        replies = split(me, union, shard.acc, msg.k, msg.real, msg.value_bytes, msg.index_bytes, msg.dtype)
        # shard j answers the workers from worker j on: the shards' replies do not all queue at worker
        # 0's downlink first (each would wait for the others' whole answers)
        # (segment ``part * M + i`` for the i-th worker served: the hosts send in segment order)
        m = self.workers
        return [Seg((me + i) % m, seq, SPARSE_SEGMENT | (r.part * m + i), r.pack(), r.emu_bytes, shard.latest,
                    wire_dtype=WIRE_DTYPE) for r in replies for i in range(m)]

