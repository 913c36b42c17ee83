"""The point-to-point mechanisms: rings, parameter servers, the binomial broadcast, the barrier,
all_to_all and send/recv (``emu.emulator.mechanisms``)."""

from __future__ import annotations

import numpy as np

from emu.emulator.algorithms.batched import BroadcastKernel, ClientKernel, RingKernel
from emu.emulator.algorithms.p2p import (
    Algorithm,
    AllToAll,
    Barrier,
    BinomialBroadcast,
    Chunks,
    PSClient,
    Ring,
    SendRecv,
    UnevenAllToAll,
)
from emu.emulator.algorithms.p2p_hier import HierRing
from emu.emulator.algorithms.sparse_p2p import INDEX_BYTES, SparsePSClient, SparseRing, ps_sparse, ring_sparse
from emu.emulator.mechanisms.base import Mechanism, Sent, Setting, Start, _batches, _real
from emu.emulator.payload.generated import holding, is_sparse
from emu.emulator.physics import forms as physics
from emu.emulator.physics.topology import topology_hier_ring_us, topology_ring_us
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Sparsity

# -- point to point ----------------------------------------------------------------------------------

class PointToPoint(Mechanism):
    """A mechanism whose segments go worker to worker through the switch, which only forwards."""

    def time_us(self, op: Coll, s: Setting) -> float:
        if s.topology is not None:
            return self.on_topology_us(op, s)
        return self.alone_us(op, s)

    def alone_us(self, op: Coll, s: Setting) -> float:
        raise NotImplementedError


class RingAlgorithm(PointToPoint):
    """Ring reduce-scatter then all-gather among the members (all_reduce), or either half."""

    name = "ring"
    kinds = frozenset({CollKind.ALL_REDUCE, CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER})

    def algorithm(self, a: Start) -> Algorithm:
        kind = a.op.kind
        reduce, gather = kind != CollKind.ALL_GATHER, kind != CollKind.REDUCE_SCATTER
        return Ring(**a.common(), layout=a.layout(a.size), reduce=reduce, gather=gather,
                    own=a.rank if kind == CollKind.ALL_REDUCE else a.rank - 1)

    def kernel(self, a: Start, ids: int) -> RingKernel | ClientKernel | BroadcastKernel | None:
        op = a.op
        if not _batches(a):
            return None
        return RingKernel(a.size, a.seq, a.real, a.emu_bytes, op.kind != CollKind.ALL_GATHER,
                          op.kind != CollKind.REDUCE_SCATTER, 0 if op.kind == CollKind.ALL_REDUCE else -1, a.seed,
                          op.dtype.value, a.check, ids)

    def alone_us(self, op: Coll, s: Setting) -> float:
        m = s.group_size(op)
        steps = 2 * (m - 1) if op.kind == CollKind.ALL_REDUCE else m - 1
        return physics.ring_pipelined_us(op.count, op.dtype.itemsize, m, s.link, steps, s.rto_us, s.payload_scale)

    def on_topology_us(self, op: Coll, s: Setting) -> float:
        if op.kind != CollKind.ALL_REDUCE or op.sparsity is not None:
            return super().on_topology_us(op, s)
        if op.count == 0:
            return 0.0
        assert s.topology is not None and s.layout is not None
        return topology_ring_us(op.count, op.dtype.itemsize, s.link, s.topology, s.layout, payload_scale=s.payload_scale)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        per_element = op.dtype.itemsize * 2 * (s.workers - 1)  # 2 (M-1)/M S per worker
        return Sent(_real(op, s) * per_element, op.count * per_element, False)


class HierarchicalRing(RingAlgorithm):
    """Reduce to each node's leader, a ring of the leaders across NICs, broadcast inside
    (emu.emulator.algorithms.p2p_hier): a whole job's all_reduce on a hierarchical topology."""

    name = "hierarchical ring"
    kinds = frozenset({CollKind.ALL_REDUCE})
    hierarchical = True

    def takes(self, op: Coll, s: Setting) -> bool:
        return op.kind == CollKind.ALL_REDUCE and s.hierarchical and op.group is None

    def algorithm(self, a: Start) -> Algorithm:
        node, leaders = a.node()
        return HierRing(**a.common(), layout=a.layout(1), node=node, leaders=leaders, emu_bytes=a.emu_bytes)

    def kernel(self, a: Start, ids: int) -> None:
        return None

    def on_topology_us(self, op: Coll, s: Setting) -> float:
        if op.sparsity is not None:
            return Mechanism.on_topology_us(self, op, s)
        if op.count == 0:
            return 0.0
        assert s.topology is not None and s.layout is not None
        return topology_hier_ring_us(op.count, op.dtype.itemsize, s.link, s.topology, s.layout, s.payload_scale)


