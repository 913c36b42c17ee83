"""Finding the collectives of a Kineto trace: what was issued, when, how big, when done.

Two sources, by what the profiler recorded:

- NCCL (and any backend that emits them): ``record_param_comms`` events carry the
  collective's name, element counts, dtype and group; the GPU kernel with the same
  ``External id`` gives the completion. ``Collective name`` "wait" marks a wait.
- gloo (CPU): no ``record_param_comms``. The launch is a ``c10d::<op>`` event on the
  issuing thread with ``Input Dims`` (needs ``record_shapes=True``) and
  ``Concrete Inputs`` (root, peer, async flag); the execution is a ``gloo:<op>``
  event on a gloo thread, matched in FIFO order and by element count, which also
  gives the dtype and the completion. An all_reduce of a sparse COO tensor (its launch's
  ``Input Strides`` are empty) runs as ``gloo:sparse_all_reduce``: its rows are read from
  the aten events inside it (``sparse_rows``).

Names and argument keys are data in the tables below, not code in the parsers,
so a PyTorch release that renames an event changes one table row.

Capture never invents: a size, dtype or group the profiler did not record is
refused with the file, rank, step and event named (and how to re-record), never
filled with a default. Only completion times may be missing (an NCCL kernel cut
off by the profiling window, or no GPU activity recorded): ``done_us`` is then
None and the import records the gap (``emu.capture.merge``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emu.capture.groups import Attributor
from emu.capture.kineto import Event, KinetoTrace
from emu.errors import KinetoError
from emu.traces.model import DTYPE_SPELLINGS, CollKind, Dtype, GroupRole, Splits


@dataclass(frozen=True)
class SparseRows:
    """An all_reduce of a sparse COO tensor as gloo ran it: the dense tensor's rows and the
    elements of one row, the rows each rank contributed (rank order), and the summed result's."""

    rows: int
    row_elements: int
    nnz: tuple[int, ...]
    union: int


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
    sparse: SparseRows | None = None  # an all_reduce of a sparse tensor (gloo)
    group_name: str | None = None  # the process group's name, where the trace says
    stream_key: int | str | None = None  # the GPU stream its kernel ran on (NCCL)
    role: GroupRole | None = None  # its group's dimension of the job's mesh (emu.capture.groups)
    stream: int | None = None  # the rank's stream it ran on, where the rank has several
    splits: Splits | None = None  # an uneven all_to_all's elements per peer


@dataclass(frozen=True)
class WaitEvent:
    """An explicit wait: NCCL's record_param_comms "wait", or a functional collective's
    ``wait_tensor`` (which names the tensor's size, and blocks the thread until ``end_us``)."""

    ts_us: float
    tid: int | str
    end_us: float | None = None
    count: int | None = None


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

def _dtype(kt: KinetoTrace, ev: Event, spelled: Any, key: str) -> Dtype:
    try:
        return DTYPE_SPELLINGS[str(spelled)]
    except KeyError:
        raise KinetoError(f"{kt.where(ev)}: argument {key!r} is {str(spelled)[:40]!r}, a dtype emu does not "
                          f"know; known: {', '.join(sorted(set(DTYPE_SPELLINGS)))}") from None


