"""What every mechanism is given and is: the setting it runs in, a worker's start, its bytes on
the wire, and the ``Mechanism`` base class (``emu.emulator.mechanisms``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from emu.emulator.algorithms.batched import BroadcastKernel, ClientKernel, RingKernel
from emu.emulator.algorithms.p2p import (
    Algorithm,
    Check,
    Chunks,
)
from emu.emulator.links import topology as shape
from emu.emulator.links.spec import LinkSpec
from emu.emulator.payload.generated import is_sparse
from emu.emulator.payload.recorded import RecordedPayload
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Sparsity

if TYPE_CHECKING:
    from emu.emulator.fabric import Fabric


# what the switch's stream sums (``Stream.kinds``): a point-to-point mechanism that runs one where
# the switch aggregates is a fallback (``Mechanism.fallback``)
STREAM_KINDS = frozenset({CollKind.ALL_REDUCE, CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER})


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
        return (not self.stream and op.kind in STREAM_KINDS and s.fabric.aggregates
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


