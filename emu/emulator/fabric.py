"""Fabrics: what a replay's network is, by name, and what each one decides.

A ``Fabric`` owns the choices that differ between networks: the mechanisms that run its
collectives, in order of preference (``emu.emulator.mechanisms``: the in-network aggregation
stream, a ring, a parameter server, ...), whether the software switch sums or only forwards,
whether the fabric can join the synchronized clock, what it needs from the machine, and any
switch outside emu that it starts and talks to. Replay asks its fabric and never compares names.

The registry maps names to classes. The software fabrics register here; other packages
add theirs through the ``emu.fabrics`` entry point group (``emu.p4`` adds ``bmv2``), loaded
the first time a name is not found, so this package imports none of them. The contract for
such a plugin is in docs/design.md ("Fabrics").
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from importlib import metadata
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from emu.emulator import mechanisms as mech
from emu.emulator.mechanisms import Mechanism
from emu.emulator.protocol.switch import AggregationSwitch, Results
from emu.errors import ConfigError

if TYPE_CHECKING:
    from emu.emulator.mechanisms import Setting
    from emu.traces.model import Coll


class Pool(Protocol):
    """One pool of the switch as the switch process drives it: ``AggregationSwitch``'s interface
    (emu's software switch, or a bridge to a switch outside emu that aggregates for it)."""

    stats: object  # with as_dict() -> dict[str, int]

    def process(self, headers: np.ndarray, payload: np.ndarray, stamps: np.ndarray | None = None,
                sparse: np.ndarray | None = None) -> Results: ...


class Fabric:
    """A network design a replay runs on. Subclasses set the class attributes."""

    name: ClassVar[str]
    description: ClassVar[str]
    # the mechanisms that run its collectives, in order of preference: each collective takes the
    # first that takes it (emu.emulator.mechanisms.choose)
    mechanisms: ClassVar[tuple[Mechanism, ...]]
    sums_in_switch_process: ClassVar[bool] = False  # the switch process aggregates (else it forwards)
    # what the switch's data plane runs besides a whole job's float all_reduces: a pool for each
    # sub-group that aggregates (emu.replay.host.pools), and reduce_scatter and all_gather rounds
    group_pools: ClassVar[bool] = False
    scatter_gather: ClassVar[bool] = False
    topologies: ClassVar[bool] = True  # runs on a topology of nodes, NICs and leaves (docs/topology.md)
    # the switch runs the sparse stream (emu.emulator.protocol.sparse_ina): a sparse all_reduce sends only the
    # blocks some worker holds; a switch without it (the P4 program) aggregates every block
    sparse_stream: ClassVar[bool] = False
    synchronizable: ClassVar[bool] = True  # can take part in the synchronized clock
    # what a real point-to-point all_reduce holds at its peak, per worker and per (worker, shard)
    # pair (a parameter server's pushes all wait at once); None: the fabric has no such limit
    p2p_bytes_per_worker: ClassVar[float | None] = None
    p2p_bytes_per_pair: ClassVar[float] = 0.0

    def check(self, workers: int, elements: int) -> None:
        """Refuse, with ConfigError, a configuration this fabric cannot run."""

    def p2p_peak_bytes(self, workers: int, shards: int) -> float:
        """The memory a real point-to-point all_reduce of ``workers`` needs at its peak (measured: the
        comment above ``P2P_RING_BYTES_PER_WORKER``), 0 where the fabric has none."""
        if self.p2p_bytes_per_worker is None:
            return 0.0
        return self.p2p_bytes_per_worker * workers + self.p2p_bytes_per_pair * workers * shards

    def beyond_p2p_limit(self, workers: int, shards: int) -> bool:
        """Whether a real point-to-point all_reduce of ``workers`` needs more memory than this
        machine has free (the analytic estimate stands in for it: ``p2p_peak_bytes`` over
        ``P2P_MEMORY_SHARE`` of ``available_memory_bytes``)."""
        need = self.p2p_peak_bytes(workers, shards)
        return need > 0 and need > P2P_MEMORY_SHARE * available_memory_bytes()

    def check_available(self) -> None:
        """Refuse, with an EmuError naming what to install, when the machine lacks what it needs."""

    def external_switch(self, workers: int, slots: int) -> contextlib.AbstractContextManager[object]:
        """A switch outside emu, running for the replay's lifetime (none for the software fabrics)."""
        return contextlib.nullcontext()

    def pool(self, slots: int, workers: int, elements: int, job: int) -> Pool:
        """Called where the switch runs (its process, or the one process of the replay): one pool of
        ``slots`` for ``workers``; emu's software switch unless the fabric's switch is outside emu."""
        return AggregationSwitch(slots, workers, elements, job=job)

    def check_collectives(self, ops: Iterable[Coll], s: Setting) -> None:
        """Refuse, with ConfigError, collectives of a replay this fabric cannot run as the design says
        (before any process starts)."""

    @property
    def external(self) -> bool:
        """Whether its switch runs outside emu (``external_switch``): one switch, one machine, one job."""
        return type(self).external_switch is not Fabric.external_switch

    @property
    def aggregates(self) -> bool:
        """Whether a switch sums collectives (a mechanism of the aggregation stream)."""
        return any(m.stream for m in self.mechanisms)

    @property
    def parameter_server(self) -> bool:
        """Whether its collectives need parameter-server shards (endpoints of their own)."""
        return any(m.servers for m in self.mechanisms)

    @property
    def hierarchical(self) -> bool:
        """Whether it has a variant for topology.algorithm = "hierarchical" (topologies run on the
        fabrics that join the synchronized clock)."""
        return self.synchronizable and any(m.hierarchical for m in self.mechanisms)


class InaFabric(Fabric):
    name = "ina"
    description = "in-network aggregation in emu's software switch (SwitchML-style)"
    mechanisms = (mech.STREAM, mech.RING, *mech.COMMON)
    sums_in_switch_process = True
    sparse_stream = True
    group_pools = True
    scatter_gather = True


# A real ring or parameter server sends 2 M (M-1) segments per collective, a window's at once
# (docs/design-notes.md, "Hand-offs in batches"): what limits them is memory. Measured peak resident
# memory of one mlp iteration (2026-12-04, /usr/bin/time -v): the ring 113 MB at 4,096 workers
# in one process and 173 MB at 8,192 in two (segments in flight grow as M); the parameter server
# 4.1 GB at 4,096 workers and as many shards (every worker's push to every shard waits at once:
# about 240 B a pair). Each figure is rounded up, and a replay may take half the memory free when
# it starts.
P2P_RING_BYTES_PER_WORKER = 32e3
P2P_PS_BYTES_PER_PAIR = 256.0
P2P_MEMORY_SHARE = 0.5


def available_memory_bytes() -> float:
    """Memory free for a new replay: Linux's MemAvailable, else the physical memory (sysconf)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


class RingFabric(Fabric):
    name = "ring"
    description = "ring all-reduce between the workers, the switch forwarding"
    mechanisms = (mech.SPARSE_RING, mech.HIERARCHICAL_RING, mech.RING, *mech.COMMON)
    p2p_bytes_per_worker = P2P_RING_BYTES_PER_WORKER


class ParameterServerFabric(Fabric):
    name = "ps"
    description = "parameter-server shards that sum what the workers push"
    mechanisms = (mech.SPARSE_PARAMETER_SERVER, mech.PARAMETER_SERVER, mech.RING, *mech.COMMON)
    p2p_bytes_per_worker = P2P_RING_BYTES_PER_WORKER
    p2p_bytes_per_pair = P2P_PS_BYTES_PER_PAIR


_REGISTRY: dict[str, type[Fabric]] = {}
_BROKEN: dict[str, str] = {}  # plugins that failed to load, with why
_PLUGINS_LOADED = False


def register(cls: type[Fabric]) -> type[Fabric]:
    """Add a fabric class under its name (usable as a decorator). Registering the same class again
    does nothing; another class under a taken name is refused (ConfigError)."""
    have = _REGISTRY.get(cls.name)
    if have is not None and have is not cls:
        raise ConfigError(f"fabric {cls.name!r} is registered already ({have.__module__}.{have.__qualname__}); "
                          f"{cls.__module__}.{cls.__qualname__} needs a name of its own")
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (InaFabric, RingFabric, ParameterServerFabric):
    register(_cls)


def _load_plugins() -> None:
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in metadata.entry_points(group="emu.fabrics"):
        if ep.name in _REGISTRY:
            continue
        try:
            register(ep.load())
        except Exception as exc:  # a broken plugin must not take the software fabrics down
            _BROKEN[ep.name] = f"{type(exc).__name__}: {exc}"


def names() -> tuple[str, ...]:
    """Every fabric's name: emu's own (software) first, then those whose switch runs outside emu, each
    group in the order they registered (the built-in ones, then those of installed packages)."""
    _load_plugins()
    return tuple(sorted(_REGISTRY, key=lambda n: _REGISTRY[n]().external))


def get(name: str) -> Fabric:
    """The fabric called ``name``."""
    cls = _REGISTRY.get(name)
    if cls is None:
        _load_plugins()
        cls = _REGISTRY.get(name)
    if cls is None:
        if name in _BROKEN:
            raise ConfigError(f"--fabric {name!r} failed to load ({_BROKEN[name]}); reinstall emu")
        raise ConfigError(f"--fabric {name!r} is not one of: {', '.join(names())}")
    return cls()


def listing(software: bool | None = None) -> str:
    """The fabrics' names for a sentence ("ina, ring, ps, tree or bmv2"); ``software``: only emu's own
    (True) or only those whose switch runs outside emu (False)."""
    chosen = [n for n in names() if software is None or _REGISTRY[n]().external != software]
    return chosen[0] if len(chosen) == 1 else ", ".join(chosen[:-1]) + " or " + chosen[-1]
