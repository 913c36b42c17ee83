"""One rank's Chakra nodes as emu's program: the walk ``emu.traces.chakra.read`` describes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from emu.errors import TraceError
from emu.traces.chakra import attrs as emu_attrs
from emu.traces.chakra.read import KINDS, EtFile, attr_value, dtype_of, walk
from emu.traces.chakra.schema import NAMES, NodeType
from emu.traces.model import Coll, CollKind, Compute, Dtype, Iteration, Op, Wait

_INTEGERS = ("int64_val", "int32_val", "uint64_val", "uint32_val", "sint64_val", "sint32_val", "fixed64_val",
             "fixed32_val", "sfixed64_val", "sfixed32_val")


def _int_attr(node: Any, name: str) -> int | None:
    """An integer attribute in whichever integer member it was written (Chakra's writers differ:
    comm_size is int64_val in its generator, uint64_val in older traces)."""
    for a in node.attr:
        if a.name == name and a.WhichOneof("value") in _INTEGERS:
            return int(attr_value(a))
    return None


@dataclass
class Program:
    """The walk over one file; ``iterations()`` gives the program, ``gaps`` what it left out."""

    f: EtFile
    rank: int
    world: int
    groups: dict[str, tuple[int, ...]]
    gaps: list[str] = field(default_factory=list)
    next_id: int = 0  # the next collective's id where the node carries no emu.op (after every emu.op's)
    everyone: tuple[int, ...] = ()  # the whole job's ranks
    streams: dict[int, int] = field(default_factory=dict)  # a stream attribute's value -> emu's stream

    def iterations(self) -> tuple[Iteration, ...]:
        nodes = self.f.nodes
        if len({n.id for n in nodes}) != len(nodes):
            raise TraceError(f"{self.f.path}: two nodes share an id; Chakra's node ids are unique in a file")
        try:
            order = walk(nodes)
        except TraceError as exc:
            raise TraceError(f"{self.f.path}: {exc}") from None
        records = emu_attrs.iterations(self.f.attrs, str(self.f.path))
        self.next_id = _after_exact_ids(nodes)
        self.everyone = tuple(range(self.world))
        ops: dict[int, list[Op]] = {}
        skipped: Counter[str] = Counter()
        issued: dict[int, int] = {}  # node id -> emu collective id, while not waited for
        below: dict[int, frozenset[int]] = {}  # node id -> collectives it depends on through host nodes
        emitted: set[int] = set()
        for node in order:
            deps = frozenset().union(*(({d} if d in issued or d in emitted else below.get(d, frozenset()))
                                       for d in node.data_deps)) if node.data_deps else frozenset()
            op = self._op(node, skipped)
            if op is None:
                below[node.id] = frozenset(d for d in deps if d in issued)
                continue
            where = f"{self.f.path}: node {node.id}"
            index = _int_attr(node, emu_attrs.ITERATION) or 0
            if not 0 <= index <= (len(records) - 1 if records is not None else 0):
                raise TraceError(f"{where}: attribute {emu_attrs.ITERATION!r} is {index}, not an iteration of the "
                                 "file's emu.iterations")
            program = ops.setdefault(index, [])
            explicit = next((attr_value(a) for a in node.attr if a.name == emu_attrs.WAITS), None)
            if explicit is not None or records is not None:  # emu's own waits, exactly
                waits = emu_attrs.waits(explicit, where) if explicit is not None else ()
            else:
                wanted = sorted(issued[d] for d in deps if d in issued)
                waits = (Wait(ids=tuple(wanted)),) if wanted else ()
            program.extend(waits)
            done = {i for w in waits for i in w.ids}
            issued = {d: i for d, i in issued.items() if i not in done}
            program.append(op)
            if isinstance(op, Coll):
                issued[node.id] = op.id
            emitted.add(node.id)
        self._say(skipped)
        return self._finish(ops, records)

    def _finish(self, ops: dict[int, list[Op]], records: list[dict[str, Any]] | None) -> tuple[Iteration, ...]:
        if not ops:
            raise TraceError(f"{self.f.path}: no compute or collective node emu can replay "
                             f"({', '.join(self.gaps) or 'no nodes'})")
        out = []
        for index in sorted(ops):
            program = ops[index]
            if records is not None and index < len(records):
                program.extend(records[index]["waits"])
                out.append(Iteration(step=int(records[index]["step"]), measured_us=float(records[index]["measured_us"]),
                                     ops=tuple(program)))
                continue
            waited = {i for op in program if isinstance(op, Wait) for i in op.ids}
            open_ids = tuple(op.id for op in program if isinstance(op, Coll) and op.id not in waited)
            if open_ids:
                program.append(Wait(ids=open_ids))
            out.append(Iteration(step=index, measured_us=timeline_us(program), ops=tuple(program)))
        if records is None:
            self._note("iteration time: Chakra records none; emu takes the program's own timeline from "
                       "the nodes' durations (compute in order, each collective for its observed time)")
        return tuple(out)

    def _op(self, node: Any, skipped: Counter[str]) -> Compute | Coll | None:
        """The emu op of a node, or None (counted in ``skipped`` by what it is)."""
        cpu = any(a.name == "is_cpu_op" and attr_value(a) is True for a in node.attr)
        if node.type == NodeType.COMP:
            if cpu:
                skipped["host operator nodes (their device work is the compute)"] += 1
                return None
            exact = next((attr_value(a) for a in node.attr if a.name == emu_attrs.DUR_US), None)
            return Compute(name=node.name or "compute",
                           dur_us=float(exact) if isinstance(exact, float) else float(node.duration_micros))
        if node.type in (NodeType.COMM_COLL, NodeType.COMM_SEND, NodeType.COMM_RECV):
            if cpu and _int_attr(node, "comm_type") is None and node.type == NodeType.COMM_COLL:
                skipped["host collective calls (the device's collective node is the one replayed)"] += 1
                return None
            return self._coll(node, skipped)
        if node.type == NodeType.METADATA:
            return None
        skipped[f"{'memory load/store' if node.type in (NodeType.MEM_LOAD, NodeType.MEM_STORE) else f'type {node.type}'}"
                " nodes (emu has no memory or such node)"] += 1
        return None

    def _coll(self, node: Any, skipped: Counter[str]) -> Coll | None:
        where = f"{self.f.path}: node {node.id}"
        exact = next((attr_value(a) for a in node.attr if a.name == emu_attrs.OP), None)
        if exact is not None:
            return emu_attrs.coll(exact, where)
        if node.type == NodeType.COMM_COLL:
            kind_value = _int_attr(node, "comm_type")
            if kind_value is None:
                raise TraceError(f"{where}: a collective node without 'comm_type'; Chakra writes it on every one")
            kind = KINDS.get(kind_value)
            if kind is None:
                skipped[f"{NAMES.get(kind_value, f'comm_type {kind_value}')} collectives (emu has no such collective)"] += 1
                return None
            peer = None
        else:
            kind = CollKind.SEND if node.type == NodeType.COMM_SEND else CollKind.RECV
            peer = _int_attr(node, "comm_dst" if kind == CollKind.SEND else "comm_src")
            if peer is None:
                skipped[f"{kind.value} nodes without {'comm_dst' if kind == CollKind.SEND else 'comm_src'}"] += 1
                return None
        return self._sized(node, kind, peer, skipped, where)

    def _sized(self, node: Any, kind: CollKind, peer: int | None, skipped: Counter[str], where: str) -> Coll:
        size = _int_attr(node, "comm_size") or 0
        if size < 0:
            raise TraceError(f"{where}: comm_size is {size}; a size in bytes is >= 0")
        pg = next((attr_value(a) for a in node.attr if a.name == "pg_name"), None)
        members = self.groups.get(str(pg)) if pg is not None else None
        if pg is not None and members is None:
            self._note(f"pg_name {str(pg)[:20]!r} has no process_group:init entry: its collectives span every rank")
        members = members or self.everyone
        dtype = dtype_of(node.inputs.types)
        if dtype is None:
            dtype = Dtype.FLOAT32 if size % 4 == 0 else Dtype.UINT8
            self._note(f"dtype: Chakra records none where inputs.types names no tensor; {dtype.value} taken "
                       "(uint8 where the size is not a multiple of 4)")
        if size % dtype.itemsize:
            self._note(f"sizes: a comm_size that is not a whole number of {dtype.value} elements is rounded down")
        count = size // dtype.itemsize * (len(members) if kind == CollKind.ALL_GATHER else 1)
        if kind == CollKind.BARRIER:
            count = 0
        if kind == CollKind.BROADCAST:
            self._note("broadcast roots: Chakra records none; the group's first rank taken")
        self.next_id += 1
        return Coll(id=self.next_id - 1, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize,
                    group_size=len(members), observed_us=float(node.duration_micros) or None,
                    stream=self.stream(node),
                    root=members[0] if kind == CollKind.BROADCAST else None, peer=peer,
                    group=None if len(members) == self.world else members)

    def stream(self, node: Any) -> int | None:
        """The node's ``stream`` attribute (Chakra's PyTorch converter writes the CUDA stream) as
        emu's stream: its place among the streams this rank's collectives use, None for one."""
        value = _int_attr(node, "stream")
        if value is None:
            return None
        streams = self.streams.setdefault(value, len(self.streams))
        return streams

    def _say(self, skipped: Counter[str]) -> None:
        for what, n in sorted(skipped.items()):
            if n:
                self._note(f"left out: {n} {what}")

    def _note(self, text: str) -> None:
        if text not in self.gaps:
            self.gaps.append(text)


def _after_exact_ids(nodes: tuple[Any, ...]) -> int:
    """One past the largest collective id emu's attributes (``emu.op``) give: where the ids of the
    collectives without them start, so that the two never meet."""
    import json

    largest = -1
    for node in nodes:
        for a in node.attr:
            if a.name == emu_attrs.OP and a.WhichOneof("value") == "string_val":
                try:
                    value = json.loads(a.string_val).get("id")
                except (ValueError, RecursionError, AttributeError):
                    continue  # emu_attrs.coll says what is wrong with it
                if isinstance(value, int) and value > largest:
                    largest = value
    return largest + 1


def timeline_us(ops: list[Op]) -> float:
    """The program's own time from its durations: compute in order; a collective from its issue,
    after the previous one of its stream, for its observed time; a wait until they end."""
    now = 0.0
    ends: dict[int, float] = {}
    stream_free: dict[int | None, float] = {}
    for op in ops:
        if isinstance(op, Compute):
            now += op.dur_us
        elif isinstance(op, Coll):
            start = max(now, stream_free.get(op.stream, 0.0))
            ends[op.id] = stream_free[op.stream] = start + (op.observed_us or 0.0)
        else:
            now = max([now, *(ends.get(i, now) for i in op.ids)])
    return max([now, *ends.values()])
