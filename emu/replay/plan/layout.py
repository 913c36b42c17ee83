"""A sharded or split job at a new layout: which rank's program each worker runs, and on which
workers each collective's group lies (docs/parallelism.md).

A trace with a mesh (``meta.mesh``, e.g. dp=2 x tp=2) replays at a mesh of the same dimensions in
the same order (``--mesh dp=64,tp=2``), where only the data-parallel dimensions (roles dp and
fsdp) may change size: the others (tensor, pipeline, expert parallel) are the model's split and
stay. Worker ``w`` has the coordinates of ``w`` in the replay's mesh (row-major, as the trace's);
it runs the program of the trace's rank whose coordinates are its own, each scaled dimension's
taken modulo that dimension's size in the trace (data-parallel replicas are alike). A collective
on a group that is the slice of the trace's mesh along some dimensions runs on the slice of the
replay's mesh along the same dimensions through the worker: a tensor-parallel pair stays a pair,
a data-parallel group of 2 becomes one of 64. A point-to-point peer, and a broadcast's root, keep
their offset from the rank in every dimension (modulo the replay's sizes).

Counts stay the trace's (weak scaling: each replica keeps its batch, each shard group gathers the
same parameters): an all_gather's or reduce_scatter's full tensor on a group that grew is padded
to a multiple of the group, as FSDP pads its shards, and the report says by how much.

A mixture of experts (``emu.replay.plan.experts``, docs/moe.md) grows its expert-parallel dimension
too, where the trace records its experts (``meta.experts``), and a pure expert-parallel trace
(``ep=4``) takes a data-parallel dimension it lacks (``--mesh dp=8,ep=8``): the trace is one replica
of it (size 1 there). Its all_to_alls stay within ep (they exchange tokens between the ranks that
split the model); its other whole-job collectives (the replicated parameters' gradients) span the
added dimension too, and each rank's expert gradients are all-reduced over it.

A trace without a mesh whose collectives all span the job replays at any size as before
(``None`` here); one with sub-groups and no mesh replays at its own size only, each group as it is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property

from emu.errors import ConfigError
from emu.replay.plan.experts import ExpertLayout, ep_problem, with_expert_gradients
from emu.traces.mesh import Mesh, MeshDim
from emu.traces.model import Coll, CollKind, GroupRole, Trace

SCALABLE = (GroupRole.DP, GroupRole.FSDP)  # data-parallel replicas and shard groups
_P2P = (CollKind.SEND, CollKind.RECV)
# a group that grew pads these to whole shards (an all_to_all: a piece each member; its uneven
# ones are resized by the experts' rule instead)
_PADDED = (CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER, CollKind.ALL_TO_ALL)


def parse_mesh(text: str) -> Mesh:
    """``dp=64,tp=2`` (``--mesh``): dimensions outermost first."""
    dims = []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        try:
            value = int(size)
        except ValueError:
            value = 0
        if not sep or not name.strip() or value < 1:
            raise ConfigError(f"--mesh {text!r}: give the mesh as NAME=SIZE pairs, outermost first, e.g. "
                              "--mesh dp=64,tp=2 (the trace's dimensions, in its order)")
        dims.append(MeshDim(name.strip(), value))
    mesh = Mesh(tuple(dims))
    problem = mesh.problem(mesh.size)
    if problem:
        raise ConfigError(f"--mesh {text!r} {problem}")
    return mesh


@dataclass(frozen=True)
class GroupKey:
    """One group of workers: a slice of the replay's mesh (``dims``, through the workers whose
    other coordinates are ``anchor``), the whole job, or a point-to-point channel (``anchor`` is
    (sender, receiver)): the k-th collective of a key on one member meets the k-th on every other."""

    kind: str  # "job", "slice" or "p2p"
    dims: tuple[int, ...] = ()
    anchor: tuple[int, ...] = ()


JOB = GroupKey("job")


@dataclass
class MeshPlan:
    """The trace's mesh and the replay's, and the mapping between their ranks."""

    trace_mesh: Mesh | None  # None: a trace of sub-groups without a mesh, replayed at its own size
    mesh: Mesh | None
    workers: int
    path: str
    added: tuple[int, ...] = ()  # the data-parallel dimensions the replay adds (size 1 in trace_mesh)
    experts: ExpertLayout | None = None  # where the expert-parallel dimension or the replicas grow
    trace: Trace | None = None  # the programs' trace: the file's, with expert gradients where dims are added
    _members: dict[GroupKey, tuple[int, ...]] = field(default_factory=dict)

    @property
    def regroups(self) -> bool:
        """Whether the whole trace's collectives land on groups of several kinds (an added dimension)."""
        return bool(self.added)

    @property
    def identity(self) -> bool:
        return self.trace_mesh is None or self.trace_mesh == self.mesh

    @cached_property
    def scaled(self) -> tuple[int, ...]:
        """The dimensions whose size changed."""
        if self.trace_mesh is None or self.mesh is None:
            return ()
        return tuple(i for i, (a, b) in enumerate(zip(self.trace_mesh.dims, self.mesh.dims, strict=True))
                     if a.size != b.size)

    def rank_of(self, w: int) -> int:
        """The trace's rank whose program worker ``w`` runs."""
        if self.identity:
            return w
        assert self.trace_mesh is not None and self.mesh is not None
        coords = self.mesh.coords(w)
        return self.trace_mesh.rank([c % d.size for c, d in zip(coords, self.trace_mesh.dims, strict=True)])

    def _shift(self, rank: int, other: int, w: int) -> int:
        """The worker that stands to ``w`` as trace rank ``other`` stands to ``rank``."""
        if self.identity:
            return other
        assert self.trace_mesh is not None and self.mesh is not None
        a, b, c = self.trace_mesh.coords(rank), self.trace_mesh.coords(other), self.mesh.coords(w)
        return self.mesh.rank([(cw + (y - x)) % d.size for x, y, cw, d in zip(a, b, c, self.mesh.dims, strict=True)])

    def _root(self, root: int, key: GroupKey, w: int) -> int:
        """A broadcast's root among the workers of its group: the trace root's coordinates along the
        dimensions the group spans (every member names the same worker), the group's elsewhere."""
        if self.identity or key.kind == "job" and self.trace_mesh is None:
            return root
        assert self.trace_mesh is not None and self.mesh is not None
        at = self.trace_mesh.coords(root)
        spanned = range(len(self.mesh.dims)) if key.kind == "job" else key.dims
        mine = list(self.mesh.coords(w))
        for d in spanned:
            mine[d] = at[d]  # a root inside the trace's sizes: the same place in the grown group
        return self.mesh.rank(mine)

    def key(self, op: Coll, rank: int, w: int) -> GroupKey:
        """The group of workers that ``w``'s copy of trace rank ``rank``'s ``op`` runs on."""
        if op.kind in _P2P:
            assert op.peer is not None
            peer = self._shift(rank, op.peer, w)
            return GroupKey("p2p", anchor=(w, peer) if op.kind == CollKind.SEND else (peer, w))
        if self.trace_mesh is None:  # sub-groups kept as they are, at the trace's size
            group = op.group if op.group is not None else tuple(range(self.workers))
            return JOB if len(group) == self.workers else GroupKey("slice", anchor=tuple(sorted(group)))
        every = tuple(range(len(self.trace_mesh.dims)))
        if op.group is None or len(op.group) == self.trace_mesh.size:  # the whole job, whatever its dimensions
            dims: tuple[int, ...] | None = every
        else:
            dims = self.trace_mesh.spans(tuple(sorted(op.group)))
            if dims is None:
                raise ConfigError(f"{self.path}: rank {rank} issues a {op.kind.value} on the group "
                                  f"{list(op.group)[:16]}, which is not a slice of the trace's mesh "
                                  f"{self.trace_mesh.text()}: emu cannot say which workers it spans at another "
                                  "layout; replay at the trace's own mesh")
            if not dims and op.group_role is not None:  # a rank alone: the added dimension of its role, if any
                dims = tuple(i for i in self.added if self.trace_mesh.dims[i].role == op.group_role)
        if op.kind == CollKind.ALL_TO_ALL:  # tokens between the ranks that split the model, not replicas
            dims = tuple(d for d in dims if d not in self.added)
        if dims == every:
            return JOB
        assert self.mesh is not None
        anchor = tuple(0 if d in dims else c for d, c in enumerate(self.mesh.coords(w)))
        return GroupKey("slice", dims=dims, anchor=anchor)

    def members(self, key: GroupKey) -> tuple[int, ...] | None:
        """A key's workers, ascending (None: the whole job)."""
        if key.kind == "job":
            return None
        found = self._members.get(key)
        if found is None:
            if key.kind == "p2p":
                found = tuple(sorted(set(key.anchor)))
            elif self.trace_mesh is None:
                found = key.anchor
            else:
                assert self.mesh is not None
                ranges = [range(d.size) if i in key.dims else (c,) for i, (d, c) in
                          enumerate(zip(self.mesh.dims, key.anchor, strict=True))]
                found = tuple(sorted(self.mesh.rank(list(c)) for c in itertools.product(*ranges)))
            self._members[key] = found
        return found

    def scale_op(self, op: Coll, rank: int, w: int) -> tuple[Coll, GroupKey]:
        """``w``'s copy of the op: its group of workers, its size, its peer and root among them."""
        key = self.key(op, rank, w)
        members = self.members(key)
        size = self.workers if members is None else len(members)
        if op.kind in _P2P:
            peer = key.anchor[1] if op.kind == CollKind.SEND else key.anchor[0]
            return replace(op, group=None, group_size=size, peer=peer), key
        root = None if op.root is None else self._root(op.root, key, w)
        count = op.count
        if op.kind in _PADDED and op.splits is None and count % size:
            count += size - count % size  # padded to whole shards, as FSDP pads its parameters
        role = None if key.kind == "job" and self.added else op.group_role  # the dense gradients: the job's
        return replace(op, group=members, group_size=size, root=root, count=count, group_role=role,
                       bytes=count * op.dtype.itemsize), key


