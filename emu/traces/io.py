"""Reading and writing emu trace files (JSON, optionally gzip-compressed).

One table, ``LOADERS``, maps each supported ``schema_version`` to its loader;
an unknown version is refused with a message listing the supported ones. The
loader checks every field as it builds the records, so an error names the file,
the rank, the iteration, the op and the field, and says what would fix it.
Cross-record rules (ids, waits, matching across ranks) live in ``validate``.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emu.errors import TraceError
from emu.files import write_atomic
from emu.traces.jsonfile import read_json
from emu.traces.mesh import Mesh, MeshDim
from emu.traces.model import (
    SCHEMA,
    CaptureNoise,
    Coll,
    CollKind,
    Compute,
    Dtype,
    Experts,
    GradientSample,
    GroupRole,
    Iteration,
    Op,
    RankProgram,
    Source,
    Sparsity,
    Splits,
    Trace,
    TraceMeta,
    Wait,
)
from emu.traces.validate import MAX_US, validate_trace

SCHEMA_VERSION = 1
# Far above any real trace (a 1000-rank, 100-iteration program is ~50 MB) and
# far below what would exhaust memory when a wrong file is passed.
MAX_TRACE_BYTES = 1 << 30
MAX_GRADIENT_SAMPLE = 1 << 16  # values of one gradient sample
MAX_BLOCK_ELEMENTS = 1 << 20  # a sparsity block; OmniReduce uses 256


@dataclass(frozen=True)
class _Where:
    """Where in a trace file a value sits, for error messages."""

    path: str
    rank: int | None = None
    iteration: int | None = None
    step: int | None = None
    op: int | None = None

    def at(self, **kw: int | None) -> _Where:
        return _Where(**{**self.__dict__, **kw})

    def fail(self, fld: str, problem: str) -> TraceError:
        parts = [self.path]
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.iteration is not None:
            step = f" (step {self.step})" if self.step is not None else ""
            parts.append(f"iteration {self.iteration}{step}")
        if self.op is not None:
            parts.append(f"op {self.op}")
        return TraceError(f"{': '.join(parts)}: field '{fld}' {problem}")


def _get(obj: dict[str, Any], key: str, where: _Where, kind: type | tuple[type, ...],
         *, optional: bool = False) -> Any:
    if key not in obj or (optional and obj[key] is None):
        if optional:
            return None
        raise where.fail(key, "is missing")
    value = obj[key]
    # bool is an int in Python; a count of True is never meant.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise where.fail(key, f"must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise where.fail(key, f"must be {_kind_name(kind)}, got {type(value).__name__} {_show(value)}")
    return value


_SHOW = 80  # characters of a value a message quotes


def _show(value: Any) -> str:
    """A value for a message: a corrupted file may hold a megabyte in one field."""
    text = repr(value)
    return text if len(text) <= _SHOW else f"{text[:_SHOW]}... ({len(text)} characters)"


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", bool: "true or false"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _non_negative(obj: dict[str, Any], key: str, where: _Where, *, optional: bool = False) -> float | None:
    value = _get(obj, key, where, (int, float), optional=optional)
    if value is None:
        return None
    if not value >= 0 or value == float("inf"):
        raise where.fail(key, f"must be a finite number >= 0, got {value!r}")
    if value > MAX_US:
        # before float(): an integer of 400 digits does not fit a float
        raise where.fail(key, f"is {_show(value)} us ({value / 3.6e9:.3g} h), more than a day, which no "
                         "training step takes; if the tool that wrote the trace counted ns or ms, "
                         "convert to microseconds (the format's unit), else re-capture it")
    return float(value)


def _int(obj: dict[str, Any], key: str, where: _Where, *, minimum: int = 0,
         optional: bool = False) -> int | None:
    value = _get(obj, key, where, int, optional=optional)
    if value is not None and value < minimum:
        raise where.fail(key, f"must be an integer >= {minimum}, got {value}")
    return value


def _enum(enum: type, obj: dict[str, Any], key: str, where: _Where) -> Any:
    value = _get(obj, key, where, str)
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise where.fail(key, f"is {value!r}; it must be one of: {allowed}") from None


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _int_tuple(obj: dict[str, Any], key: str, where: _Where) -> tuple[int, ...] | None:
    value = _get(obj, key, where, list, optional=True)
    if value is None:
        return None
    if not all(_is_count(v) for v in value):
        bad = next(v for v in value if not _is_count(v))
        raise where.fail(key, f"must be a list of integers >= 0, holds {_show(bad)}")
    return tuple(value)


def _str_tuple(obj: dict[str, Any], key: str, where: _Where) -> tuple[str, ...]:
    value = _get(obj, key, where, list, optional=True) or []
    if not all(isinstance(v, str) for v in value):
        raise where.fail(key, "must be a list of strings")
    return tuple(value)


def _load_op(raw: Any, where: _Where) -> Op:
    if not isinstance(raw, dict):
        raise where.fail("op", f"each op must be an object, got {type(raw).__name__}")
    kind = _get(raw, "op", where, str)
    if kind == "compute":
        return Compute(name=_get(raw, "name", where, str), dur_us=_non_negative(raw, "dur_us", where))
    if kind == "wait":
        ids = _int_tuple(raw, "ids", where)
        if ids is None:
            raise where.fail("ids", "is missing")
        return Wait(ids=ids, blocked_us=_non_negative(raw, "blocked_us", where, optional=True))
    if kind == "coll":
        tensors = _get(raw, "tensors", where, list, optional=True)
        if tensors is not None:
            if not all(isinstance(t, list) and all(_is_count(d) for d in t) for t in tensors):
                raise where.fail("tensors", "must be a list of shapes (lists of integers >= 0)")
            tensors = tuple(tuple(t) for t in tensors)
        return Coll(
            id=_int(raw, "id", where),
            kind=_enum(CollKind, raw, "kind", where),
            dtype=_enum(Dtype, raw, "dtype", where),
            count=_int(raw, "count", where),
            bytes=_int(raw, "bytes", where),
            group_size=_int(raw, "group_size", where, minimum=1),
            observed_us=_non_negative(raw, "observed_us", where, optional=True),
            root=_int(raw, "root", where, optional=True),
            peer=_int(raw, "peer", where, optional=True),
            group=_int_tuple(raw, "group", where),
            tensors=tensors,
            sparsity=_load_sparsity(raw, where),
            group_role=None if raw.get("group_role") is None else _enum(GroupRole, raw, "group_role", where),
            stream=_int(raw, "stream", where, optional=True),
            splits=_load_splits(raw, where),
        )
    raise where.fail("op", f"is {kind!r}; it must be one of: compute, coll, wait")


def _load_splits(raw: dict[str, Any], where: _Where) -> Splits | None:
    """An all_to_all's ``splits``: {"send_elements": [...], "recv_elements": [...]} (optional; the
    lengths and sums are checked with the rest of the op by ``validate_trace``)."""
    doc = _get(raw, "splits", where, dict, optional=True)
    if doc is None:
        return None
    send, recv = _int_tuple(doc, "send_elements", where), _int_tuple(doc, "recv_elements", where)
    if send is None or recv is None:
        raise where.fail("splits", "needs both send_elements and recv_elements (lists of integers >= 0)")
    return Splits(send_elements=send, recv_elements=recv)


def _load_sparsity(raw: dict[str, Any], where: _Where) -> Sparsity | None:
    doc = _get(raw, "sparsity", where, dict, optional=True)
    if doc is None:
        return None
    fractions = []
    for key in ("nonzero", "union"):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise where.fail(f"sparsity.{key}", f"is {_show(value)}; give the fraction of blocks, a number in [0, 1]")
        fractions.append(float(value))
    block = doc.get("block_elements")
    if not _is_count(block) or not 1 <= block <= MAX_BLOCK_ELEMENTS:
        raise where.fail("sparsity.block_elements", f"is {_show(block)}; give the elements per block, "
                         f"an integer in 1..{MAX_BLOCK_ELEMENTS} (OmniReduce's default: 256)")
    tensor = doc.get("sparse_tensor", False)
    if not isinstance(tensor, bool):
        raise where.fail("sparsity.sparse_tensor", f"is {_show(tensor)}; give true (the framework's all_reduce "
                         "of a sparse tensor) or false, or leave it out")
    return Sparsity(block_elements=block, nonzero=fractions[0], union=fractions[1], sparse_tensor=tensor)


def _load_meta(raw: Any, where: _Where) -> TraceMeta:
    if not isinstance(raw, dict):
        raise where.fail("meta", "must be an object")
    return TraceMeta(
        source=_enum(Source, raw, "source", where),
        world_size=_int(raw, "world_size", where, minimum=1),
        backend=_get(raw, "backend", where, str),
        device=_get(raw, "device", where, str),
        framework=_get(raw, "framework", where, str),
        dtype=_get(raw, "dtype", where, str),
        captured_at=_get(raw, "captured_at", where, str),
        model=_get(raw, "model", where, str, optional=True),
        batch_size=_int(raw, "batch_size", where, minimum=1, optional=True),
        params=_int(raw, "params", where, optional=True),
        command=_get(raw, "command", where, str, optional=True),
        kineto_files=_str_tuple(raw, "kineto_files", where),
        gaps=_str_tuple(raw, "gaps", where),
        comm_hook=_get(raw, "comm_hook", where, str, optional=True),
        mesh=_load_mesh(raw, where),
        cpu_cores=_int(raw, "cpu_cores", where, minimum=1, optional=True),
        threads_per_rank=_int(raw, "threads_per_rank", where, minimum=1, optional=True),
        experts=_load_experts(raw, where),
        noise=_load_noise(raw, where),
    )


def _load_noise(raw: dict[str, Any], where: _Where) -> CaptureNoise | None:
    """``meta.noise`` (optional; docs/trace-format.md): the steps' spread and the machine's load."""
    doc = _get(raw, "noise", where, dict, optional=True)
    if doc is None:
        return None
    values: dict[str, float | None] = {}
    for key in ("step_cv", "compute_cv", "rank_cv", "other_cores", "steal"):
        value = doc.get(key, 0.0 if key == "rank_cv" else None)
        if value is None and key in ("other_cores", "steal"):
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_US:
            raise where.fail(f"meta.noise.{key}", f"is {_show(value)}; give a number >= 0")
        values[key] = float(value)
    busy = doc.get("busy", [])
    if not isinstance(busy, list) or len(busy) > 16 or not all(isinstance(b, str) and len(b) <= 1000 for b in busy):
        raise where.fail("meta.noise.busy", "must be a list of at most 16 lines of text")
    windows = doc.get("windows", 1)
    if not _is_count(windows) or not 1 <= windows <= 1000:
        raise where.fail("meta.noise.windows", f"is {_show(windows)}; give the windows taken, an integer >= 1")
    unprofiled = doc.get("unprofiled_step_us")
    if unprofiled is not None and (isinstance(unprofiled, bool) or not isinstance(unprofiled, int | float)
                                   or not 0 < unprofiled <= MAX_US):
        raise where.fail("meta.noise.unprofiled_step_us", f"is {_show(unprofiled)}; give a time in us > 0, or null")
    steps = doc.get("unprofiled_steps", 0 if unprofiled is None else 1)
    if not _is_count(steps) or not (steps >= 1 if unprofiled is not None else steps == 0) or steps > 1_000_000:
        raise where.fail("meta.noise.unprofiled_steps", f"is {_show(steps)}; give the steps timed: at least 1 "
                         "with unprofiled_step_us, 0 without")
    return CaptureNoise(step_cv=values["step_cv"] or 0.0, compute_cv=values["compute_cv"] or 0.0,
                        rank_cv=values["rank_cv"] or 0.0,
                        other_cores=values["other_cores"], steal=values["steal"], busy=tuple(busy), windows=windows,
                        unprofiled_step_us=None if unprofiled is None else float(unprofiled), unprofiled_steps=steps)


def _load_experts(raw: dict[str, Any], where: _Where) -> Experts | None:
    """``meta.experts``: {"count": 16, "params_per_expert": 262912} (optional; docs/trace-format.md)."""
    doc = _get(raw, "experts", where, dict, optional=True)
    if doc is None:
        return None
    def shown(key: str) -> str:
        return _show(doc[key]) if key in doc else "absent"

    count, params = doc.get("count"), doc.get("params_per_expert")
    if not _is_count(count) or count < 1:
        raise where.fail("meta.experts.count", f"is {shown('count')}; give the number of experts, an integer >= 1")
    if not _is_count(params) or params < 0:
        raise where.fail("meta.experts.params_per_expert", f"is {shown('params_per_expert')}; give one expert's "
                         "parameter elements, an integer >= 0")
    return Experts(count=count, params_per_expert=params)


def _load_mesh(raw: dict[str, Any], where: _Where) -> Mesh | None:
    """``meta.mesh``: an object of dimension names to sizes, outermost first (JSON keeps the order)."""
    doc = _get(raw, "mesh", where, dict, optional=True)
    if doc is None:
        return None
    dims = []
    for name, size in doc.items():
        if not _is_count(size) or size < 1:
            raise where.fail(f"meta.mesh.{name[:40]}", f"is {_show(size)}; give the dimension's size, an integer >= 1")
        dims.append(MeshDim(name, size))
    return Mesh(tuple(dims))


def _load_v1(doc: dict[str, Any], where: _Where) -> Trace:
    meta = _load_meta(doc.get("meta"), where)
    raw_ranks = _get(doc, "ranks", where, list)
    ranks = []
    for raw_rank in raw_ranks:
        if not isinstance(raw_rank, dict):
            raise where.fail("ranks", "must be a list of objects")
        rank = _int(raw_rank, "rank", where)
        rwhere = where.at(rank=rank)
        iterations = []
        for i, raw_it in enumerate(_get(raw_rank, "iterations", rwhere, list)):
            iwhere = rwhere.at(iteration=i)
            if not isinstance(raw_it, dict):
                raise iwhere.fail("iterations", "must be a list of objects")
            step = _int(raw_it, "step", iwhere)
            iwhere = iwhere.at(step=step)
            ops = tuple(_load_op(raw_op, iwhere.at(op=k))
                        for k, raw_op in enumerate(_get(raw_it, "ops", iwhere, list)))
            iterations.append(Iteration(step=step, measured_us=_non_negative(raw_it, "measured_us", iwhere),
                                        ops=ops))
        ranks.append(RankProgram(rank=rank, iterations=tuple(iterations)))
    return Trace(meta=meta, ranks=tuple(ranks), gradient_samples=_load_samples(doc, where))


def _load_samples(doc: dict[str, Any], where: _Where) -> tuple[GradientSample, ...]:
    """``gradient_samples``: per rank, iteration and all_reduce, float32 values in base64."""
    raw = _get(doc, "gradient_samples", where, list, optional=True) or []
    out = []
    for i, item in enumerate(raw):
        fld = f"gradient_samples[{i}]"
        if not isinstance(item, dict):
            raise where.fail(fld, "must be an object of rank, iteration, coll and values")
        ints = [item.get(key) for key in ("rank", "iteration", "coll")]
        if not all(_is_count(v) for v in ints):
            raise where.fail(fld, "needs rank, iteration and coll, integers >= 0")
        try:
            values = base64.b64decode(item.get("values", ""), validate=True)
        except (ValueError, TypeError):
            raise where.fail(f"{fld}.values", "is not base64; give float32 values, little-endian, in base64") from None
        if len(values) % 4 or len(values) > 4 * MAX_GRADIENT_SAMPLE:
            raise where.fail(f"{fld}.values", f"holds {len(values)} bytes; give at most {MAX_GRADIENT_SAMPLE} "
                             "float32 values (4 bytes each)")
        out.append(GradientSample(rank=ints[0], iteration=ints[1], coll=ints[2], values=values))
    return tuple(out)


# The one table from schema version to loader. A new version adds a row; the
# rows of older versions stay so that old traces keep loading.
LOADERS: dict[int, Callable[[dict[str, Any], _Where], Trace]] = {1: _load_v1}


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load and validate an emu trace, or import a Chakra execution trace (a ``.et`` file,
    recognised by its content); raises TraceError naming what is wrong."""
    path = Path(path)
    from emu.traces.chakra.read import is_chakra

    if is_chakra(path):
        from emu.traces.chakra import import_chakra

        return import_chakra([path])
    doc = read_json(path, max_bytes=MAX_TRACE_BYTES, error=TraceError,
                    expected="the path of an emu trace (.json or .json.gz) made by 'emu capture'")
    where = _Where(str(path))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        hint = (" (it looks like a Kineto trace: import it with 'emu capture --kineto FILE')"
                if isinstance(doc, dict) and "traceEvents" in doc else "")
        raise where.fail("schema", f"must be {SCHEMA!r}: this is not an emu trace{hint}")
    version = doc.get("schema_version")
    loader = LOADERS.get(version) if isinstance(version, int) and not isinstance(version, bool) else None
    if loader is None:
        supported = ", ".join(str(v) for v in sorted(LOADERS))
        raise where.fail("schema_version", f"is {version!r}, which this emu cannot read; "
                         f"supported versions: {supported} (a newer emu may read it)")
    trace = loader(doc, where)
    validate_trace(trace, str(path))
    return trace