class SparseRingAlgorithm(RingAlgorithm):
    """A sparse float all_reduce as an all-gather of every worker's non-zero blocks
    (emu.emulator.algorithms.sparse_p2p), where that sends fewer bytes than the dense ring."""

    name = "sparse ring"
    kinds = frozenset({CollKind.ALL_REDUCE})

    def takes(self, op: Coll, s: Setting) -> bool:
        return (op.kind == CollKind.ALL_REDUCE and is_sparse(op.sparsity, op.dtype.value)
                and ring_sparse(op.sparsity, s.group_size(op), op.dtype.itemsize))

    def algorithm(self, a: Start) -> Algorithm:
        return SparseRing(**a.common(), layout=a.layout(a.size))

    def kernel(self, a: Start, ids: int) -> None:
        return None

    def alone_us(self, op: Coll, s: Setting) -> float:
        assert op.sparsity is not None
        return physics.sparse_ring_us(op.count, op.dtype.itemsize, s.group_size(op), op.sparsity, s.link, s.rto_us,
                                      s.payload_scale)

    def on_topology_us(self, op: Coll, s: Setting) -> float:
        return Mechanism.on_topology_us(self, op, s)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        dense = super().sent(op, s, seq, sparsity).dense
        return Sent((s.workers - 1) * _held(op, s, seq, sparsity)[0], dense, True)  # each set crosses M-1 links


