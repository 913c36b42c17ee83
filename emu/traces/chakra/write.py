"""emu traces as Chakra execution traces: one ``<name>.<rank>.et`` per rank (``emu export
--chakra``; docs/trace-format.md, "Chakra").

Each rank's file is GlobalMetadata (version "1.0.0", Chakra's current numbering) and then, in
program order with ids from 1: a METADATA node ``## process_group:init ##`` naming every group
(as PyTorch's execution trace does), a COMP_NODE per compute and a COMM_COLL_NODE (or
COMM_SEND_NODE / COMM_RECV_NODE) per collective. Dependencies say what emu's program says: a node
depends on the compute before it (program order; a collective does not hold compute back) and
on the collectives the program waits for before it. Chakra's fields carry what they can
(``duration_micros``, ``comm_type``, ``comm_size`` in bytes of one rank's input, ``pg_name``,
``comm_src``/``comm_dst``, ``is_cpu_op``, ``inputs.types``); emu's attributes
(``emu.traces.chakra.attrs``) the rest, so that the trace reads back the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emu.errors import ConfigError
from emu.files import check_writable, hold_folder, make_folder, write_together
from emu.traces.chakra import attrs as emu_attrs
from emu.traces.chakra.schema import CommType, NodeType, messages
from emu.traces.io import meta_to_dict, op_to_dict
from emu.traces.model import Coll, CollKind, Compute, Dtype, RankProgram, Trace, Wait

VERSION = "1.0.0"
COMM_TYPES = {CollKind.ALL_REDUCE: CommType.ALL_REDUCE, CollKind.ALL_GATHER: CommType.ALL_GATHER,
              CollKind.REDUCE_SCATTER: CommType.REDUCE_SCATTER, CollKind.BROADCAST: CommType.BROADCAST,
              CollKind.ALL_TO_ALL: CommType.ALL_TO_ALL, CollKind.BARRIER: CommType.BARRIER}
# how PyTorch's execution trace spells each dtype in inputs.types ("Tensor(float)")
SPELLED = {Dtype.FLOAT32: "float", Dtype.FLOAT16: "c10::Half", Dtype.BFLOAT16: "c10::BFloat16",
           Dtype.FLOAT64: "double", Dtype.INT64: "long int", Dtype.INT32: "int", Dtype.INT16: "short int",
           Dtype.INT8: "signed char", Dtype.UINT8: "unsigned char", Dtype.BOOL: "bool"}


def safe_name(name: str) -> str:
    """A model's name as the files' stem: what a path would take apart (/, \\, a leading dot) becomes _."""
    return re.sub(r"[/\\\x00]", "_", name).lstrip(".") or "trace"


def write_chakra(trace: Trace, out: Path, name: str = "trace") -> list[Path]:
    """Write one file per rank of ``trace`` into the folder ``out`` (made if missing); returns them.
    A folder holding another export's files of that name is refused (a later import would mix them)."""
    if name != safe_name(name):
        raise ConfigError(f"--name {name!r}: a file name's stem, without /, \\ or a leading dot")
    make_folder(out, "--chakra's files", ConfigError)
    with hold_folder(out, ".emu-export.lock", f"--chakra {out}: another emu export is writing this folder now; "
                     "wait for it to end, or give another folder (their ranks' files would mix)"):
        return _write_ranks(trace, out, name)


def _write_ranks(trace: Trace, out: Path, name: str) -> list[Path]:
    mine = {f"{name}.{r.rank}.et" for r in trace.ranks}
    stale = sorted(p.name for p in out.iterdir() if re.search(r"\.et(\.gz)?$", p.name) and p.name not in mine)
    if stale:
        raise ConfigError(f"--chakra {out}: already holds {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''} "
                          "of another export, which a later import would mix in: give an empty folder")
    groups = _groups(trace)
    files = [(out / f"{name}.{p.rank}.et", _file(trace, p, groups)) for p in trace.ranks]
    write_together(files, f"the {len(files)} ranks' Chakra traces", fix="give another --chakra folder")
    return [path for path, _ in files]


def _groups(trace: Trace) -> dict[tuple[int, ...], str]:
    """Every group the trace's collectives use, named "0", "1", ... in order of first use ("0":
    the whole job)."""
    world = tuple(range(trace.meta.world_size))
    names = {world: "0"}
    for program in trace.ranks:
        for it in program.iterations:
            for op in it.colls:
                names.setdefault(op.group or world, str(len(names)))
    return names


def _attr(name: str, **value: Any) -> Any:
    a = messages()["AttributeProto"](name=name)
    ((member, v),) = value.items()
    if member.endswith("_list"):
        getattr(a, member).values.extend(v)
    else:
        setattr(a, member, v)
    return a


def _frame(message: Any) -> bytes:
    data = message.SerializeToString()
    n, head = len(data), bytearray()
    while True:
        head.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(head) + data