def _count(kt: KinetoTrace, ev: Event, key: str) -> int:
    """A recorded element count: an integer >= 0, or the import is refused."""
    value = ev.args.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        what = "is missing" if value is None else f"is {str(value)[:40]!r}, not an element count"
        raise KinetoError(f"{kt.where(ev)}: argument {key!r} {what}: the collective's size is unknown, "
                          "and emu will not invent it; re-record the trace with PyTorch 2.1 or newer")
    return value


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Process Group Ranks (a list, or its text); ValueError when it is neither."""
    if isinstance(value, str) and value.startswith("["):
        inner = value.strip("[]").strip()
        value = [int(v) for v in inner.split(",")] if inner else []
    if isinstance(value, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise ValueError(value)
        return tuple(value)
    if value is None:
        return None
    raise ValueError(value)


def _group_size(kt: KinetoTrace, ev: Event) -> tuple[int, tuple[int, ...] | None]:
    """(group size, the group's ranks where known) of a record_param_comms event: its own
    'Process Group Ranks', else those of the group its 'Process Group Name' names in the trace's
    distributedInfo. A sub-group whose ranks are neither is refused where the rank belongs to
    several groups of that size (emu cannot tell which one it was)."""
    try:
        group = _parse_ranks(ev.args.get("Process Group Ranks"))
    except ValueError:
        raise KinetoError(f"{kt.where(ev)}: argument 'Process Group Ranks' is "
                          f"{str(ev.args.get('Process Group Ranks'))[:40]!r}, not a list of ranks; the "
                          "file is corrupted") from None
    table = kt.group_table()
    name = ev.args.get("Process Group Name")
    if not group and name is not None and str(name) in table:
        group = table[str(name)].ranks
    size = ev.args.get("Group size")
    if size is None:
        if not group:
            raise KinetoError(f"{kt.where(ev)}: neither 'Group size' nor 'Process Group Ranks' is "
                              "recorded: the collective's group is unknown, and emu will not assume "
                              "the whole job; re-record the trace with PyTorch 2.1 or newer")
        return len(group), group
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= kt.world_size:
        raise KinetoError(f"{kt.where(ev)}: argument 'Group size' is {str(size)[:40]!r}, not a group size "
                          f"in 1..{kt.world_size} (the world size); the file is corrupted")
    if not group and size < kt.world_size:
        mine = [g for g in table.values() if len(g.ranks) == size and kt.rank in g.ranks]
        if len(mine) != 1:
            raise KinetoError(f"{kt.where(ev)}: a collective of a group of {size} ranks, and the trace says "
                              f"neither its ranks nor a group name it lists ({len(mine)} groups of that size hold "
                              "this rank): emu cannot tell the groups apart; record with PyTorch 2.1 or newer, "
                              "whose record_param_comms names the group")
        group = mine[0].ranks
    return size, group


def _group(kt: KinetoTrace, ranks: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """None for the whole job (the trace format's default), else the sub-group."""
    if not ranks or tuple(sorted(ranks)) == tuple(range(kt.world_size)):
        return None
    return tuple(sorted(ranks))


def nccl_collectives(kt: KinetoTrace, comms: Sequence[Event]) -> tuple[list[CollEvent], list[WaitEvent]]:
    """Collectives and waits from record_param_comms events."""
    # a kernel without an External id matches nothing (None would match every such launch)
    kernels = {e.args["External id"]: e for e in kt.events
               if e.cat == "kernel" and e.name.lower().startswith("nccl")
               and isinstance(e.args.get("External id"), (int, str))}
    colls, waits = [], []
    for ev in comms:
        name = str(ev.args.get("Collective name", ""))
        if name == "wait":
            waits.append(WaitEvent(ts_us=ev.ts_us, tid=ev.tid))
            continue
        if name in _NCCL_IGNORED:
            continue
        if name not in _NCCL_NAMES:
            raise KinetoError(f"{kt.where(ev)}: argument 'Collective name' is {name[:40]!r}, a collective "
                              "which emu trace v1 cannot express (supported: "
                              f"{', '.join(sorted({k.value for k, _ in _NCCL_NAMES.values()}))})")
        kind, count_key = _NCCL_NAMES[name]
        if kind != CollKind.BARRIER and "In msg nelems" not in ev.args:
            raise KinetoError(
                f"{kt.where(ev)}: record_param_comms events carry no 'In msg nelems': this PyTorch "
                "(older than 2.0) did not record collective sizes, and emu will not invent them; "
                "re-record the trace with PyTorch 2.1 or newer")
        count = _count(kt, ev, count_key) if count_key else 0
        if kind == CollKind.BARRIER:
            dtype = Dtype.UINT8  # moves no data: its dtype sizes nothing
        elif "dtype" not in ev.args:
            raise KinetoError(
                f"{kt.where(ev)}: argument 'dtype' is missing: the {name}'s element type, and so its "
                "bytes, are unknown, and emu will not guess them (read as bytes, float32 would be 4x "
                "too small); re-record the trace with PyTorch 2.1 or newer")
        else:
            dtype = _dtype(kt, ev, ev.args["dtype"], "dtype")
        group_size, group = _group_size(kt, ev)
        ext = ev.args.get("External id")
        kernel = kernels.get(ext) if isinstance(ext, (int, str)) else None
        name = ev.args.get("Process Group Name")
        splits = None
        if kind == CollKind.ALL_TO_ALL and ("In split size" in ev.args or "Out split size" in ev.args):
            splits = all_to_all_splits(kt, ev, ev.args.get("In split size", "[]"), ev.args.get("Out split size", "[]"),
                                       count, _count(kt, ev, "Out msg nelems") if "Out msg nelems" in ev.args
                                       else count, group_size)
        colls.append(CollEvent(
            kind=kind, dtype=dtype,
            count=count, group_size=group_size, group=_group(kt, group), issue_us=ev.ts_us,
            launch_end_us=ev.end_us, done_us=kernel.end_us if kernel else None, tid=ev.tid,
            blocking=False, async_op=None, group_name=None if name is None else str(name),
            stream_key=kernel.tid if kernel else None, splits=splits))
    return colls, waits


def _split_rows(value: Any) -> list[int] | None:
    """A recorded split-size list ("[3, 5]", or a list): its sizes; [] where it is empty (even)."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")) or len(text) > 100_000:
            return None
        try:
            value = [int(v) for v in text[1:-1].split(",") if v.strip()]
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    return None


def all_to_all_splits(kt: KinetoTrace, ev: Event, send: Any, recv: Any, sent: int, received: int,
                      group_size: int) -> Splits | None:
    """An all_to_all's elements per peer from its recorded split sizes (rows of dimension 0, as
    ``all_to_all_single`` takes them; an empty list splits evenly), ``sent`` and ``received`` its
    input's and output's elements; None where both are even."""
    sides = []
    for name, value, total in (("input", send, sent), ("output", recv, received)):
        rows = _split_rows(value)
        if rows is None:
            raise KinetoError(f"{kt.where(ev)}: the all_to_all's {name} split sizes are {str(value)[:60]!r}, not a "
                              "list of sizes; re-record the trace, or report the PyTorch version that wrote it")
        if not rows:
            rows = [1] * group_size if total % max(1, group_size) == 0 else []
        if len(rows) != group_size or (sum(rows) and total % sum(rows)):
            raise KinetoError(f"{kt.where(ev)}: the all_to_all's {name} split sizes {str(value)[:60]} do not split "
                              f"its {total} elements over its {group_size} ranks")
        per_row = total // sum(rows) if sum(rows) else 0
        sides.append(tuple(r * per_row for r in rows))
    if len(set(sides[0] + sides[1])) <= 1:
        return None
    return Splits(send_elements=sides[0], recv_elements=sides[1])


def _numel(dims: Any, is_list: bool) -> int | None:
    """Elements of one Input Dims entry (a shape, or a list of shapes); None if it is neither.

    kineto.py checked that Input Dims nest sizes >= 0 at most three deep; what is
    left is whether this entry is the kind of thing the launch takes.
    """
    if not isinstance(dims, list):
        return None
    shapes = dims if is_list else [dims]
    if not all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in shapes):
        return None
    return sum(math.prod(s) for s in shapes)


def _concrete_int(ev: Event, index: int) -> int | None:
    values = ev.args.get("Concrete Inputs")
    if not isinstance(values, list):
        return None
    try:
        value = values[index]
        # a rank: a short decimal string (a long one is not a rank, and int() of it is slow)
        return int(value) if isinstance(value, (int, str)) and len(str(value)) <= 12 else None
    except (IndexError, ValueError, TypeError):
        return None


def _async_flag(ev: Event) -> bool | None:
    # The c10d ops end with (..., bool asyncOp, int timeout) where they take the flag.
    values = ev.args.get("Concrete Inputs")
    if isinstance(values, list) and len(values) >= 2 and values[-2] in ("True", "False"):
        return values[-2] == "True"
    return None


_SPARSE_EXECUTION = "gloo:sparse_all_reduce"


def _is_sparse_launch(ev: Event) -> bool:
    """A sparse tensor has no strides: the profiler records ``[]`` where a dense one has ``[16, 1]``;
    so does a dense scalar (0-dim), whose shape is empty too, so a sparse one needs a shape."""
    strides, dims = ev.args.get("Input Strides"), ev.args.get("Input Dims")
    return (ev.name == "c10d::allreduce_" and isinstance(strides, list) and bool(strides)
            and strides[0] == [[]] and isinstance(dims, list) and bool(dims) and isinstance(dims[0], list)
            and len(dims[0]) == 1 and isinstance(dims[0][0], list) and len(dims[0][0]) > 0)


def sparse_rows(kt: KinetoTrace, ex: Event, count: int, ranks: int) -> SparseRows:
    """The rows of a ``gloo:sparse_all_reduce`` from the aten events gloo ran inside it: one
    ``aten::sparse_coo_tensor`` per rank (rank order) of indices ``[sparse_dim, nnz]`` and values
    ``[nnz, *row]`` built from what it gathered, and, last, the coalesce of their sum, whose final
    ``aten::narrow`` of the indices keeps the result's distinct rows; ``ranks``: the group's."""
    inside = [e for e in kt.events if e.tid == ex.tid and ex.ts_us <= e.ts_us <= ex.end_us]
    nnz, row = [], None
    for e in inside:
        dims = e.args.get("Input Dims")
        if e.name == "aten::sparse_coo_tensor" and isinstance(dims, list) and len(dims) >= 2 \
                and _numel(dims[0], False) is not None and _numel(dims[1], False) is not None and dims[1]:
            nnz.append(int(dims[1][0]))
            row = math.prod(dims[1][1:])
    union = None
    for e in inside:
        dims, values = e.args.get("Input Dims"), e.args.get("Concrete Inputs")
        if (e.name == "aten::narrow" and isinstance(dims, list) and dims and isinstance(dims[0], list)
                and len(dims[0]) == 2 and isinstance(values, list) and len(values) == 4 and values[1] == "1"
                and str(values[3]).isdigit()):
            union = int(values[3])
    if union is None and nnz and sum(nnz) < 2:  # a sum of one row or none: gloo's coalesce narrows nothing
        union = sum(nnz)
    if len(nnz) != ranks or not row or count % row or union is None:
        raise KinetoError(f"{kt.where(ex)}: an all_reduce of a sparse tensor whose rows the trace does not "
                          f"show ({len(nnz)} of {ranks} ranks' 'aten::sparse_coo_tensor' events with "
                          "shapes, and the result's coalesce); emu will not invent them: re-record with "
                          "torch.profiler.profile(record_shapes=True)")
    return SparseRows(rows=count // row, row_elements=row, nnz=tuple(nnz), union=max(union, *nnz))


def _attributor(kt: KinetoTrace) -> Attributor | None:
    """What names each launch's group (and a send's or recv's peer and whether it blocked): emu's
    record, where the capture wrote one. Without sub-groups every collective spans the job and the
    record is only asked about point-to-point calls; with sub-groups and no record the trace is
    refused."""
    table = kt.group_table()
    whole = tuple(range(kt.world_size))
    subgroups = any(tuple(sorted(g.ranks)) != whole for g in table.values())
    if kt.comms is not None and (subgroups or kt.comms.error is None):
        return Attributor(kt.comms, table, kt.base_time_ns, kt.path, strict=subgroups)
    if subgroups:
        subs = sorted({len(g.ranks) for g in table.values() if tuple(sorted(g.ranks)) != whole})
        raise KinetoError(f"{kt.path}: rank {kt.rank} belongs to process groups of {subs} ranks besides the "
                          "whole job, and gloo's events do not say which group each collective ran on; emu "
                          "will not read them all as the whole job's: capture the script with 'emu capture -- "
                          "python SCRIPT', which records each call's group (rank<R>.comms.json beside the "
                          "Kineto file)")
    return None


def gloo_collectives(kt: KinetoTrace) -> list[CollEvent]:
    """Collectives from c10d launch events matched to gloo execution events; with sub-groups, each
    launch's group (and a point-to-point call's global peer) from emu's record (``emu.capture.groups``).

    A group's executions run on gloo threads of its own, so an execution on a thread that another
    group's collectives ran on is not this launch's (two groups' collectives of one size in flight
    at once would otherwise be matched crosswise). Point-to-point executions run on the caller's
    thread."""
    launches = [e for e in kt.events if e.name in _GLOO_LAUNCH]
    _check_gloo(kt, launches)
    attributor = _attributor(kt)
    executions = _Executions([e for e in kt.events if e.name.startswith("gloo:")])
    colls = []
    for ev in launches:
        kind, index, is_list, times_group, exec_names = _GLOO_LAUNCH[ev.name]
        p2p = kind in (CollKind.SEND, CollKind.RECV)
        count = 0 if kind == CollKind.BARRIER else _launch_count(kt, ev, index, is_list)
        att = attributor.launch(kind, ev.ts_us, ev.end_us, kt.where(ev)) if attributor is not None else None
        if att is not None and not attributor.strict and not p2p:
            att = None  # one group: the whole job's, as the trace format's default
        group_size = len(att.ranks) if att is not None else kt.world_size
        if times_group:
            count *= group_size
        if _is_sparse_launch(ev):
            exec_names = (_SPARSE_EXECUTION,)
        elif ev.name == "c10d::allreduce_":  # strides not recorded: the execution says which it was
            exec_names = (*exec_names, _SPARSE_EXECUTION)
        # gloo's all_gather execution records its input: one rank's shard
        expected = count // group_size if kind == CollKind.ALL_GATHER else count
        ex = executions.take(ev, exec_names, None if kind == CollKind.BARRIER else expected,
                             att.group if att is not None and not p2p else None)
        if ex is None:
            raise KinetoError(f"{kt.where(ev)}: has no matching gloo "
                              "execution event; was the profiling window cut mid-collective?")
        colls.append(_gloo_event(kt, ev, ex, kind, count, group_size, att,
                                 attributor is not None and attributor.strict))
    return colls


def _check_gloo(kt: KinetoTrace, launches: list) -> None:
    bad = next((e for e in kt.events if e.name in _UNSUPPORTED), None)
    if bad is not None:
        raise KinetoError(f"{kt.where(bad)}: is a collective emu trace v1 "
                          "cannot express (all_reduce, all_gather, reduce_scatter, broadcast, "
                          "all_to_all, send, recv and barrier are)")
    if launches and all("Input Dims" not in e.args for e in launches):
        raise KinetoError(f"{kt.path}: the collectives carry no 'Input Dims': the profiler ran "
                          "without record_shapes=True, so their sizes are unknown and emu will not "
                          "invent them; re-record with torch.profiler.profile(record_shapes=True)")


def _launch_count(kt: KinetoTrace, ev, index: int, is_list: bool) -> int:
    """The elements of a launch's tensor(s), from its recorded input dimensions."""
    dims = ev.args.get("Input Dims")
    numel = _numel(dims[index], is_list) if isinstance(dims, list) and index < len(dims) else None
    if numel is None:
        what = "is missing" if dims is None else (
            f"is {str(dims)[:60]!r}, which does not hold the collective's "
            f"tensor{'s' if is_list else ''} at position {index}")
        raise KinetoError(f"{kt.where(ev)}: argument 'Input Dims' {what}: its size is unknown, and emu "
                          "will not invent it; re-record with torch.profiler.profile(record_shapes=True)")
    return numel


