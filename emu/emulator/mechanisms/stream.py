"""The switch's aggregation stream as a mechanism (``emu.emulator.mechanisms``)."""

from __future__ import annotations

import math

from emu.emulator.mechanisms.base import STREAM_KINDS, Mechanism, Sent, Setting, _real
from emu.emulator.physics import forms as physics
from emu.emulator.physics.topology import topology_ina_us
from emu.emulator.protocol.sparse_ina import packet_union, stream_bytes, streams_sparse
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Sparsity

# -- the switch ------------------------------------------------------------------------------------

class Stream(Mechanism):
    """In-network aggregation: the self-clocking stream of emu.emulator.protocol.ina through the switch (and,
    on hierarchical INA, its leaves)."""

    name = "switch"
    kinds = STREAM_KINDS
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


