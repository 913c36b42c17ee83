"""Rules that span records of an emu trace, checked after loading, after importing and before saving.

The loader checks each field's type; this module checks what a value may be and
what ties fields together: plausible sizes and times (so that a corrupted file or
a unit mix-up is refused where it is read, not found as an absurd replay), ids and
waits within an iteration, bytes against counts, tensor shapes against counts,
groups against the world size, and that the ranks' programs can be matched
collective by collective (the k-th collective of a group on one rank meets the
k-th on every other member, as NCCL requires). Captures and imports build traces
in memory, so the bounds live here and not only in the loader: emu never writes a
trace it would refuse to read.
"""

from __future__ import annotations

import numpy as np

from emu.errors import TraceError
from emu.traces.mesh import Mesh
from emu.traces.model import Coll, CollKind, Compute, GroupRole, Iteration, Op, Splits, Trace, Wait

_P2P = (CollKind.SEND, CollKind.RECV)

# Plausibility bounds: each far beyond any real job, and far below what breaks
# arithmetic downstream (int64 byte counts, float microseconds, numpy shapes).
MAX_ELEMENTS = 2**40  # a collective's elements: 4 TiB of float32, ~10x the largest model's gradients
MAX_US = 86_400e6  # a day, in microseconds: no step, compute span or collective lasts longer
MAX_WORLD = 2**20  # ranks of a job
MAX_STEP = 2**40  # a ProfilerStep number
MAX_ID = 2**31 - 1  # a collective's id within an iteration
MAX_STREAM = 2**16 - 1  # a rank's communication streams (NCCL uses a handful)
_TOO_BIG = ("no real job has that; the file is corrupted or was written by a bug; "
            "re-capture the trace (emu capture) or fix the tool that wrote it")
_TOO_LONG = ("more than a day, which no training step takes; if the tool that wrote the trace "
             "counted ns or ms, convert to microseconds (the format's unit), else re-capture it")


def _fail(path: str, rank: int, index: int, it: Iteration, op: int | None, fld: str,
          problem: str) -> TraceError:
    where = f"{path}: rank {rank}: iteration {index} (step {it.step})"
    if op is not None:
        where += f": op {op}"
    return TraceError(f"{where}: field '{fld}' {problem}")


def _time_problem(value: float | None) -> str | None:
    """What is wrong with a duration in microseconds, or None."""
    if value is None or 0 <= value <= MAX_US:
        return None
    if not value >= 0:  # negative or NaN
        return f"is {value!r}; a duration must be a finite number of microseconds >= 0"
    return f"is {value!r} us ({value / 3.6e9:.3g} h), {_TOO_LONG}"


def _shape_elements(shape: tuple[int, ...]) -> int | None:
    """Elements of a shape, None when a dimension is negative or the product is implausible."""
    n = 1
    for d in shape:
        if d < 0 or d > MAX_ELEMENTS:
            return None
        n *= d
        if n > MAX_ELEMENTS:
            return None
    return n


