"""Chakra execution traces (one ``.et`` file per rank) into an emu trace (docs/trace-format.md,
"Chakra").

A file is a stream of messages, each a varint32 length then its bytes (gzipped or not): first a
GlobalMetadata, then Nodes. A rank's nodes form a graph by their ``data_deps``; emu's program is
one walk of it in dependency order (ties by node id, the order Chakra's converters give):

- a compute node run on the device (``is_cpu_op`` false or absent) is a ``Compute`` of its
  ``duration_micros``; host operators (``is_cpu_op`` true) nest the device work they launch and
  only order it (counted in ``meta.gaps``);
- a collective node (with ``comm_type``) is a ``Coll`` issued where the walk meets it, its
  ``duration_micros`` the observed time; a send or receive a ``Coll`` to its ``comm_dst`` or
  from its ``comm_src``; a node that depends on them (a compute or another collective), directly
  or through host operators, first waits for them (``Wait``), and every collective is waited for at
  the end;
- sizes: ``comm_size`` is bytes (Chakra's PyTorch converter sums the input tensors), so an
  all_gather's full count is the input's times the group; the dtype is the input's
  (``Tensor(float)`` in ``inputs.types``), else float32, said in ``meta.gaps``;
- process groups: a ``pg_name`` names a group of the METADATA node ``process_group:init``
  (its ranks; empty: every rank); without one, the group is every rank given;
- emu's own attributes (``emu.*``, written by ``emu export --chakra``) carry what Chakra has no
  field for, and are read first where present (``emu.traces.chakra.attrs``).

Chakra records no steps: each file is one iteration, whose measured time is the program's own
timeline from the nodes' durations (compute in order, each collective from its issue, on its
stream, for its observed time), said in ``meta.gaps``. What emu cannot represent (memory
nodes, reduce, gather, scatter) is counted in ``meta.gaps``, never dropped silently.
"""

from __future__ import annotations

import gzip
import heapq
import os
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from emu.errors import ConfigError, TraceError
from emu.traces.chakra import attrs as emu_attrs
from emu.traces.chakra.schema import VERSIONS, CommType, NodeType, messages
from emu.traces.model import DTYPE_SPELLINGS, CollKind, Dtype, RankProgram, Source, Trace, TraceMeta

MAX_MESSAGE_BYTES = 64 << 20
MAX_FILE_BYTES = 1 << 30  # after decompression (as emu's own traces)
MAX_NODES = 2_000_000
KINDS = {CommType.ALL_REDUCE: CollKind.ALL_REDUCE, CommType.ALL_GATHER: CollKind.ALL_GATHER,
         CommType.REDUCE_SCATTER: CollKind.REDUCE_SCATTER, CommType.BROADCAST: CollKind.BROADCAST,
         CommType.ALL_TO_ALL: CollKind.ALL_TO_ALL, CommType.BARRIER: CollKind.BARRIER}


@dataclass(frozen=True)
class EtFile:
    """One rank's execution trace as read: its GlobalMetadata's version and attributes, its nodes."""

    path: Path
    version: str
    attrs: dict[str, Any]
    nodes: tuple[Any, ...]  # Node messages, as in the file


def is_chakra(path: Path) -> bool:
    """Whether ``path`` is a Chakra ET, as ``emu inspect`` and ``emu replay`` ask before loading a
    file as emu's: named ``.et`` or ``.et.gz``; not if named ``.json`` or ``.json.gz``; otherwise
    if it opens with a GlobalMetadata of a version emu reads or a ``schema`` attribute (what
    Chakra's writers put there)."""
    if re.search(r"\.et(\.gz)?$", path.name):
        return path.is_file()
    if re.search(r"\.json(\.gz)?$", path.name):
        return False  # emu's and Kineto's own names: every load_trace asks, so no file is opened for them
    try:
        head = _read(path, 1 << 16)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return False
    length, used = _varint(head, 0)
    if used == 0 or used + length > len(head) or head[used:used + 1] not in (b"\x0a", b"\x12"):
        return False
    try:
        meta = messages()["GlobalMetadata"].FromString(head[used:used + length])
    except Exception:  # noqa: BLE001 (any parse failure: not a Chakra file; load_trace says what it is)
        return False
    return meta.version in VERSIONS[:-1] or any(a.name == "schema" for a in meta.attr)