def meta_to_dict(meta: TraceMeta) -> dict[str, Any]:
    """A trace's ``meta`` object, as the trace file has it."""
    meta_doc: dict[str, Any] = {
        "source": meta.source.value, "model": meta.model, "world_size": meta.world_size,
        "backend": meta.backend, "device": meta.device, "framework": meta.framework,
        "batch_size": meta.batch_size, "params": meta.params, "dtype": meta.dtype,
        "captured_at": meta.captured_at,
    }
    if meta.command is not None:
        meta_doc["command"] = meta.command
    if meta.kineto_files:
        meta_doc["kineto_files"] = list(meta.kineto_files)
    if meta.gaps:
        meta_doc["gaps"] = list(meta.gaps)
    if meta.comm_hook is not None:
        meta_doc["comm_hook"] = meta.comm_hook
    if meta.mesh is not None:
        meta_doc["mesh"] = {d.name: d.size for d in meta.mesh.dims}
    if meta.experts is not None:
        meta_doc["experts"] = {"count": meta.experts.count, "params_per_expert": meta.experts.params_per_expert}
    if meta.noise is not None:
        meta_doc["noise"] = {"step_cv": meta.noise.step_cv, "compute_cv": meta.noise.compute_cv,
                             "rank_cv": meta.noise.rank_cv,
                             "other_cores": meta.noise.other_cores, "steal": meta.noise.steal,
                             "busy": list(meta.noise.busy), "windows": meta.noise.windows}
        if meta.noise.unprofiled_step_us is not None:
            meta_doc["noise"].update(unprofiled_step_us=meta.noise.unprofiled_step_us,
                                     unprofiled_steps=meta.noise.unprofiled_steps)
    for key in ("cpu_cores", "threads_per_rank"):
        if getattr(meta, key) is not None:
            meta_doc[key] = getattr(meta, key)
    return meta_doc