class _Executions:
    """gloo's execution events, each matched to one launch, in order; a group's on its own threads."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.used = [False] * len(events)
        self.thread_group: dict[int | str, str] = {}

    def take(self, ev, names: tuple[str, ...], count: int | None, group: str | None):
        """The first unused execution of ``names`` that ends after the launch began, with ``count``
        elements (None: any, a barrier's), on a thread no other group's collectives ran on."""
        for k, ex in enumerate(self.events):
            if self.used[k] or ex.name not in names or ex.end_us < ev.ts_us:
                continue
            if group is not None and self.thread_group.get(ex.tid, group) != group:
                continue
            ex_dims = ex.args.get("Input Dims")
            ex_count = _numel(ex_dims[0], False) if isinstance(ex_dims, list) and ex_dims else None
            if count is None or ex_count == count:
                self.used[k] = True
                if group is not None:
                    self.thread_group.setdefault(ex.tid, group)
                return ex
        return None


def _gloo_event(kt: KinetoTrace, ev, ex, kind: CollKind, count: int, group_size: int, att, strict: bool) -> CollEvent:
    """One launch matched to its execution: the collective's dtype, sparsity, root and peer."""
    p2p = kind in (CollKind.SEND, CollKind.RECV)
    types = ex.args.get("Input type")
    if kind == CollKind.BARRIER:
        dtype = Dtype.UINT8
    elif not isinstance(types, list) or not types:
        raise KinetoError(f"{kt.where(ex)}: argument 'Input type' is missing: the element type, and "
                          f"so the bytes, of the {ev.name} are unknown, and emu will not guess them; "
                          "re-record with torch.profiler.profile(record_shapes=True)")
    else:
        dtype = _dtype(kt, ex, types[0], "Input type")
    rows = sparse_rows(kt, ex, count, group_size) if ex.name == _SPARSE_EXECUTION else None
    # the launch's root is a rank of its group; the trace's are the job's
    root = _concrete_int(ev, 2) if kind == CollKind.BROADCAST else None
    if root is not None and att is not None and root < len(att.ranks):
        root = att.ranks[root]
    peer = (att.peer if att is not None else _concrete_int(ev, 2)) if p2p else None
    blocking = att.blocking if att is not None and att.blocking is not None else ex.tid == ev.tid
    splits = None
    if ev.name == "c10d::alltoall_base_":  # (output, input, group, output splits, input splits, ...)
        values, dims = ev.args.get("Concrete Inputs"), ev.args.get("Input Dims")
        if isinstance(values, list) and len(values) > 4 and isinstance(dims, list) and dims:
            splits = all_to_all_splits(kt, ev, values[4], values[3], count, _numel(dims[0], False) or 0, group_size)
    return CollEvent(
        kind=kind, dtype=dtype, count=count, group_size=group_size,
        group=_group(kt, att.ranks) if att is not None else None,
        issue_us=ev.ts_us, launch_end_us=ev.end_us, done_us=max(ex.end_us, ev.ts_us), tid=ev.tid,
        blocking=blocking, async_op=_async_flag(ev) if not p2p or att is None else not blocking,
        # a job of one group: its sends and receives on its one stream, as every collective of it
        root=root, peer=peer, sparse=rows, group_name=att.group if att is not None and strict else None,
        splits=splits)


_WAIT_TENSOR = "_c10d_functional::wait_tensor"


def tensor_waits(kt: KinetoTrace) -> list[WaitEvent]:
    """Functional collectives' waits (``_c10d_functional::wait_tensor``, which DTensor's tensor
    parallelism issues after each collective): the outermost of nested ones, with the size of the
    tensor waited on and when the wait returned."""
    out: list[WaitEvent] = []
    open_until: dict[int | str, float] = {}
    for ev in kt.events:
        if ev.name != _WAIT_TENSOR:
            continue
        if ev.ts_us < open_until.get(ev.tid, -math.inf):
            continue  # inside the wait it belongs to
        open_until[ev.tid] = ev.end_us
        dims = ev.args.get("Input Dims")
        count = _numel(dims[0], False) if isinstance(dims, list) and dims else None
        out.append(WaitEvent(ts_us=ev.ts_us, tid=ev.tid, end_us=ev.end_us, count=count))
    return out


def find_collectives(kt: KinetoTrace) -> tuple[list[CollEvent], list[WaitEvent]]:
    """Every collective (in issue order) and explicit wait of one rank's trace."""
    comms = [e for e in kt.events if e.name == "record_param_comms"]
    if comms:
        colls, waits = nccl_collectives(kt, comms)
    else:
        colls, waits = gloo_collectives(kt), []
    colls.sort(key=lambda c: c.issue_us)
    waits = sorted(waits + tensor_waits(kt), key=lambda w: w.ts_us)
    return colls, waits