def read_et(path: Path) -> EtFile:
    """Read and frame one file; raises TraceError naming the file and the message."""
    try:
        data = _read(path, MAX_FILE_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{path}: cannot read it as a Chakra execution trace ({exc})") from None
    except MemoryError:
        raise TraceError(f"{path}: too large to read into this machine's memory") from None
    if len(data) > MAX_FILE_BYTES:
        raise TraceError(f"{path}: over {MAX_FILE_BYTES >> 30} GiB once decompressed; emu reads smaller Chakra traces")
    chunks = list(_frames(path, memoryview(data)))
    if not chunks:
        raise TraceError(f"{path}: empty: a Chakra execution trace starts with its GlobalMetadata")
    if bytes(chunks[0][:1]) == b"\x08":  # field 1 as a varint: a node's id, where GlobalMetadata has its version
        raise TraceError(f"{path}: a Chakra schema from before 0.0.4 (2023: the file starts with a node, not "
                         f"GlobalMetadata); emu reads {', '.join(v for v in VERSIONS if v)} and the PyTorch "
                         "converter's traces: convert it again with a current Chakra")
    classes = messages()
    meta = _parse(path, classes["GlobalMetadata"], chunks[0], 0)
    if meta.version not in VERSIONS:
        raise TraceError(f"{path}: GlobalMetadata.version is {meta.version[:40]!r}, a Chakra schema emu does not read; "
                         f"emu reads {', '.join(v for v in VERSIONS if v)} (et_def.proto since 2023-10) and the "
                         "PyTorch converter's traces, which leave the version empty")
    nodes = tuple(_parse(path, classes["Node"], chunk, i) for i, chunk in enumerate(chunks[1:], 1))
    return EtFile(path=path, version=meta.version, attrs={a.name: attr_value(a) for a in meta.attr}, nodes=nodes)


def _read(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of the file, decompressed where it is gzipped."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    with (gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")) as fh:
        return fh.read(limit)


def _varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the bytes it took (0: none there, or cut short)."""
    value = shift = 0
    for used, byte in enumerate(data[at:at + 10], 1):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, used
        shift += 7
    return 0, 0


def _frames(path: Path, data: memoryview) -> Iterable[memoryview]:
    at = count = 0
    while at < len(data):
        length, used = _varint(data, at)
        if used == 0:
            raise TraceError(f"{path}: message {count}: its length is cut short or not a varint (byte {at})")
        if length > MAX_MESSAGE_BYTES or at + used + length > len(data):
            raise TraceError(f"{path}: message {count} at byte {at}: {length} bytes announced, "
                             f"{len(data) - at - used} left: the file is truncated or not a Chakra trace")
        count += 1
        if count > MAX_NODES:
            raise TraceError(f"{path}: over {MAX_NODES} nodes; emu reads smaller Chakra traces")
        yield data[at + used:at + used + length]
        at += used + length


def _parse(path: Path, cls: Any, chunk: bytes | memoryview, index: int) -> Any:
    from google.protobuf.message import DecodeError

    try:
        return cls.FromString(bytes(chunk))
    except (DecodeError, ValueError, RuntimeError) as exc:
        what = "GlobalMetadata" if index == 0 else "Node"
        raise TraceError(f"{path}: message {index} is not a Chakra {what} ({exc}); "
                         "the file is damaged or of another schema") from None


def attr_value(attr: Any) -> Any:
    """An AttributeProto's value as Python (a list for the *_list members; None if unset)."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    return list(value.values) if which.endswith("_list") else value