def has_subgroups(trace: Trace) -> bool:
    """Whether any collective of the trace runs on a group smaller than the job (a send or recv:
    its pair, where the trace names the group it was issued on)."""
    n = trace.meta.world_size
    return any(op.group is not None and len(op.group) < n for r in trace.ranks for it in r.iterations for op in it.colls)


def plan_mesh(trace: Trace, workers: int, mesh: Mesh | None, path: str, imbalance: float | None = None,
              seed: int = 0) -> MeshPlan | None:
    """The layout a replay runs at; None for a trace whose collectives all span the job and that
    asks for no mesh (replayed at any size, as every trace before meshes). ``imbalance``: a mixture of
    experts' routing at a new size (--moe-imbalance; None: the trace's measured one), drawn with
    ``seed`` (``emu.replay.plan.experts``)."""
    n = trace.meta.world_size
    subgroups = has_subgroups(trace)
    trace_mesh = trace.meta.mesh
    if trace_mesh is None:
        if mesh is not None:
            raise ConfigError(f"--mesh {mesh.text()}: {path} records no mesh (meta.mesh), so emu cannot tell which "
                              "dimension each group is; capture it with emu capture (which records the device mesh) "
                              "or replay it without --mesh")
        if not subgroups:
            return None
        if workers != n:
            raise ConfigError(f"{path}: the trace has sub-groups and no mesh (meta.mesh), so it replays at its own "
                              f"size only: use --workers {n}")
        plan = MeshPlan(None, None, workers, path)
    else:
        target = mesh or _default_mesh(trace_mesh, workers, path)
        trace_mesh, added = _extended(trace_mesh, target)
        experts = None
        for a, b in zip(trace_mesh.dims, target.dims, strict=True):
            if a.size != b.size and a.role == GroupRole.EP:
                problem = ep_problem(trace, a.size, b.size)
                if problem:
                    raise ConfigError(f"--mesh {target.text()}: {path}: {problem}")
                experts = ExpertLayout(trace, a.size, b.size, imbalance, seed)
            elif a.size != b.size and a.role not in SCALABLE:
                raise ConfigError(f"--mesh {target.text()}: dimension {a.name} ({a.role.value}) splits the model and "
                                  f"keeps its size {a.size}; only data-parallel dimensions (dp, fsdp) and a mixture "
                                  "of experts' ep scale")
        if target.size != workers:
            raise ConfigError(f"--mesh {target.text()} is {target.size} workers but --workers is {workers}: give one, "
                              "or the same count")
        if experts is None and target.sizes != trace_mesh.sizes and _uneven(trace):  # replicas of ep groups
            ep_dim = next((d for d in trace_mesh.dims if d.role == GroupRole.EP), None)
            if ep_dim is not None:
                experts = ExpertLayout(trace, ep_dim.size, ep_dim.size, imbalance, seed)
        program_trace = trace
        if added:
            if trace.meta.experts is None:
                raise ConfigError(f"--mesh {target.text()}: {path} records no meta.experts, and replicas added to "
                                  "a mixture of experts all-reduce their expert gradients, whose size it gives; "
                                  'add "experts": {"count": X, "params_per_expert": P} to the trace\'s meta '
                                  "(emu capture --model moe records it)")
            ep = next(d for d in trace_mesh.dims if d.role == GroupRole.EP)
            size = target.dims[trace_mesh.names.index(ep.name)].size
            if experts is None:
                experts = ExpertLayout(trace, ep.size, size, imbalance, seed)
            program_trace = with_expert_gradients(trace, size)
        plan = MeshPlan(trace_mesh, target, workers, path, added, experts, program_trace)
    held = {p.rank for p in trace.ranks}
    missing = sorted({plan.rank_of(w) for w in range(workers)} - held)
    if missing:
        raise ConfigError(f"{path}: the file holds the programs of ranks {sorted(held)[:16]}, but the layout needs "
                          f"rank {missing[0]}'s (each worker runs the rank at its place in the mesh); give a trace "
                          "of every rank")
    return plan


