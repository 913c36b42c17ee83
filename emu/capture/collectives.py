"""Finding the collectives of a Kineto trace: what was issued, when, how big, when done.

Two sources, by what the profiler recorded:

- NCCL (and any backend that emits them): ``record_param_comms`` events carry the
  collective's name, element counts, dtype and group; the GPU kernel with the same
  ``External id`` gives the completion. ``Collective name`` "wait" marks a wait.
- gloo (CPU): no ``record_param_comms``. The launch is a ``c10d::<op>`` event on the
  issuing thread with ``Input Dims`` (needs ``record_shapes=True``) and
  ``Concrete Inputs`` (root, peer, async flag); the execution is a ``gloo:<op>``
  event on a gloo thread, matched in FIFO order and by element count, which also
  gives the dtype and the completion.

Names and argument keys are data in the tables below, not code in the parsers,
so a PyTorch release that renames an event changes one table row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emu.capture.kineto import Event, KinetoTrace
from emu.errors import KinetoError
from emu.traces.model import CollKind, Dtype


@dataclass(frozen=True)
class CollEvent:
    """One collective as the profiler saw it on one rank."""

    kind: CollKind
    dtype: Dtype
    count: int
    group_size: int
    group: tuple[int, ...] | None
    issue_us: float
    launch_end_us: float
    done_us: float | None
    tid: int | str
    blocking: bool  # the issuing thread waited for it inside the launch (sync p2p)
    async_op: bool | None  # from the launch's arguments where recorded
    root: int | None = None
    peer: int | None = None


@dataclass(frozen=True)
class WaitEvent:
    """An explicit wait (NCCL's record_param_comms "wait")."""

    ts_us: float
    tid: int | str


# record_param_comms "Collective name" -> (kind, which element count is the full tensor)
_NCCL_NAMES: dict[str, tuple[CollKind, str]] = {
    "allreduce": (CollKind.ALL_REDUCE, "In msg nelems"),
    "all_reduce": (CollKind.ALL_REDUCE, "In msg nelems"),
    "allreduce_coalesced": (CollKind.ALL_REDUCE, "In msg nelems"),
    "broadcast": (CollKind.BROADCAST, "In msg nelems"),
    "_broadcast_oop": (CollKind.BROADCAST, "In msg nelems"),
    "all_gather": (CollKind.ALL_GATHER, "Out msg nelems"),
    "allgather": (CollKind.ALL_GATHER, "Out msg nelems"),
    "_allgather_base": (CollKind.ALL_GATHER, "Out msg nelems"),
    "allgather_into_tensor_coalesced": (CollKind.ALL_GATHER, "Out msg nelems"),
    "all_gather_into_tensor": (CollKind.ALL_GATHER, "Out msg nelems"),
    "reduce_scatter": (CollKind.REDUCE_SCATTER, "In msg nelems"),
    "_reduce_scatter_base": (CollKind.REDUCE_SCATTER, "In msg nelems"),
    "reduce_scatter_tensor_coalesced": (CollKind.REDUCE_SCATTER, "In msg nelems"),
    "all_to_all": (CollKind.ALL_TO_ALL, "In msg nelems"),
    "alltoall": (CollKind.ALL_TO_ALL, "In msg nelems"),
    "alltoall_base": (CollKind.ALL_TO_ALL, "In msg nelems"),
    "send": (CollKind.SEND, "In msg nelems"),
    "recv": (CollKind.RECV, "Out msg nelems"),
    "barrier": (CollKind.BARRIER, ""),
}
# Bookkeeping entries of record_param_comms that move no data of their own.
_NCCL_IGNORED = {"init", "coalesced", "split", "wait", "startCoalescing", "endCoalescing"}

# c10d launch op -> (kind, index of the full tensor in Input Dims, is a list of tensors,
#                    multiply by group size (all_gather's input list), gloo execution names)
_GLOO_LAUNCH: dict[str, tuple[CollKind, int, bool, bool, tuple[str, ...]]] = {
    "c10d::allreduce_": (CollKind.ALL_REDUCE, 0, True, False, ("gloo:all_reduce",)),
    "c10d::allreduce_coalesced_": (CollKind.ALL_REDUCE, 0, True, False, ("gloo:all_reduce",)),
    "c10d::broadcast_": (CollKind.BROADCAST, 0, True, False, ("gloo:broadcast",)),
    "c10d::allgather_": (CollKind.ALL_GATHER, 1, True, True, ("gloo:all_gather",)),
    "c10d::_allgather_base_": (CollKind.ALL_GATHER, 0, False, False, ("gloo:all_gather",)),
    "c10d::allgather_into_tensor_coalesced_": (CollKind.ALL_GATHER, 0, True, False, ("gloo:all_gather",)),
    "c10d::_reduce_scatter_base_": (CollKind.REDUCE_SCATTER, 1, False, False,
                                    ("gloo:all_reduce", "gloo:reduce_scatter")),
    "c10d::reduce_scatter_": (CollKind.REDUCE_SCATTER, 1, True, False,
                              ("gloo:all_reduce", "gloo:reduce_scatter")),
    "c10d::alltoall_base_": (CollKind.ALL_TO_ALL, 1, False, False, ("gloo:all_to_all",)),
    "c10d::alltoall_": (CollKind.ALL_TO_ALL, 1, True, False, ("gloo:all_to_all",)),
    "c10d::barrier": (CollKind.BARRIER, -1, False, False, ("gloo:barrier",)),
    "c10d::send": (CollKind.SEND, 0, True, False, ("gloo:send",)),
    "c10d::recv_": (CollKind.RECV, 0, True, False, ("gloo:recv",)),
    "c10d::recv_any_source_": (CollKind.RECV, 0, True, False, ("gloo:recv",)),
}
_UNSUPPORTED = ("c10d::reduce_", "c10d::gather_", "c10d::scatter_", "c10d::allgather_coalesced_")

# Dtype spellings: record_param_comms' "dtype" and gloo's "Input type".
_DTYPES: dict[str, Dtype] = {
    "Float": Dtype.FLOAT32, "float": Dtype.FLOAT32, "Half": Dtype.FLOAT16, "c10::Half": Dtype.FLOAT16,
    "BFloat16": Dtype.BFLOAT16, "c10::BFloat16": Dtype.BFLOAT16, "Double": Dtype.FLOAT64,
    "double": Dtype.FLOAT64, "Long": Dtype.INT64, "long int": Dtype.INT64, "long": Dtype.INT64,
    "Int": Dtype.INT32, "int": Dtype.INT32, "Short": Dtype.INT16, "short int": Dtype.INT16,
    "Char": Dtype.INT8, "signed char": Dtype.INT8, "Byte": Dtype.UINT8, "unsigned char": Dtype.UINT8,
    "Bool": Dtype.BOOL, "bool": Dtype.BOOL,
}


def _dtype(kt: KinetoTrace, spelled: Any, what: str) -> Dtype:
    try:
        return _DTYPES[str(spelled)]
    except KeyError:
        raise KinetoError(f"{kt.path}: {what} has dtype {spelled!r}, which emu does not know; "
                          f"known: {', '.join(sorted(set(_DTYPES)))}") from None


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if isinstance(value, str) and value.startswith("["):
        inner = value.strip("[]").strip()
        return tuple(int(v) for v in inner.split(",")) if inner else ()
    return None


def _group(kt: KinetoTrace, ranks: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """None for the whole job (the trace format's default), else the sub-group."""
    if not ranks or tuple(sorted(ranks)) == tuple(range(kt.world_size)):
        return None
    return tuple(sorted(ranks))


def nccl_collectives(kt: KinetoTrace, comms: Sequence[Event]) -> tuple[list[CollEvent], list[WaitEvent]]:
    """Collectives and waits from record_param_comms events."""
    kernels = {e.args.get("External id"): e for e in kt.events
               if e.cat == "kernel" and e.name.lower().startswith("nccl")}
    colls, waits = [], []
    for ev in comms:
        name = str(ev.args.get("Collective name", ""))
        if name == "wait":
            waits.append(WaitEvent(ts_us=ev.ts_us, tid=ev.tid))
            continue
        if name in _NCCL_IGNORED:
            continue
        if name not in _NCCL_NAMES:
            raise KinetoError(f"{kt.path}: record_param_comms at ts {ev.ts_us:.0f} is a {name!r}, "
                              "which emu trace v1 cannot express (supported: "
                              f"{', '.join(sorted({k.value for k, _ in _NCCL_NAMES.values()}))})")
        kind, count_key = _NCCL_NAMES[name]
        if kind != CollKind.BARRIER and "In msg nelems" not in ev.args:
            raise KinetoError(
                f"{kt.path}: record_param_comms events carry no 'In msg nelems': this PyTorch "
                "(older than 2.0) did not record collective sizes, and emu will not invent them; "
                "re-record the trace with PyTorch 2.1 or newer")
        count = int(ev.args.get(count_key, 0)) if count_key else 0
        group = _parse_ranks(ev.args.get("Process Group Ranks"))
        group_size = int(ev.args.get("Group size") or (len(group) if group else kt.world_size))
        kernel = kernels.get(ev.args.get("External id"))
        colls.append(CollEvent(
            kind=kind, dtype=_dtype(kt, ev.args.get("dtype", "Byte"), f"the {name} at ts {ev.ts_us:.0f}"),
            count=count, group_size=group_size, group=_group(kt, group), issue_us=ev.ts_us,
            launch_end_us=ev.end_us, done_us=kernel.end_us if kernel else None, tid=ev.tid,
            blocking=False, async_op=None))
    return colls, waits


def _numel(dims: Any, is_list: bool) -> int:
    """Elements of one Input Dims entry: a shape, or a list of shapes."""
    if not isinstance(dims, list):
        return 0
    shapes = dims if is_list else [dims]
    return sum(math.prod(s) for s in shapes if isinstance(s, list))


def _concrete_int(ev: Event, index: int) -> int | None:
    values = ev.args.get("Concrete Inputs") or []
    try:
        return int(values[index])
    except (IndexError, ValueError, TypeError):
        return None


def _async_flag(ev: Event) -> bool | None:
    # The c10d ops end with (..., bool asyncOp, int timeout) where they take the flag.
    values = ev.args.get("Concrete Inputs") or []
    if len(values) >= 2 and values[-2] in ("True", "False"):
        return values[-2] == "True"
    return None


def gloo_collectives(kt: KinetoTrace) -> list[CollEvent]:
    """Collectives from c10d launch events matched to gloo execution events."""
    launches = [e for e in kt.events if e.name in _GLOO_LAUNCH]
    bad = next((e for e in kt.events if e.name in _UNSUPPORTED), None)
    if bad is not None:
        raise KinetoError(f"{kt.path}: {bad.name} at ts {bad.ts_us:.0f} is a collective emu trace v1 "
                          "cannot express (all_reduce, all_gather, reduce_scatter, broadcast, "
                          "all_to_all, send, recv and barrier are)")
    if launches and all("Input Dims" not in e.args for e in launches):
        raise KinetoError(f"{kt.path}: the collectives carry no 'Input Dims': the profiler ran "
                          "without record_shapes=True, so their sizes are unknown and emu will not "
                          "invent them; re-record with torch.profiler.profile(record_shapes=True)")
    executions = [e for e in kt.events if e.name.startswith("gloo:")]
    used = [False] * len(executions)
    colls = []
    for ev in launches:
        kind, index, is_list, times_group, exec_names = _GLOO_LAUNCH[ev.name]
        dims = ev.args.get("Input Dims") or []
        count = _numel(dims[index], is_list) if 0 <= index < len(dims) else 0
        group_size = kt.world_size
        if times_group:
            count *= group_size
        match = None
        for k, ex in enumerate(executions):
            if used[k] or ex.name not in exec_names or ex.end_us < ev.ts_us:
                continue
            ex_dims = ex.args.get("Input Dims") or []
            ex_count = _numel(ex_dims[0], False) if ex_dims else 0
            # gloo's all_gather execution records its input: one rank's shard.
            expected = count // group_size if kind == CollKind.ALL_GATHER else count
            if kind == CollKind.BARRIER or ex_count == expected:
                match = k
                break
        if match is None:
            raise KinetoError(f"{kt.path}: {ev.name} at ts {ev.ts_us:.0f} has no matching gloo "
                              "execution event; was the profiling window cut mid-collective?")
        used[match] = True
        ex = executions[match]
        types = ex.args.get("Input type") or []
        dtype = Dtype.UINT8 if kind == CollKind.BARRIER else _dtype(
            kt, types[0] if types else None, f"{ex.name} at ts {ex.ts_us:.0f}")
        colls.append(CollEvent(
            kind=kind, dtype=dtype, count=count, group_size=group_size, group=None,
            issue_us=ev.ts_us, launch_end_us=ev.end_us, done_us=max(ex.end_us, ev.ts_us), tid=ev.tid,
            blocking=ex.tid == ev.tid, async_op=_async_flag(ev),
            root=_concrete_int(ev, 2) if kind == CollKind.BROADCAST else None,
            peer=_concrete_int(ev, 2) if kind in (CollKind.SEND, CollKind.RECV) else None))
    return colls


def find_collectives(kt: KinetoTrace) -> tuple[list[CollEvent], list[WaitEvent]]:
    """Every collective (in issue order) and explicit wait of one rank's trace."""
    comms = [e for e in kt.events if e.name == "record_param_comms"]
    if comms:
        colls, waits = nccl_collectives(kt, comms)
    else:
        colls, waits = gloo_collectives(kt), []
    colls.sort(key=lambda c: c.issue_us)
    return colls, waits