def expand(items: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, folders replaced by the .et files inside, each in rank order (the number
    before ``.et``, as Chakra names them: ``trace.3.et``, ``chakra.3.et``)."""
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = [p for p in path.iterdir() if p.is_file() and re.search(r"\.et(\.gz)?$", p.name)]
            if not found:
                raise TraceError(f"{path}: the folder holds no .et files; give the Chakra traces of the ranks")
            paths.extend(sorted(found, key=_rank_key))
        elif not path.exists():
            raise TraceError(f"{path}: no such file or folder")
        else:
            paths.append(path)
    return paths


def _rank_key(path: Path) -> tuple[int, str]:
    found = re.search(r"(\d+)\.et(\.gz)?$", path.name)
    return (int(found.group(1)) if found else -1, path.name)


def rank_of(path: Path, index: int) -> int:
    """The rank a file's name gives (``name.<rank>.et``), else its place among the files."""
    number, _ = _rank_key(path)
    return number if number >= 0 else index


def import_chakra(paths: Sequence[str | os.PathLike[str]], *, world_size: int | None = None,
                  model: str | None = None) -> Trace:
    """``emu capture --chakra``: an emu trace from Chakra execution traces, one file per rank;
    ``world_size``: the job's ranks, where the files do not say (``_world``)."""
    from emu.traces.chakra.program import Program

    found = expand(paths)
    if not found:
        raise ConfigError("--chakra: give the ranks' .et files, or a folder of them")
    files = [read_et(p) for p in found]
    ranks = [rank_of(f.path, i) for i, f in enumerate(files)]
    seen: dict[int, Path] = {}
    for f, rank in zip(files, ranks, strict=True):
        if rank in seen:
            raise TraceError(f"{f.path}: names rank {rank}, as {seen[rank].name} does; name the files <name>.<rank>.et")
        seen[rank] = f.path
    gaps: list[str] = []
    exported = _exported_meta(files)
    world = _world(files, ranks, world_size, exported, gaps)
    groups = _process_groups(files, world)
    programs = []
    for f, rank in sorted(zip(files, ranks, strict=True), key=lambda x: x[1]):
        program = Program(f, rank, world, groups)
        programs.append(RankProgram(rank=rank, iterations=program.iterations()))
        gaps.extend(g for g in program.gaps if g not in gaps)
    return _checked(files, tuple(programs), world, exported, gaps, model)


def _checked(files: list[EtFile], programs: tuple[RankProgram, ...], world: int, exported: TraceMeta | None,
             gaps: list[str], model: str | None) -> Trace:
    """The trace with its meta (emu's own where the files carry it, source aside), validated."""
    from emu.traces.noise import assess
    from emu.traces.validate import validate_trace

    first = files[0]
    if exported is not None:
        meta = replace(exported, source=Source.CHAKRA, model=model or exported.model,
                       gaps=exported.gaps + tuple(g for g in gaps if g not in exported.gaps))
        trace = Trace(meta=meta, ranks=programs)
    else:
        meta = TraceMeta(source=Source.CHAKRA, world_size=world, backend="unknown", device="unknown",
                         framework=f"Chakra ET {first.version or first.attrs.get('schema') or '(no version)'}"[:200],
                         dtype="float32", captured_at=str(first.attrs.get("time") or "")[:100], model=model,
                         command=f"emu capture --chakra {' '.join(f.path.name for f in files)}"[:1000],
                         gaps=tuple(gaps))
        trace = Trace(meta=meta, ranks=programs)
        trace = replace(trace, meta=replace(meta, noise=assess(trace)))
    try:
        validate_trace(trace, str(first.path))
    except TraceError as exc:
        raise TraceError(f"the imported Chakra trace is inconsistent: {exc}") from None
    return trace


def _exported_meta(files: list[EtFile]) -> TraceMeta | None:
    """The meta ``emu export`` wrote (None: none); every file must carry the same."""
    texts = {f.attrs.get(emu_attrs.META) for f in files}
    if len(texts) > 1:
        odd = next(f for f in files if f.attrs.get(emu_attrs.META) != files[0].attrs.get(emu_attrs.META))
        raise TraceError(f"{odd.path}: its emu.meta differs from {files[0].path.name}'s: the files come from "
                         "different exports (or a folder holds two); give one export's files")
    return emu_attrs.meta(files[0].attrs, str(files[0].path))


def _world(files: list[EtFile], ranks: list[int], given: int | None, exported: TraceMeta | None,
           gaps: list[str]) -> int:
    """The job's ranks: what emu's own meta or the process groups say, else ``given``, else the
    files' (said in ``gaps``); never fewer than a file's rank number or a group holds."""
    from emu.traces.validate import MAX_WORLD

    declared = _groups_declared(files)
    sizes = [g["group_size"] for f in files for g in _pg_init(f)
             if isinstance(g.get("group_size"), int) and 0 < g["group_size"] <= MAX_WORLD]
    said = max([exported.world_size if exported else 0, *(len(m) for m in declared.values() if m), *sizes])
    least = max(ranks) + 1
    if least > MAX_WORLD:
        raise TraceError(f"{files[ranks.index(least - 1)].path}: its name says rank {least - 1}; a job has at most "
                         f"{MAX_WORLD} ranks: name the files <name>.<rank>.et")
    if given is not None:
        if exported is not None and given != exported.world_size:
            raise TraceError(f"{files[0].path}: written by emu export for {exported.world_size} ranks: drop --world-size")
        if not max(said, least) <= given <= MAX_WORLD:
            raise ConfigError(f"--world-size {given}: the Chakra files hold rank {least - 1}"
                              + (f" and groups of {said}" if said else "")
                              + f"; give {max(said, least)} to {MAX_WORLD}")
        return given
    if said:
        return max(said, least)
    gaps.append(f"world size: the Chakra files do not say (no process_group:init); taken as {least}, the files "
                "given (emu capture --chakra --world-size N says otherwise)")
    return least


def _pg_init(f: EtFile) -> list[dict[str, Any]]:
    """The process groups a file's ``process_group:init`` METADATA node describes (Chakra's PyTorch
    converter keeps the host trace's JSON there, inside a Python list's text)."""
    for node in f.nodes:
        if node.type == NodeType.METADATA and "process_group:init" in node.name:
            text = node.inputs.values
            start, end = text.find("["), text.rfind("]")
            inner = text[start + 1:end].strip() if start >= 0 < end else ""
            for candidate in (inner.strip("'\""), text):
                try:
                    doc = emu_attrs.load_json(candidate.encode().decode("unicode_escape"), str(f.path),
                                              "process_group:init")
                except (TraceError, UnicodeError):
                    continue
                if isinstance(doc, list):
                    return [g for g in doc if isinstance(g, dict)]
    return []


def _groups_declared(files: list[EtFile]) -> dict[str, tuple[int, ...] | None]:
    """pg_name to its ranks as the files' ``process_group:init`` nodes give them (None: every rank),
    every file's merged (PyTorch lists in each rank's trace only the groups it belongs to)."""
    from emu.traces.validate import MAX_WORLD

    out: dict[str, tuple[int, ...] | None] = {}
    for f in files:
        for g in _pg_init(f):
            ranks, name = g.get("ranks"), str(g.get("pg_name"))[:100]
            if not isinstance(ranks, list) or not all(isinstance(r, int) and 0 <= r < MAX_WORLD for r in ranks):
                raise TraceError(f"{f.path}: process_group:init gives group {name!r} the ranks {str(ranks)[:60]}; "
                                 f"a group's ranks are integers in 0..{MAX_WORLD - 1}")
            members = tuple(ranks) or None
            if name in out and out[name] != members:
                raise TraceError(f"{f.path}: process_group:init gives group {name!r} other ranks than another "
                                 "file does; give one job's files")
            out[name] = members
    return out


def _process_groups(files: list[EtFile], world: int) -> dict[str, tuple[int, ...]]:
    """pg_name to its ranks (every rank where the init lists none)."""
    everyone = tuple(range(world))
    return {name: members or everyone for name, members in _groups_declared(files).items()}


def dtype_of(types: str) -> Dtype | None:
    """The first tensor's dtype in an IOInfo's ``types`` text (``['Tensor(float)', ...]``)."""
    found = re.search(r"Tensor\(([^)]+)\)", types)
    return DTYPE_SPELLINGS.get(found.group(1)) if found else None


def walk(nodes: Sequence[Any]) -> list[Any]:
    """The nodes in dependency order (data_deps), ties broken by id; raises on a cycle."""
    by_id = {n.id: n for n in nodes}
    waiting = {n.id: sum(1 for d in set(n.data_deps) if d in by_id) for n in nodes}
    children: dict[int, list[int]] = {}
    for n in nodes:
        for d in set(n.data_deps):
            if d in by_id:
                children.setdefault(d, []).append(n.id)
    ready = [i for i, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(by_id[i])
        for c in children.get(i, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(nodes):
        stuck = sorted(i for i, k in waiting.items() if k > 0)[:5]
        raise TraceError(f"its data_deps form a cycle (nodes {stuck} ...): not an execution trace")
    return order

