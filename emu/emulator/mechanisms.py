"""The mechanisms that run a collective, and the one rule that picks one (docs/design.md, "Mechanisms").

A mechanism is one way a collective crosses the fabric: the switch's aggregation stream, a ring,
a hierarchical ring, a sparse ring, a parameter server (dense or sparse), a binomial-tree
broadcast, a dissemination barrier, a direct all_to_all, a send/recv pair; other modules add
theirs (``emu.emulator.algorithms.tree``: NCCL's double binary tree). Each mechanism owns everything about
itself: which collectives it takes in a ``Setting`` (fabric, group, topology), the algorithm a
worker runs (point-to-point ones: ``emu.emulator.algorithms.p2p`` state machines), its closed form alone on
the links (``emu predict``, adaptive compression), its bytes on the wire for the report's sparsity,
and whether the report counts it as a fallback.

A fabric lists its mechanisms in order of preference (``Fabric.mechanisms``); ``choose`` takes the
first that takes the collective. The host, the point-to-point endpoint, the report, predict and
compression all ask ``choose``, so the rule exists once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from emu.emulator.algorithms.batched import BroadcastKernel, ClientKernel, RingKernel
from emu.emulator.algorithms.p2p import (
    Algorithm,
    AllToAll,
    Barrier,
    BinomialBroadcast,
    Check,
    Chunks,
    PSClient,
    Ring,
    SendRecv,
    UnevenAllToAll,
)
from emu.emulator.algorithms.p2p_hier import HierRing
from emu.emulator.algorithms.sparse_p2p import INDEX_BYTES, SparsePSClient, SparseRing, ps_sparse, ring_sparse
from emu.emulator.links import topology as shape
from emu.emulator.links.spec import LinkSpec
from emu.emulator.payload.generated import holding, is_sparse
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.physics import forms as physics
from emu.emulator.physics.topology import topology_hier_ring_us, topology_ina_us, topology_ring_us
from emu.emulator.protocol.sparse_ina import packet_union, stream_bytes, streams_sparse
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Dtype, Sparsity

if TYPE_CHECKING:
    from emu.emulator.fabric import Fabric


@dataclass(frozen=True)
class Setting:
    """Where collectives run: the fabric and everything the choice and the closed forms depend on."""

    fabric: Fabric
    workers: int  # the job's
    link: LinkSpec = LinkSpec()
    elements: int = 64  # int32 elements per aggregation packet
    slots: int = 4096  # the INA pool on the emulated wire
    real_slots: int = 4096  # the pool's slots really sent (slots / payload scale)
    rto_us: float = 0.0
    shards: int | None = None  # parameter-server shards (None: one per worker)
    payload_scale: int = 1
    seed: int = 0
    topology: shape.Topology | None = None
    layout: shape.Layout | None = None
    packet_rate: float | None = None  # the switch pipeline's packets a second (None: unlimited)

    @property
    def hierarchical(self) -> bool:
        return self.topology is not None and self.topology.algorithm == shape.Hierarchy.HIERARCHICAL

    @property
    def leaves(self) -> int:
        return 1 if self.layout is None else self.layout.leaves

    def inside_a_node(self, group: tuple[int, ...] | None) -> bool:
        """Whether a group's workers all sit in one node of the topology (never without one)."""
        if group is None or self.layout is None:
            return False
        return _inside(group, self.layout)

    def group_size(self, op: Coll) -> int:
        return len(op.group) if op.group is not None else self.workers


def _inside(group: tuple[int, ...], layout: shape.Layout) -> bool:
    key = (group, id(layout))
    found = _INSIDE.get(key)
    if found is None or found[0] is not layout:
        found = _INSIDE[key] = (layout, len(set(layout.node[list(group)].tolist())) == 1)
        if len(_INSIDE) > 4096:
            _INSIDE.pop(next(iter(_INSIDE)))
    return found[1]


# a host asks at every collective it starts (the layout is kept with its answer, so that its id
# cannot be another layout's)
_INSIDE: dict[tuple[tuple[int, ...], int], tuple[shape.Layout, bool]] = {}


