"""Which process group each collective of an import ran on, its role in the job's mesh, its stream.

NCCL's ``record_param_comms`` names the group of every collective. gloo's events do not: a launch
(``c10d::allreduce_``) says neither its group nor, for send and recv, whose rank its peer number
is. emu's captures record it (``emu.capture.commlog``): ``rank<R>.comms.json`` beside the Kineto
file holds PyTorch's flight-recorder entries (each collective's group and the wall-clock time it
was issued, which falls inside its launch event) and emu's own notes of the point-to-point calls
(group, global peer, whether the call blocked). This module reads that record and attributes each
launch to its entry by time; a trace with sub-groups and no record is refused by name, never read
as if every collective spanned the job.

The job's mesh comes from the device meshes the script built (in the record), or else from the
groups' descriptions (DeviceMesh names its groups ``mesh_<dim>``) and their ranks. A group's role
is its mesh dimension's; every group of a rank that uses more than one gets a stream of its own,
as gloo runs each group on threads of its own and NCCL each communicator on a stream of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emu.errors import KinetoError
from emu.traces.mesh import ALIASES, Mesh, MeshDim
from emu.traces.model import CollKind, GroupRole

MAX_COMMS_BYTES = 256 << 20
# A launch's flight-recorder entry is made inside the launch; the wall clock and the profiler's
# clock agree to a few microseconds (measured here: the entry sits inside its launch's span).
SLACK_NS = 50_000


@dataclass(frozen=True)
class GroupInfo:
    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Issued:
    """A collective the flight recorder saw issued: its group, when (wall clock, ns) and what
    (its profiling name, ``gloo:all_reduce``)."""

    group: str
    created_ns: int
    kind: str = ""


@dataclass(frozen=True)
class P2PCall:
    """A send or recv the rank's wrapper noted: its group, global peer, size and span (ns)."""

    kind: CollKind
    blocking: bool
    group: str
    peer: int | None
    count: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class CommsRecord:
    """``rank<R>.comms.json`` (``emu.capture.commlog``)."""

    path: str
    meshes: tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]  # (names, nested ranks)
    groups: tuple[GroupInfo, ...]
    issued: tuple[Issued, ...]
    p2p: tuple[P2PCall, ...]
    error: str | None


def comms_path(kineto: Path) -> Path:
    """The record beside a Kineto file ``rank<R>.json`` (or ``.json.gz``)."""
    name = kineto.name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return kineto.with_name(f"{name}.comms.json")


def _bad(path: Path, what: str) -> KinetoError:
    return KinetoError(f"{path}: {what}; the file is not the record emu capture wrote (or it is "
                       "corrupted): capture the run again, or remove the file to import without it")


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def read_comms(path: Path) -> CommsRecord | None:
    """The record at ``path``, or None where there is none."""
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_COMMS_BYTES:
        raise _bad(path, f"it is {path.stat().st_size} bytes, more than {MAX_COMMS_BYTES}")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _bad(path, f"it cannot be read as JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise _bad(path, "field 'version' is not 1")
    try:
        groups = tuple(GroupInfo(str(g["name"]), str(g.get("desc", "")), tuple(g["ranks"]))
                       for g in doc.get("groups", []) if _ints(g.get("ranks")))
        issued = tuple(Issued(str(e["group"]), int(e["created_ns"]), str(e.get("kind", "")))
                       for e in doc.get("collectives", []) if not e.get("p2p"))  # sends and recvs: emu's own notes
        p2p = tuple(P2PCall(CollKind.SEND if e["kind"] == "send" else CollKind.RECV, bool(e["blocking"]),
                            str(e["group"]), None if e.get("peer") is None else int(e["peer"]), int(e["count"]),
                            int(e["start_ns"]), int(e["end_ns"])) for e in doc.get("p2p", []))
        meshes = tuple((tuple(m["names"]), tuple(m["ranks"])) for m in doc.get("meshes", [])
                       if m.get("names") and isinstance(m.get("ranks"), list))
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, f"an entry lacks a field or has a wrong one ({type(exc).__name__}: {exc})") from None
    error = doc.get("error")
    return CommsRecord(str(path), meshes, groups, issued, p2p, str(error) if error else None)


# -- the mesh -----------------------------------------------------------------------------------

def _flatten(nested: Any) -> list[int]:
    if isinstance(nested, list | tuple):
        return [r for item in nested for r in _flatten(item)]
    return [nested]


def _shape(nested: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list | tuple):
        shape.append(len(nested))
        nested = nested[0] if nested else None
    return tuple(shape)


def recorded_mesh(record: CommsRecord, world: int) -> Mesh | None:
    """The device mesh over the whole job the script built (the one of most dimensions), where its
    ranks are laid out row-major as emu's meshes are."""
    best = None
    for names, ranks in record.meshes:
        shape = _shape(list(ranks))
        if len(shape) != len(names) or _flatten(list(ranks)) != list(range(world)):
            continue
        if best is None or len(names) > len(best.dims):
            best = Mesh(tuple(MeshDim(str(n), s) for n, s in zip(names, shape, strict=True)))
    return best if best is not None and best.problem(world) is None else None


def described_mesh(groups: Sequence[GroupInfo], world: int) -> Mesh | None:
    """The mesh the groups' descriptions imply: DeviceMesh names a dimension's groups
    ``mesh_<dim>``; the stride between a group's ranks orders the dimensions."""
    dims: dict[str, tuple[int, int]] = {}
    for g in groups:
        if not g.desc.startswith("mesh_") or len(g.ranks) < 2:
            continue
        name = g.desc[len("mesh_"):]
        ranks = sorted(g.ranks)
        stride = ranks[1] - ranks[0]
        if any(b - a != stride for a, b in zip(ranks, ranks[1:], strict=False)):
            return None  # not one dimension of a row-major mesh
        dims.setdefault(name, (len(ranks), stride))
    if not dims:
        return None
    order = sorted(dims.items(), key=lambda kv: -kv[1][1])
    expected = 1
    for _, (size, stride) in reversed(order):
        if stride != expected:
            return None
        expected *= size
    mesh = Mesh(tuple(MeshDim(name, size) for name, (size, _) in order))
    return mesh if mesh.problem(world) is None else None