def _uneven(trace: Trace) -> bool:
    return any(op.splits is not None for r in trace.ranks for it in r.iterations for op in it.colls)


def _extended(trace_mesh: Mesh, target: Mesh) -> tuple[Mesh, tuple[int, ...]]:
    """The trace's mesh with the data-parallel dimensions the replay adds (size 1: the trace is one
    replica), and where they are in the replay's; only a pure expert-parallel trace takes them."""
    if target.names == trace_mesh.names:
        return trace_mesh, ()
    added = tuple(i for i, d in enumerate(target.dims) if d.name not in trace_mesh.names and d.size > 1)
    new = [i for i, d in enumerate(target.dims) if d.name not in trace_mesh.names]
    kept = tuple(n for n in target.names if n in trace_mesh.names)
    pure_ep = all(d.role == GroupRole.EP for d in trace_mesh.dims)
    if kept != trace_mesh.names or not pure_ep or any(target.dims[i].role != GroupRole.DP for i in new):
        raise ConfigError(f"--mesh {target.text()}: the trace's mesh is {trace_mesh.text()}; give its dimensions, "
                          "in its order, with new sizes for the data-parallel ones"
                          + (" (a pure expert-parallel trace also takes a dp dimension it lacks, e.g. "
                             f"--mesh dp=8,{trace_mesh.text()})" if pure_ep else ""))
    return Mesh(tuple(MeshDim(d.name, 1) if i in new else trace_mesh.dims[trace_mesh.index(d.name)]
                      for i, d in enumerate(target.dims))), added  # a dimension of 1 added is the trace's own