@dataclass(frozen=True)
class Start:
    """What a point-to-point mechanism needs to build one worker's algorithm for one collective."""

    op: Coll
    rank: int  # among the collective's members (its group's, else the job's)
    size: int  # the members
    seq: int  # the collective's number on the worker's stream
    real: int  # real elements of the tensor (count / payload scale)
    seed: int
    check: Check
    recorded: RecordedPayload | None  # the real ranks' tensors (emu run), else generated payload
    servers: tuple[int, ...]  # the parameter-server shards' endpoint ids
    node: Callable[[], tuple[list[int], list[int]]]  # the worker's node (leader first) and every leader
    root: int  # a broadcast's root among the members
    # each member's node, in member order (every member a node of its own without a topology)
    member_nodes: Callable[[], tuple[int, ...]]
    scale: int = 1  # the payload scale: an emulated element count n is ceil(n / scale) real ones

    @property
    def emu_bytes(self) -> float:
        return float(self.op.count * self.op.dtype.itemsize)

    def layout(self, parts: int) -> Chunks:
        return Chunks.shared(self.real, parts, self.emu_bytes)

    def common(self, dtype: str | None = None) -> dict:
        """The keyword arguments every ``emu.emulator.algorithms.p2p.Algorithm`` takes."""
        op = self.op
        return dict(rank=self.rank, size=self.size, seq=self.seq, dtype=dtype or op.dtype.value, seed=self.seed,
                    check=self.check, sparsity=op.sparsity, recorded=None if op.sparsity is not None else self.recorded)


@dataclass(frozen=True)
class Sent:
    """A sparse float all_reduce's payload bytes (values and indices) over the links, each message
    once where it was sent. The report counts what crossed the wire (``HostResult.carried``); this
    is the same from the hashes that made the payload, which at payload scale 1 equals the count
    (tests/replay/test_sent_bytes.py)."""

    sent: float  # what the mechanism sends, from the hashes: real bytes (of ceil(count / R) elements)
    dense: float  # what its dense algorithm sends: emulated bytes (of the collective's count)
    sparse: bool  # it runs a sparse algorithm


class Mechanism:
    """One way a collective runs. Subclasses set the class attributes and override what applies."""

    name: ClassVar[str]  # in the report's words
    kinds: ClassVar[frozenset[CollKind]]
    stream: ClassVar[bool] = False  # on the switch's aggregation stream (else point to point)
    servers: ClassVar[bool] = False  # needs parameter-server shards (endpoints of their own)
    hierarchical: ClassVar[bool] = False  # what it does with topology.algorithm = "hierarchical"

    def takes(self, op: Coll, s: Setting) -> bool:
        return op.kind in self.kinds

    def algorithm(self, a: Start) -> Algorithm:
        raise NotImplementedError(f"{self.name} runs on the switch's stream, not point to point")

    def kernel(self, a: Start, ids: int) -> RingKernel | ClientKernel | BroadcastKernel | None:
        """The collective's algorithm for every member a host holds at once, a window's segments at
        a time (``emu.emulator.algorithms.batched``), where this mechanism has one for it: the same
        sends and checks as ``algorithm``'s on each member. None (the default): ``algorithm``, per
        worker. ``ids``: how many endpoint ids there are."""
        return None

    def time_us(self, op: Coll, s: Setting) -> float:
        """Its closed form: one collective alone on the links, from its start on every member to the
        last member's completion (docs/physics.md). On a topology, ``on_topology_us``."""
        raise NotImplementedError

    def spread_us(self, op: Coll, s: Setting) -> float:
        """How much earlier than the last member the first completes, alone on the links (the members
        that start their next work that much sooner); 0 where they finish together, or nearly."""
        return 0.0

    def on_topology_us(self, op: Coll, s: Setting) -> float:
        what = ("a sparse all_reduce" if op.kind == CollKind.ALL_REDUCE and op.sparsity is not None
                else f"{op.kind.value} of {op.dtype.value} by the {self.name}")
        raise ConfigError(f"{what} on a topology: emu predict's topology forms take dense all_reduces on ina and "
                          "ring (docs/physics.md, 'On a topology'); replay it (emu replay)")

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        """A sparse float all_reduce's payload bytes (docs/sparse.md): the dense ones' by default."""
        raise NotImplementedError(f"{self.name} runs no all_reduce")

    def fallback(self, op: Coll, s: Setting) -> bool:
        """Whether the report counts ``op`` as a fallback (``fabric.fallbacks``): a collective the
        fabric's switch aggregates in some setting (an all_reduce, reduce_scatter or all_gather on a
        fabric that sums in its switch) that runs point to point here across the switch (an integer
        all_reduce, a sub-group the P4 program has no pool for, a reduce_scatter on hierarchical INA
        over leaves). A point-to-point fabric's own algorithms are never fallbacks, nor are kinds that
        no switch aggregates (broadcast, all_to_all, barrier, send, recv), nor a group inside a node,
        which never reaches the switch."""
        return (not self.stream and op.kind in STREAM.kinds and s.fabric.aggregates
                and not s.inside_a_node(op.group))

    def __repr__(self) -> str:
        return f"<mechanism {self.name}>"