def meta_from_dict(raw: Any, path: str) -> TraceMeta:
    """``meta_to_dict``'s inverse; raises TraceError naming ``path`` and the field."""
    return _load_meta(raw, _Where(path))


def op_from_dict(raw: Any, path: str) -> Op:
    """``op_to_dict``'s inverse; raises TraceError naming ``path`` and the field."""
    return _load_op(raw, _Where(path))


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON document of a trace, in the current schema version."""
    meta_doc = meta_to_dict(trace.meta)
    doc = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "meta": meta_doc,
        "ranks": [{"rank": r.rank, "iterations": [
            {"step": it.step, "measured_us": _us(it.measured_us), "ops": [op_to_dict(op) for op in it.ops]}
            for it in r.iterations]} for r in trace.ranks],
    }
    if trace.gradient_samples:
        doc["gradient_samples"] = [{"rank": g.rank, "iteration": g.iteration, "coll": g.coll,
                                    "values": base64.b64encode(g.values).decode()} for g in trace.gradient_samples]
    return doc


def trace_digest(trace: Trace) -> str:
    """The hex sha256 of a trace's canonical JSON: the same for the same content whatever the file's
    compression, key order or path (how ``emu check`` pairs reports of one trace)."""
    import hashlib

    text = json.dumps(trace_to_dict(trace), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def trace_sha256(path: str | os.PathLike[str]) -> str:
    """``trace_digest`` of the trace file at ``path`` (loaded and checked first)."""
    return trace_digest(load_trace(path))


def _us(value: float) -> float:
    # Nanosecond resolution is all a profiler gives; more digits only bloat files.
    return round(value, 3)


def op_to_dict(op: Op) -> dict[str, Any]:
    """One op as the trace file has it."""
    if isinstance(op, Compute):
        return {"op": "compute", "name": op.name, "dur_us": _us(op.dur_us)}
    if isinstance(op, Wait):
        doc: dict[str, Any] = {"op": "wait", "ids": list(op.ids)}
        if op.blocked_us is not None:
            doc["blocked_us"] = _us(op.blocked_us)
        return doc
    doc = {"op": "coll", "id": op.id, "kind": op.kind.value, "dtype": op.dtype.value,
           "count": op.count, "bytes": op.bytes, "group_size": op.group_size,
           "observed_us": None if op.observed_us is None else _us(op.observed_us)}
    for key in ("root", "peer"):
        if getattr(op, key) is not None:
            doc[key] = getattr(op, key)
    if op.group is not None:
        doc["group"] = list(op.group)
    if op.group_role is not None:
        doc["group_role"] = op.group_role.value
    if op.stream is not None:
        doc["stream"] = op.stream
    if op.splits is not None:
        doc["splits"] = {"send_elements": list(op.splits.send_elements),
                         "recv_elements": list(op.splits.recv_elements)}
    if op.tensors is not None:
        doc["tensors"] = [list(t) for t in op.tensors]
    if op.sparsity is not None:
        s = op.sparsity
        doc["sparsity"] = {"block_elements": s.block_elements, "nonzero": round(s.nonzero, 6),
                           "union": round(s.union, 6)}
        if s.sparse_tensor:
            doc["sparsity"]["sparse_tensor"] = True
    return doc


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write a trace; a name ending in .gz is gzip-compressed. Whole or not at all
    (``emu.files.write_atomic``): a full disk, a crash or Ctrl-C leaves either the old file or
    the new one, never a truncated or emptied trace."""
    path = Path(path)
    return write_atomic(path, encoded(trace, path), "the trace")


def encoded(trace: Trace, path: str | os.PathLike[str]) -> bytes:
    """The bytes of the trace's file at ``path`` (gzipped where the name ends in .gz), checked first."""
    path = Path(path)
    validate_trace(trace, str(path))
    data = json.dumps(trace_to_dict(trace), separators=(",", ":")).encode()
    return gzip.compress(data, compresslevel=9, mtime=0) if path.suffix == ".gz" else data  # RunFailed: an output not written is a failed run (exit 1)