def _held(op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> tuple[float, float]:
    """Every worker's set of non-zero blocks (values and indices), summed, and their union's bytes,
    from the same hashes that made the payload (so the same on every process layout)."""
    real, size, k = _real(op, s), op.dtype.itemsize, sparsity.block_elements
    blocks = -(-real // k)
    lengths = np.minimum(k, real - np.arange(blocks, dtype=np.int64) * k)
    holders = holding(s.seed, seq, np.arange(blocks), s.workers, sparsity).holders
    held = float(np.sum(holders * (lengths * size + INDEX_BYTES)))
    union = float(np.sum(np.where(holders > 0, lengths * size + INDEX_BYTES, 0)))
    return held, union


class ParameterServerAlgorithm(PointToPoint):
    """Push each shard's chunk to its parameter-server shard, pull the sums back (any dtype)."""

    name = "parameter server"
    kinds = frozenset({CollKind.ALL_REDUCE})
    servers = True

    def algorithm(self, a: Start) -> Algorithm:
        return PSClient(**a.common(), layout=a.layout(len(a.servers)), servers=list(a.servers))

    def kernel(self, a: Start, ids: int) -> RingKernel | ClientKernel | BroadcastKernel | None:
        if not _batches(a):
            return None
        return ClientKernel(a.size, a.seq, a.real, a.emu_bytes, a.servers, a.seed, a.op.dtype.value, a.check, ids)

    def alone_us(self, op: Coll, s: Setting) -> float:
        m = s.group_size(op)
        return physics.ps_all_reduce_us(op.count, op.dtype.itemsize, m, s.shards or m, s.link, s.rto_us,
                                        s.payload_scale)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        per_element = op.dtype.itemsize * 2 * s.workers  # push and pull of S per worker
        return Sent(_real(op, s) * per_element, op.count * per_element, False)


class SparseParameterServer(ParameterServerAlgorithm):
    """Push each worker's non-zero blocks, pull the union of the sums (emu.emulator.algorithms.sparse_p2p),
    where that sends fewer bytes than the dense push and pull."""

    name = "sparse parameter server"

    def takes(self, op: Coll, s: Setting) -> bool:
        return (op.kind == CollKind.ALL_REDUCE and is_sparse(op.sparsity, op.dtype.value)
                and ps_sparse(op.sparsity, s.group_size(op), op.dtype.itemsize))

    def algorithm(self, a: Start) -> Algorithm:
        return SparsePSClient(**a.common(), layout=a.layout(len(a.servers)), servers=list(a.servers))

    def kernel(self, a: Start, ids: int) -> None:
        return None

    def alone_us(self, op: Coll, s: Setting) -> float:
        assert op.sparsity is not None
        m = s.group_size(op)
        return physics.sparse_ps_us(op.count, op.dtype.itemsize, m, s.shards or m, op.sparsity, s.link, s.rto_us,
                                    s.payload_scale)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        dense = super().sent(op, s, seq, sparsity).dense
        held, union = _held(op, s, seq, sparsity)
        return Sent(held + s.workers * union, dense, True)  # the pushes, and the union to every worker


class BinomialTree(PointToPoint):
    """A broadcast down a binomial tree from its root (log2 M hops)."""

    name = "binomial tree"
    kinds = frozenset({CollKind.BROADCAST})

    def algorithm(self, a: Start) -> Algorithm:
        return BinomialBroadcast(**a.common(), layout=a.layout(1), root=a.root)

    def kernel(self, a: Start, ids: int) -> BroadcastKernel | None:
        if not _batches(a):
            return None
        return BroadcastKernel(a.size, a.seq, a.real, a.emu_bytes, a.root, a.seed, a.op.dtype.value, a.check, ids)

    def alone_us(self, op: Coll, s: Setting) -> float:
        return physics.tree_broadcast_us(op.count, op.dtype.itemsize, s.group_size(op), s.link, s.rto_us,
                                         s.payload_scale)


class Dissemination(PointToPoint):
    """A barrier: ceil(log2 M) rounds of empty messages."""

    name = "dissemination"
    kinds = frozenset({CollKind.BARRIER})

    def algorithm(self, a: Start) -> Algorithm:
        rounds = max(1, (a.size - 1).bit_length())
        return Barrier(**a.common("uint8"), layout=Chunks(0, rounds, 0.0))

    def alone_us(self, op: Coll, s: Setting) -> float:
        return physics.barrier_us(s.group_size(op), s.link, s.rto_us)


class Direct(PointToPoint):
    """all_to_all: chunk j of every member's tensor straight to member j."""

    name = "direct"
    kinds = frozenset({CollKind.ALL_TO_ALL})

    def algorithm(self, a: Start) -> Algorithm:
        sp = a.op.splits
        if sp is None:
            return AllToAll(**a.common(), layout=a.layout(a.size))
        item, r = a.op.dtype.itemsize, a.scale
        return UnevenAllToAll(**a.common(), layout=Chunks.shared(0, 1, 0.0),
                              send_real=tuple(-(-n // r) for n in sp.send_elements),
                              recv_real=tuple(-(-n // r) for n in sp.recv_elements),
                              send_emu=tuple(float(n * item) for n in sp.send_elements),
                              recv_emu=tuple(float(n * item) for n in sp.recv_elements))

    def alone_us(self, op: Coll, s: Setting) -> float:
        if op.splits is not None:
            raise ConfigError(f"all_to_all {op.id} has per-peer sizes (splits), and its time depends on every "
                              "member's: predict the whole trace (emu predict), which gathers them, or replay it")
        return physics.all_to_all_us(op.count, op.dtype.itemsize, s.group_size(op), s.link, s.rto_us, s.payload_scale)

    def exchange_ends(self, sent: list[list[int]], op: Coll, s: Setting, starts: list[float]) -> list[float]:
        """An uneven all_to_all alone on the links, each member's end: ``sent[i][j]`` the elements
        member i sends member j (every member's ``splits.send_elements``, in the group's order),
        ``starts`` when each began (a member that starts early sends early); on a topology, refused
        as every point-to-point form is (``on_topology_us``)."""
        if s.topology is not None:
            self.on_topology_us(op, s)  # raises: no point-to-point form on a topology
        return [float(e) for e in physics.uneven_all_to_all_ends(sent, op.dtype.itemsize, s.link, s.rto_us,
                                                                 s.payload_scale, starts)]


class SendReceive(PointToPoint):
    """One side of a send/recv pair: the whole tensor from sender to receiver (the job's ranks)."""

    name = "point to point"
    kinds = frozenset({CollKind.SEND, CollKind.RECV})

    def algorithm(self, a: Start) -> Algorithm:
        return SendRecv(**a.common(), layout=a.layout(1), peer=a.op.peer or 0, sending=a.op.kind == CollKind.SEND)

    def alone_us(self, op: Coll, s: Setting) -> float:
        return physics.send_recv_us(op.count, op.dtype.itemsize, s.link, s.rto_us, s.payload_scale)