def _batches(a: Start) -> bool:
    """Whether a kernel runs the collective (``Mechanism.kernel``): a whole job's, on generated dense
    payload (a sub-group's members, the real ranks' tensors and sparse payload run per worker)."""
    op = a.op
    return op.group is None and a.recorded is None and not is_sparse(op.sparsity, op.dtype.value)


def _real(op: Coll, s: Setting) -> int:
    return -(-op.count // s.payload_scale) if op.count else 0


# -- the switch ------------------------------------------------------------------------------------

class Stream(Mechanism):
    """In-network aggregation: the self-clocking stream of emu.emulator.protocol.ina through the switch (and,
    on hierarchical INA, its leaves)."""

    name = "switch"
    kinds = frozenset({CollKind.ALL_REDUCE, CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER})
    stream = True
    hierarchical = True  # leaves aggregate first (docs/topology.md)

    def takes(self, op: Coll, s: Setting) -> bool:
        """A float all_reduce of the whole job, or of a sub-group that leaves its node (one inside a
        node sums over the node's own links, as NVLink does) where the switch keeps a pool for each
        (``Fabric.group_pools``: emu.replay.host.pools); and, where the switch runs them
        (``Fabric.scatter_gather``), a float reduce_scatter (the sum to each shard's owner) or an all_gather of any dtype (each
        shard multicast), but not on hierarchical INA over several leaves, whose leaves keep one
        partial sum an all_reduce's chunk (docs/protocol.md)."""
        if op.kind == CollKind.ALL_REDUCE:
            return op.dtype.is_float and (op.group is None or (s.fabric.group_pools and not s.inside_a_node(op.group)))
        if op.kind not in (CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER) or not s.fabric.scatter_gather:
            return False
        if op.group is not None and not s.fabric.group_pools:
            return False
        if op.kind == CollKind.REDUCE_SCATTER and not op.dtype.is_float:
            return False
        if s.leaves > 1 and s.hierarchical:
            return False
        return not s.inside_a_node(op.group)

    def time_us(self, op: Coll, s: Setting) -> float:
        if s.topology is not None:
            return self.on_topology_us(op, s)
        m, link = s.group_size(op), s.link
        if op.count == 0:
            return 0.0
        if op.kind == CollKind.REDUCE_SCATTER:
            t = physics.ina_reduce_scatter_us(op.count, m, link, s.elements, s.slots)
        elif op.kind == CollKind.ALL_GATHER:
            t = physics.ina_all_gather_us(op.count, op.dtype.itemsize, m, link, s.elements)
        else:
            return self._all_reduce_us(op, s)
        if link.loss > 0 and t:
            t += physics.ina_loss_extra_us(op.count, link, m, s.slots, s.rto_us, s.elements)
        return t

    def _all_reduce_us(self, op: Coll, s: Setting) -> float:
        m, link = s.group_size(op), s.link
        sparse = self.streams_sparse(op, s)
        if sparse:
            assert op.sparsity is not None
            t = physics.sparse_ina_us(op.count, op.sparsity, link, s.elements, s.slots)
            streamed = math.ceil(packet_union(op.sparsity, s.elements) * op.count)  # what crosses, and loss can hit
        else:
            t, streamed = physics.ina_detail_us(op.count, link, s.elements, s.slots), op.count
        if link.loss > 0:
            t += physics.ina_loss_extra_us(streamed, link, m, s.slots, s.rto_us, s.elements)
        if s.packet_rate is not None:
            if op.sparsity is not None:
                raise ConfigError("--packet-rate with a sparse all_reduce: emu predict's pipeline form takes "
                                  "dense ones (docs/topology.md, 'Switch limits'); replay it (emu replay)")
            # the links' time (loss included), or the pipeline's where it is slower
            t = max(t, physics.pipeline_bound_us(op.count, link, s.elements, s.slots, m, s.packet_rate))
        return t

    def streams_sparse(self, op: Coll, s: Setting) -> bool:
        """Whether a sparse all_reduce streams sparse (only the blocks some worker holds) in ``s``."""
        # any float dtype: the choice depends on the dtype only through whether it is a float
        return (s.fabric.sparse_stream and op.sparsity is not None
                and streams_sparse(op.sparsity, "float32", _real(op, s), s.elements,
                                   max(1, -(-s.slots // s.payload_scale))))

    def on_topology_us(self, op: Coll, s: Setting) -> float:
        if op.kind != CollKind.ALL_REDUCE or op.sparsity is not None:
            return super().on_topology_us(op, s)
        if op.count == 0:
            return 0.0
        assert s.topology is not None and s.layout is not None
        return topology_ina_us(op.count, s.link, s.topology, s.layout, s.elements, s.slots)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity: Sparsity) -> Sent:
        """int32 values in packets of k (emu.emulator.protocol.sparse_ina)."""
        real, k, m = _real(op, s), s.elements, s.workers
        dense = 2.0 * m * -(-op.count // k) * 4 * k
        if s.fabric.sparse_stream and streams_sparse(sparsity, op.dtype.value, real, k, s.real_slots):
            got, _ = stream_bytes(s.seed, seq, real, k, s.real_slots, m, sparsity, op.dtype.value)
            return Sent(got, dense, True)
        return Sent(2.0 * m * -(-real // k) * 4 * k, dense, False)


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

    def exchange_us(self, sent: list[list[int]], op: Coll, s: Setting) -> float:
        """An uneven all_to_all alone on the links, ``sent[i][j]`` the elements member i sends member j
        (every member's ``splits.send_elements``, in the group's order); on a topology, refused as
        every point-to-point form is (``on_topology_us``)."""
        if s.topology is not None:
            return self.on_topology_us(op, s)
        return physics.uneven_all_to_all_us(sent, op.dtype.itemsize, s.link, s.rto_us, s.payload_scale)


class SendReceive(PointToPoint):
    """One side of a send/recv pair: the whole tensor from sender to receiver (the job's ranks)."""

    name = "point to point"
    kinds = frozenset({CollKind.SEND, CollKind.RECV})

    def algorithm(self, a: Start) -> Algorithm:
        return SendRecv(**a.common(), layout=a.layout(1), peer=a.op.peer or 0, sending=a.op.kind == CollKind.SEND)

    def alone_us(self, op: Coll, s: Setting) -> float:
        return physics.send_recv_us(op.count, op.dtype.itemsize, s.link, s.rto_us, s.payload_scale)


# -- the table -------------------------------------------------------------------------------------

STREAM = Stream()
RING = RingAlgorithm()
HIERARCHICAL_RING = HierarchicalRing()
SPARSE_RING = SparseRingAlgorithm()
PARAMETER_SERVER = ParameterServerAlgorithm()
SPARSE_PARAMETER_SERVER = SparseParameterServer()
BINOMIAL_TREE = BinomialTree()
DISSEMINATION = Dissemination()
DIRECT = Direct()
SEND_RECV = SendReceive()
# what every fabric runs point to point for the kinds no switch aggregates
COMMON = (BINOMIAL_TREE, DISSEMINATION, DIRECT, SEND_RECV)

_BY_NAME: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism to the table (a second one under a taken name is refused)."""
    have = _BY_NAME.get(mechanism.name)
    if have is not None and type(have) is not type(mechanism):
        raise ValueError(f"a mechanism called {mechanism.name!r} is registered already ({type(have).__name__})")
    _BY_NAME[mechanism.name] = mechanism
    return mechanism


for _m in (STREAM, RING, HIERARCHICAL_RING, SPARSE_RING, PARAMETER_SERVER, SPARSE_PARAMETER_SERVER, *COMMON):
    register(_m)


def named(name: str) -> Mechanism:
    return _BY_NAME[name]


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def choose(op: Coll, s: Setting) -> Mechanism:
    """The mechanism that runs ``op`` in ``s``: the first of the fabric's that takes it."""
    return _choose(s.fabric.mechanisms, op, s)


def _choose(table: tuple[Mechanism, ...], op: Coll, s: Setting) -> Mechanism:
    for mech in table:
        if mech.takes(op, s):
            return mech
    raise ConfigError(f"--fabric {s.fabric.name} has no mechanism for a {op.kind.value} of {op.dtype.value}")


def time_us(op: Coll, s: Setting) -> float:
    """``op`` alone on the links as its mechanism runs it (the closed form)."""
    return choose(op, s).time_us(op, s)


def collective_us(kind: CollKind, count: int, dtype: Dtype, s: Setting, sparsity: Sparsity | None = None) -> float:
    """The closed form of one collective of ``count`` elements of the whole job (``time_us``)."""
    op = Coll(id=0, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize, group_size=s.workers,
              sparsity=sparsity)
    return time_us(op, s)
