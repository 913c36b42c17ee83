"""A job's device mesh: the layout of its ranks over named parallel dimensions (``meta.mesh``).

A mesh is an ordered list of dimensions, outermost first, as ``torch.distributed.device_mesh``
lays them out: rank ``r`` has the coordinates of ``r`` unravelled row-major over the sizes, so the
last dimension varies fastest (``dp=2, tp=2``: ranks 0 and 1 are one tensor-parallel pair). Each
dimension's name says which kind of parallelism it is where it is one of ``GroupRole``'s (dp, fsdp,
tp, pp, ep); any other name is of role ``other``. A process group is a *slice* of the mesh when it
holds exactly the ranks that share every coordinate but those of some dimensions: the dimensions
it spans.

This module owns the arithmetic (coordinates, slices, which dimensions a group spans) and nothing
of reading or replaying; ``emu.traces.validate`` checks traces against it and the replay scales
it (``emu.replay.plan.layout``).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from emu.traces.model import GroupRole

MAX_DIMS = 8
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# Names that frameworks give dimensions, and the role each stands for (torchtitan's and
# Megatron's spellings besides emu's own): what a capture writes into meta.mesh.
ALIASES: dict[str, GroupRole] = {
    "dp": GroupRole.DP, "ddp": GroupRole.DP, "replicate": GroupRole.DP, "dp_replicate": GroupRole.DP,
    "fsdp": GroupRole.FSDP, "shard": GroupRole.FSDP, "dp_shard": GroupRole.FSDP,
    "tp": GroupRole.TP, "pp": GroupRole.PP, "ep": GroupRole.EP,
}


@dataclass(frozen=True)
class MeshDim:
    name: str
    size: int

    @property
    def role(self) -> GroupRole:
        return ALIASES.get(self.name, GroupRole.OTHER)


@dataclass(frozen=True)
class Mesh:
    """Named dimensions, outermost first."""

    dims: tuple[MeshDim, ...]

    @classmethod
    def of(cls, pairs: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> Mesh:
        return cls(tuple(MeshDim(n, s) for n, s in pairs))

    @property
    def size(self) -> int:
        return math.prod(d.size for d in self.dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    def text(self) -> str:
        """``dp=2,tp=2``: how the command line writes it (``--mesh``)."""
        return ",".join(f"{d.name}={d.size}" for d in self.dims)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def coords(self, rank: int) -> tuple[int, ...]:
        out = []
        for size in reversed(self.sizes):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def rank(self, coords: tuple[int, ...] | list[int]) -> int:
        r = 0
        for c, size in zip(coords, self.sizes, strict=True):
            r = r * size + c
        return r

    def slice(self, rank: int, dims: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks that share ``rank``'s coordinates but along ``dims`` (ascending)."""
        at = self.coords(rank)
        ranges = [range(size) if d in dims else (at[d],) for d, size in enumerate(self.sizes)]
        return tuple(sorted(self.rank(c) for c in itertools.product(*ranges)))

    def spans(self, group: tuple[int, ...]) -> tuple[int, ...] | None:
        """The dimensions along which ``group`` is a slice of the mesh, or None where it is none
        (its ranks differ in some dimension without holding every value of it)."""
        coords = [self.coords(r) for r in group]
        dims = tuple(d for d in range(len(self.dims)) if len({c[d] for c in coords}) > 1)
        return dims if self.slice(group[0], dims) == tuple(sorted(group)) else None

    def role_of(self, group: tuple[int, ...]) -> GroupRole:
        """The role of a group that is a slice along one dimension (that dimension's); ``other``
        for any other group."""
        dims = self.spans(group)
        if dims is None or len(dims) != 1:
            return GroupRole.OTHER
        return self.dims[dims[0]].role

    def problem(self, world: int) -> str | None:
        """What is wrong with this mesh for a job of ``world`` ranks, or None."""
        if not 1 <= len(self.dims) <= MAX_DIMS:
            return f"has {len(self.dims)} dimensions; a mesh has 1..{MAX_DIMS}"
        bad = next((d.name for d in self.dims if not NAME.match(d.name)), None)
        if bad is not None:
            return (f"names a dimension {bad[:40]!r}; names are lower-case identifiers of at most 32 "
                    "characters (dp, fsdp, tp, pp, ep, or another)")
        if len(set(self.names)) != len(self.names):
            return f"names a dimension twice ({self.text()})"
        if any(d.size < 1 for d in self.dims):
            return f"has a dimension of size below 1 ({self.text()})"
        if self.size != world:
            return f"is {self.text()}, {self.size} ranks, but the job has {world}: the sizes multiply to the world size"
        return None