def role_of(info: GroupInfo | None, ranks: tuple[int, ...], world: int, mesh: Mesh | None) -> GroupRole | None:
    """A group's role: its mesh dimension's (by its description, else by its ranks), None where
    the job has no mesh and the group is not one of a DeviceMesh."""
    if info is not None and info.desc.startswith("mesh_"):
        name = info.desc[len("mesh_"):]
        if mesh is not None and name in mesh.names:
            return mesh.dims[mesh.index(name)].role
        return ALIASES.get(name, GroupRole.OTHER)
    if mesh is None:
        return None
    return mesh.role_of(tuple(sorted(ranks)) if ranks else tuple(range(world)))


# -- attributing gloo launches -----------------------------------------------------------------

@dataclass(frozen=True)
class Attribution:
    group: str
    ranks: tuple[int, ...]
    peer: int | None = None  # global (send, recv)
    blocking: bool | None = None  # the call waited for its completion (send, recv)


# how the flight recorder names what a launch of each kind executes (gloo runs a reduce_scatter
# as an all_reduce of its input), underscores dropped
_RECORDED_AS: dict[CollKind, tuple[str, ...]] = {
    CollKind.ALL_REDUCE: ("allreduce", "sparseallreduce"), CollKind.REDUCE_SCATTER: ("allreduce", "reducescatter"),
    CollKind.ALL_GATHER: ("allgather",), CollKind.BROADCAST: ("broadcast",), CollKind.ALL_TO_ALL: ("alltoall",),
    CollKind.BARRIER: ("barrier",),
}


class Attributor:
    """Hands each gloo launch of one rank its entry of the record, in time order."""

    def __init__(self, record: CommsRecord, groups: Mapping[str, GroupInfo], base_ns: int | None,
                 where: str, strict: bool = True) -> None:
        """``strict``: the job has sub-groups, and a launch without its entry is refused; else only
        point-to-point calls are looked up, and one without its note is left as the trace has it."""
        self.strict = strict
        if base_ns is None and not strict:
            self.base_ns = None
            return
        if base_ns is None:
            raise KinetoError(f"{where}: the Kineto file has no 'baseTimeNanoseconds', so its launches "
                              f"cannot be matched to the groups in {record.path}; record with PyTorch 2.1 or newer")
        if record.error is not None:
            raise KinetoError(f"{record.path}: the run's record of process groups is incomplete "
                              f"({record.error}), and the trace has sub-groups emu cannot tell apart "
                              "without it; capture with PyTorch 2.5 or newer")
        self.record, self.groups, self.base_ns = record, groups, base_ns
        self.issued_ns = [e.created_ns for e in record.issued]
        self.used_issued: set[int] = set()
        self.used_p2p: set[int] = set()

    def _group(self, name: str, where: str) -> GroupInfo:
        info = self.groups.get(name)
        if info is None:
            raise KinetoError(f"{where}: its process group {name!r} is in neither the trace's "
                              f"distributedInfo nor {self.record.path}")
        return info

    def launch(self, kind: CollKind, ts_us: float, end_us: float, where: str) -> Attribution | None:
        if self.base_ns is None or (not self.strict and kind not in (CollKind.SEND, CollKind.RECV)):
            return None
        start = self.base_ns + round(ts_us * 1000) - SLACK_NS
        end = self.base_ns + round(end_us * 1000) + SLACK_NS
        if kind in (CollKind.SEND, CollKind.RECV):
            for i, call in enumerate(self.record.p2p):
                if i not in self.used_p2p and call.kind == kind and call.start_ns <= end and call.end_ns >= start:
                    self.used_p2p.add(i)
                    info = self._group(call.group, where)
                    return Attribution(info.name, info.ranks, call.peer, call.blocking)
            if not self.strict:
                return None
            raise KinetoError(f"{where}: no {kind.value} call in {self.record.path} spans it, so its group and "
                              "peer are unknown; capture with emu capture (which notes every send and recv)")
        # the unused entry of a kind the launch can be, issued nearest its start (two threads may launch at once)
        at = self.base_ns + round(ts_us * 1000)
        names = _RECORDED_AS.get(kind, ())
        best = None
        for i, t in enumerate(self.issued_ns):
            if i in self.used_issued or not start <= t <= end:
                continue
            recorded = self.record.issued[i].kind.removeprefix("gloo:").replace("_", "")
            if recorded and names and recorded not in names:
                continue
            if best is None or abs(t - at) < abs(self.issued_ns[best] - at):
                best = i
        if best is None:
            raise KinetoError(f"{where}: no entry of {self.record.path} was issued during it, so its group is "
                              "unknown; the flight recorder may have run out of room: set TORCH_FR_BUFFER_SIZE "
                              "higher and capture again")
        self.used_issued.add(best)
        info = self._group(self.record.issued[best].group, where)
        return Attribution(info.name, info.ranks)


def stream_numbers(group_names: Sequence[str | None]) -> list[int | None]:
    """Per collective of one rank (in issue order), its stream: the rank's groups numbered by first
    use, where it uses more than one (else None: the rank's one stream, as a one-group trace)."""
    order: dict[str | None, int] = {}
    for name in group_names:
        order.setdefault(name, len(order))
    if len(order) < 2:
        return [None] * len(group_names)
    return [order[name] for name in group_names]