def _op_problem(op: Op) -> tuple[str, str] | None:
    """(field, problem) for the first value of one op that is out of range, or None."""
    if isinstance(op, Compute):
        problem = _time_problem(op.dur_us)
        return ("dur_us", problem) if problem else None
    if isinstance(op, Wait):
        bad = [i for i in op.ids if not 0 <= i <= MAX_ID]
        if bad:
            return "ids", f"holds {bad[0]}; collective ids are integers in 0..{MAX_ID}: {_TOO_BIG}"
        problem = _time_problem(op.blocked_us)
        return ("blocked_us", problem) if problem else None
    if not 0 <= op.id <= MAX_ID:
        return "id", f"is {op.id}; collective ids are integers in 0..{MAX_ID}: {_TOO_BIG}"
    if not 0 <= op.count <= MAX_ELEMENTS:
        return "count", (f"is {op.count} elements; a collective holds 0..2**40 ({MAX_ELEMENTS}) elements: "
                         f"{_TOO_BIG}" if op.count > 0 else f"is {op.count}; an element count is >= 0")
    if op.group_size < 1:
        return "group_size", f"is {op.group_size}; a group has at least 1 rank"
    problem = _time_problem(op.observed_us)
    if problem:
        return "observed_us", problem
    for key in ("root", "peer"):
        value = getattr(op, key)
        if value is not None and value < 0:
            return key, f"is {value}; a rank is an integer >= 0"
    if op.stream is not None and not 0 <= op.stream <= MAX_STREAM:
        return "stream", f"is {op.stream}; a stream is a rank's own number in 0..{MAX_STREAM}"
    if op.tensors is not None:
        sizes = [_shape_elements(t) for t in op.tensors]
        if any(n is None for n in sizes):
            return "tensors", (f"holds a shape with a negative dimension or more than 2**40 elements: "
                               f"{_TOO_BIG}")
        total = sum(sizes)  # type: ignore[arg-type]
        if total != op.count:
            return "tensors", (f"shapes hold {total} elements but count is {op.count}: they must add up to "
                               "the collective's tensor; drop 'tensors' or fix the count")
    if op.sparsity is not None:
        s = op.sparsity
        if op.kind != CollKind.ALL_REDUCE:
            return "sparsity", f"is given on {op.kind.value}; it is measured on all_reduce only: drop it"
        if not (0 <= s.nonzero <= 1 and 0 <= s.union <= 1 and s.nonzero <= s.union + 1e-6):
            return "sparsity", (f"has nonzero {s.nonzero:g} and union {s.union:g}; both are fractions in [0, 1] "
                                "and a rank's non-zero blocks are among the union's (nonzero <= union)")
        if not 1 <= s.block_elements <= 1 << 20:
            return "sparsity", f"has block_elements {s.block_elements}; give 1..2**20"
    return _splits_problem(op)


def _splits_problem(op: Coll) -> tuple[str, str] | None:
    """An all_to_all's per-peer elements: one of each per member, the sends adding up to ``count``."""
    sp = op.splits
    if sp is None:
        return None
    if op.kind != CollKind.ALL_TO_ALL:
        return "splits", f"is given on {op.kind.value}; it is an all_to_all's per-peer sizes: drop it"
    if len(sp.send_elements) != op.group_size or len(sp.recv_elements) != op.group_size:
        return "splits", (f"lists {len(sp.send_elements)} sends and {len(sp.recv_elements)} receives; give one "
                          f"of each per member of the group (group_size {op.group_size})")
    if sum(sp.send_elements) != op.count:
        return "splits", (f"sends {sum(sp.send_elements)} elements but count is {op.count}: the sends are the "
                          "input tensor split by peer; fix either")
    if sum(sp.recv_elements) > MAX_ELEMENTS:
        return "splits", f"receives more than 2**40 elements: {_TOO_BIG}"
    return None


def _mesh_problem(op: Coll, rank: int, world: int, mesh: Mesh) -> tuple[str, str] | None:
    """(field, problem) where a collective's role or group contradicts the job's mesh, or None."""
    role = op.group_role
    dims = [i for i, d in enumerate(mesh.dims) if d.role == role] if role not in (None, GroupRole.OTHER) else []
    if len(dims) != 1:  # a role the mesh does not name (or names twice) says nothing checkable
        return None
    group = op.group if op.group is not None else tuple(range(world)) if op.group_size == world else None
    if group is None:
        return None
    want = mesh.slice(rank, (dims[0],))
    if tuple(sorted(group)) != want:
        return "group_role", (f"is {role.value} but the group {_short(group)} is not rank {rank}'s {role.value} "
                              f"slice {_short(want)} of meta.mesh {mesh.text()}: fix the group or its role")
    return None


def _short(ranks: tuple[int, ...]) -> str:
    text = str(list(ranks))
    return text if len(text) <= 60 else f"{text[:60]}...]"


