"""Rules that span records of an emu trace, checked after loading or before saving.

The loader checks each field's type and range; this module checks what ties
fields together: ids and waits within an iteration, bytes against counts,
groups against the world size, and that the ranks' programs can be matched
collective by collective (the k-th collective of a group on one rank meets the
k-th on every other member, as NCCL requires).
"""

from __future__ import annotations

from emu.errors import TraceError
from emu.traces.model import Coll, CollKind, Iteration, Trace, Wait

_P2P = (CollKind.SEND, CollKind.RECV)


def _fail(path: str, rank: int, index: int, it: Iteration, op: int | None, fld: str,
          problem: str) -> TraceError:
    where = f"{path}: rank {rank}: iteration {index} (step {it.step})"
    if op is not None:
        where += f": op {op}"
    return TraceError(f"{where}: field '{fld}' {problem}")


def _check_iteration(path: str, rank: int, world: int, index: int, it: Iteration) -> None:
    if not it.ops:
        raise _fail(path, rank, index, it, None, "ops", "is empty: an iteration needs a program")
    seen: set[int] = set()
    for k, op in enumerate(it.ops):
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
    """Per group, the sequence of (kind, dtype, count) a rank issues."""
    groups: dict[tuple[int, ...] | int, list[tuple[str, str, int]]] = {}
    for op in it.colls:
        if op.kind in _P2P:
            continue
        key = op.group if op.group is not None else op.group_size
        groups.setdefault(key, []).append((op.kind.value, op.dtype.value, op.count))
    return groups


def validate_trace(trace: Trace, path: str) -> None:
    """Raise TraceError naming the first rule a trace breaks."""
    world = trace.meta.world_size
    if not trace.ranks:
        raise TraceError(f"{path}: field 'ranks' is empty: a trace needs the program of at least one rank")
    seen_ranks: set[int] = set()
    lengths = set()
    for program in trace.ranks:
        if program.rank in seen_ranks:
            raise TraceError(f"{path}: rank {program.rank}: field 'rank' appears twice")
        if program.rank >= world:
            raise TraceError(f"{path}: rank {program.rank}: field 'rank' is not below "
                             f"meta.world_size {world}")
        seen_ranks.add(program.rank)
        if not program.iterations:
            raise TraceError(f"{path}: rank {program.rank}: field 'iterations' is empty")
        lengths.add(len(program.iterations))
        for index, it in enumerate(program.iterations):
            _check_iteration(path, program.rank, world, index, it)
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