@dataclass
class _Writer:
    """One rank's nodes, in program order."""

    world: tuple[int, ...]
    groups: dict[tuple[int, ...], str]
    nodes: list[Any] = field(default_factory=list)
    last_compute: int | None = None
    coll_node: dict[int, int] = field(default_factory=dict)  # emu collective id -> node id, this iteration
    waits: list[Wait] = field(default_factory=list)  # the waits since the last node
    # the collective nodes waited for since the last compute: every node until the next compute
    # depends on them (Chakra schedules by data_deps alone), the last iteration's final waits included
    held: list[int] = field(default_factory=list)

    def node(self, kind: int, name: str, duration_us: float, iteration: int, extra: list[Any]) -> Any:
        node = messages()["Node"](id=len(self.nodes) + 1, name=name, type=kind,
                                  duration_micros=max(0, round(duration_us)))
        self.held += [self.coll_node[i] for w in self.waits for i in w.ids if i in self.coll_node]
        deps = ([self.last_compute] if self.last_compute is not None else []) + self.held
        node.data_deps.extend(sorted(set(deps)))
        node.attr.extend([_attr("is_cpu_op", bool_val=False), *extra,
                          _attr(emu_attrs.ITERATION, int64_val=iteration)])
        if self.waits:
            node.attr.append(_attr(emu_attrs.WAITS, string_val=emu_attrs.waits_text(self.waits)))
        self.waits = []
        self.nodes.append(node)
        return node

    def compute(self, op: Compute, iteration: int) -> None:
        node = self.node(NodeType.COMP, op.name, op.dur_us, iteration, [_attr(emu_attrs.DUR_US, double_val=op.dur_us)])
        self.last_compute, self.held = node.id, []  # what it waited for, it passes on

    def coll(self, op: Coll, iteration: int) -> None:
        members = op.group or self.world
        extra = [_attr("comm_size", int64_val=op.bytes // op.group_size if op.kind == CollKind.ALL_GATHER else op.bytes),
                 _attr("pg_name", string_val=self.groups[members]),
                 _attr(emu_attrs.OP, string_val=json.dumps(op_to_dict(op)))]
        if op.stream is not None:
            extra.append(_attr("stream", int64_val=op.stream))
        if op.kind == CollKind.SEND:
            kind = NodeType.COMM_SEND
            extra += [_attr("comm_dst", int32_val=op.peer or 0), _attr("comm_tag", int32_val=op.id)]
        elif op.kind == CollKind.RECV:
            kind = NodeType.COMM_RECV
            extra += [_attr("comm_src", int32_val=op.peer or 0), _attr("comm_tag", int32_val=op.id)]
        else:
            kind = NodeType.COMM_COLL
            extra.append(_attr("comm_type", int64_val=COMM_TYPES[op.kind]))
        node = self.node(kind, f"emu:{op.kind.value}", op.observed_us or 0.0, iteration, extra)
        node.inputs.types = f"['Tensor({SPELLED[op.dtype]})']"
        self.coll_node[op.id] = node.id


def _file(trace: Trace, program: RankProgram, groups: dict[tuple[int, ...], str]) -> bytes:
    classes = messages()
    w = _Writer(world=tuple(range(trace.meta.world_size)), groups=groups)
    init = classes["Node"](id=1, name="## process_group:init ##", type=NodeType.METADATA)
    init.inputs.values = json.dumps([{"pg_name": name, "ranks": list(members), "group_size": len(members)}
                                     for members, name in groups.items()])
    w.nodes.append(init)
    records = []
    for index, it in enumerate(program.iterations):
        w.coll_node = {}
        for op in it.ops:
            if isinstance(op, Wait):
                w.waits.append(op)
            elif isinstance(op, Compute):
                w.compute(op, index)
            else:
                w.coll(op, index)
        records.append({"step": it.step, "measured_us": it.measured_us,
                        "waits": [[list(x.ids), x.blocked_us] for x in w.waits]})
        w.held += [w.coll_node[i] for x in w.waits for i in x.ids if i in w.coll_node]
        w.waits = []
    meta = classes["GlobalMetadata"](version=VERSION)
    meta.attr.extend([_attr("schema", string_val="emu-trace-1"),
                      _attr(emu_attrs.META, string_val=json.dumps(meta_to_dict(trace.meta))),
                      _attr(emu_attrs.ITERATIONS, string_val=json.dumps(records))])
    return _frame(meta) + b"".join(_frame(n) for n in w.nodes)


def check_folder(out: Path) -> None:
    """Refuse, before any work, a folder that cannot be written: ConfigError (exit code 2), or
    RunFailed (exit 1) for a full disk (``emu.files.check_writable``)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--chakra {out}: not a folder; give the folder to write the ranks' .et files into")
    check_writable(out / "rank.et", "--chakra")