def _check_iteration(path: str, rank: int, world: int, index: int, it: Iteration, mesh: Mesh | None = None) -> None:
    if not it.ops:
        raise _fail(path, rank, index, it, None, "ops", "is empty: an iteration needs a program")
    if not 0 <= it.step <= MAX_STEP:
        raise _fail(path, rank, index, it, None, "step", f"is {it.step}; a step number is in 0..2**40: {_TOO_BIG}")
    problem = _time_problem(it.measured_us)
    if problem:
        raise _fail(path, rank, index, it, None, "measured_us", problem)
    seen: set[int] = set()
    for k, op in enumerate(it.ops):
        bad = _op_problem(op)
        if bad:
            raise _fail(path, rank, index, it, k, *bad)
        if isinstance(op, Coll):
            if op.id in seen:
                raise _fail(path, rank, index, it, k, "id", f"{op.id} is used twice in this iteration")
            seen.add(op.id)
            expected = op.count * op.dtype.itemsize
            if op.bytes != expected:
                raise _fail(path, rank, index, it, k, "bytes",
                            f"is {op.bytes} but count x size of {op.dtype.value} is {expected}")
            if op.group_size > world:
                raise _fail(path, rank, index, it, k, "group_size",
                            f"is {op.group_size}, larger than the world size {world}")
            if op.group is not None:
                if len(op.group) != op.group_size or len(set(op.group)) != len(op.group):
                    raise _fail(path, rank, index, it, k, "group",
                                f"must list {op.group_size} distinct ranks (group_size)")
                if max(op.group) >= world or rank not in op.group:
                    raise _fail(path, rank, index, it, k, "group",
                                f"must hold ranks below {world} including rank {rank}")
                if op.peer is not None and op.peer not in op.group:
                    raise _fail(path, rank, index, it, k, "peer",
                                f"is {op.peer}, not a rank of the group {_short(op.group)} the "
                                f"{op.kind.value} was issued on")
            if mesh is not None:
                bad = _mesh_problem(op, rank, world, mesh)
                if bad:
                    raise _fail(path, rank, index, it, k, *bad)
            if op.kind in (CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER) and op.count % op.group_size:
                raise _fail(path, rank, index, it, k, "count",
                            f"{op.count} of a {op.kind.value} must divide by group_size {op.group_size}")
            for key in ("root", "peer"):
                value = getattr(op, key)
                if value is not None and value >= world:
                    raise _fail(path, rank, index, it, k, key, f"is {value}, not a rank below {world}")
        elif isinstance(op, Wait):
            unknown = [i for i in op.ids if i not in seen]
            if unknown:
                raise _fail(path, rank, index, it, k, "ids",
                            f"names collectives {unknown} not issued earlier in this iteration")


def _signature(it: Iteration) -> dict[tuple[int, ...] | int, list[tuple[str, str, int]]]:
    """Per group, the sequence of (kind, dtype, count) a rank issues (an all_to_all's count is the
    rank's own input, which an uneven one's router sets per rank: -1, not compared)."""
    groups: dict[tuple[int, ...] | int, list[tuple[str, str, int]]] = {}
    for op in it.colls:
        if op.kind in _P2P:
            continue
        key = op.group if op.group is not None else op.group_size
        groups.setdefault(key, []).append((op.kind.value, op.dtype.value, -1 if op.kind == CollKind.ALL_TO_ALL else op.count))
    return groups


def _check_meta(trace: Trace, path: str) -> None:
    meta = trace.meta
    if not 1 <= meta.world_size <= MAX_WORLD:
        raise TraceError(f"{path}: field 'meta.world_size' is {meta.world_size}; a job has 1..2**20 "
                         f"({MAX_WORLD}) ranks: {_TOO_BIG}")
    if meta.batch_size is not None and not 1 <= meta.batch_size <= MAX_ELEMENTS:
        raise TraceError(f"{path}: field 'meta.batch_size' is {meta.batch_size}; a batch holds 1..2**40 "
                         "samples; leave it null where unknown")
    if meta.mesh is not None:
        problem = meta.mesh.problem(meta.world_size)
        if problem:
            raise TraceError(f"{path}: field 'meta.mesh' {problem}; fix the mesh or drop it")
    for key in ("cpu_cores", "threads_per_rank"):
        value = getattr(meta, key)
        if value is not None and not 1 <= value <= MAX_WORLD:
            raise TraceError(f"{path}: field 'meta.{key}' is {value}; give 1..2**20, or leave it out")
    if meta.params is not None and not 0 <= meta.params <= MAX_ELEMENTS * 1024:
        raise TraceError(f"{path}: field 'meta.params' is {meta.params}; a model has 0..2**50 parameters; "
                         "leave it null where unknown")