def _default_mesh(trace_mesh: Mesh, workers: int, path: str) -> Mesh:
    """The trace's mesh at ``workers``: its one data-parallel dimension grown (or shrunk) to fit."""
    if workers == trace_mesh.size:
        return trace_mesh
    scalable = [i for i, d in enumerate(trace_mesh.dims) if d.role in SCALABLE]
    rest = trace_mesh.size // trace_mesh.dims[scalable[0]].size if len(scalable) == 1 else 0
    if not scalable and all(d.role == GroupRole.EP for d in trace_mesh.dims):
        raise ConfigError(f"--workers {workers}: {path}'s mesh is {trace_mesh.text()} (pure expert parallel); lay "
                          f"it out with --mesh dp=D,{trace_mesh.text()} (replicas) or a larger ep (docs/moe.md), "
                          f"e.g. --mesh dp={max(1, workers // trace_mesh.size)},{trace_mesh.text()}")
    if len(scalable) != 1 or workers % rest:
        how = (f"a multiple of {rest}" if len(scalable) == 1 else
               "--mesh to say which data-parallel dimension grows" if scalable else "its own size")
        raise ConfigError(f"--workers {workers}: {path}'s mesh is {trace_mesh.text()}; give {how}"
                          + (f" (e.g. --mesh {_example(trace_mesh)})" if scalable else ""))
    i = scalable[0]
    dims = list(trace_mesh.dims)
    dims[i] = MeshDim(dims[i].name, workers // rest)
    return Mesh(tuple(dims))


def _example(mesh: Mesh) -> str:
    return ",".join(f"{d.name}={d.size * 8 if d.role in SCALABLE else d.size}" for d in mesh.dims)
