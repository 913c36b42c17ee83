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

from emu.emulator.mechanisms.base import Mechanism, Sent, Setting, Start
from emu.emulator.mechanisms.p2p import (
    BinomialTree,
    Direct,
    Dissemination,
    HierarchicalRing,
    ParameterServerAlgorithm,
    RingAlgorithm,
    SendReceive,
    SparseParameterServer,
    SparseRingAlgorithm,
)
from emu.emulator.mechanisms.stream import Stream
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Dtype, Sparsity

__all__ = ["Mechanism", "Sent", "Setting", "Start", "choose", "collective_us", "named", "names", "register", "time_us"]

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