def validate_trace(trace: Trace, path: str) -> None:
    """Raise TraceError naming the first rule a trace breaks."""
    world = trace.meta.world_size
    _check_meta(trace, path)
    if not trace.ranks:
        raise TraceError(f"{path}: field 'ranks' is empty: a trace needs the program of at least one rank")
    seen_ranks: set[int] = set()
    lengths = set()
    for program in trace.ranks:
        if program.rank in seen_ranks:
            raise TraceError(f"{path}: rank {program.rank}: field 'rank' appears twice")
        if not 0 <= program.rank < world:
            raise TraceError(f"{path}: rank {program.rank}: field 'rank' is not below "
                             f"meta.world_size {world}" if program.rank >= 0 else
                             f"{path}: rank {program.rank}: field 'rank' must be an integer >= 0")
        seen_ranks.add(program.rank)
        if not program.iterations:
            raise TraceError(f"{path}: rank {program.rank}: field 'iterations' is empty")
        lengths.add(len(program.iterations))
        for index, it in enumerate(program.iterations):
            _check_iteration(path, program.rank, world, index, it, trace.meta.mesh)
    if len(lengths) > 1:
        raise TraceError(f"{path}: field 'iterations' differs in length between ranks "
                         f"({sorted(lengths)}); every rank needs the same iterations")
    first = trace.ranks[0]
    for program in trace.ranks[1:]:
        for index, (a, b) in enumerate(zip(first.iterations, program.iterations, strict=False)):
            sa, sb = _signature(a), _signature(b)
            for group in sa.keys() & sb.keys():
                if sa[group] != sb[group]:
                    raise TraceError(
                        f"{path}: rank {program.rank}: iteration {index} (step {b.step}): field 'ops' "
                        f"issues collectives that do not match rank {first.rank}'s in the same group "
                        "(kind, dtype and count must agree in issue order)")
    _check_exchanges(trace, path)
    _check_samples(trace, path)


def _check_exchanges(trace: Trace, path: str) -> None:
    """Where every member of a group is in the file, what member a sends member b in its i-th
    all_to_all of an iteration is what b receives from a in its i-th (``Coll.splits``)."""
    programs = {p.rank: p for p in trace.ranks}
    world = trace.meta.world_size
    for index in range(min(len(p.iterations) for p in trace.ranks)):
        seqs: dict[tuple[int, ...], dict[int, list[Coll]]] = {}
        for p in trace.ranks:
            for op in p.iterations[index].colls:
                if op.kind == CollKind.ALL_TO_ALL:
                    members = op.group if op.group is not None else tuple(range(world))
                    seqs.setdefault(members, {}).setdefault(p.rank, []).append(op)
        for members, by_rank in seqs.items():
            if set(by_rank) != set(members) or len({len(v) for v in by_rank.values()}) != 1:
                continue  # not every member in the file (or the signatures above differ)
            for i in range(len(by_rank[members[0]])):
                ops = [by_rank[r][i] for r in members]
                if any(len(op.splits.send_elements if op.splits else ()) not in (0, len(members)) for op in ops):
                    continue  # a group's size the op's own check refuses
                sent = np.array([Splits.of(op).send_elements for op in ops], np.int64)  # [a, b]: a sends b
                got = np.array([Splits.of(op).recv_elements for op in ops], np.int64)  # [b, a]: b receives from a
                bad = np.argwhere(sent != got.T)
                if len(bad):
                    a, b = (int(x) for x in bad[0])
                    ra, rb = members[a], members[b]
                    raise TraceError(
                        f"{path}: rank {rb}: iteration {index} (step {programs[rb].iterations[index].step}): "
                        f"all_to_all {ops[b].id}: field 'splits' receives {got[b, a]} elements from rank {ra}, "
                        f"which sends it {sent[a, b]}: what one sends another is what that one receives")


def _check_samples(trace: Trace, path: str) -> None:
    """Every gradient sample names a float all_reduce of its rank and iteration, once."""
    ops = {(p.rank, t, op.id): op for p in trace.ranks for t, it in enumerate(p.iterations) for op in it.colls}
    seen = set()
    for i, g in enumerate(trace.gradient_samples):
        key = (g.rank, g.iteration, g.coll)
        op = ops.get(key)
        if op is None or op.kind != CollKind.ALL_REDUCE or not op.dtype.is_float:
            raise TraceError(f"{path}: gradient_samples[{i}]: rank {g.rank}, iteration {g.iteration}, coll {g.coll} "
                             "is not a float all_reduce of the trace: drop the sample or fix its keys")
        if key in seen:
            raise TraceError(f"{path}: gradient_samples[{i}]: rank {g.rank}, iteration {g.iteration}, coll {g.coll} "
                             "has a sample already: keep one")
        seen.add(key)
