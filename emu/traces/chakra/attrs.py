"""emu's own attributes in Chakra traces (``emu.*``): what Chakra has no field for, so that a trace
written by ``emu export --chakra`` reads back as the same emu trace (docs/trace-format.md,
"Chakra"). Chakra's tools keep attributes they do not know (the feeder's ``other_attrs``).

On GlobalMetadata:

- ``emu.meta`` (string): the trace's ``meta`` as emu's trace file has it (JSON): dtype, mesh,
  experts, noise, gaps, the command ...;
- ``emu.iterations`` (string): JSON, one object per iteration of the rank: ``step``,
  ``measured_us`` and ``waits``, the waits after its last node (each ``[ids, blocked_us]``).

On a Node:

- ``emu.op`` (string): a collective as emu's trace file has it (JSON: id, dtype, count, group,
  role, stream, splits, tensors, sparsity);
- ``emu.dur_us`` (double): a compute's duration, which ``duration_micros`` rounds to a microsecond;
- ``emu.iteration`` (int64): the index of its iteration;
- ``emu.waits`` (string): JSON, the waits just before the node, each ``[ids, blocked_us]``.
"""

from __future__ import annotations

import json
from typing import Any

from emu.errors import TraceError
from emu.traces.model import Coll, TraceMeta, Wait

META = "emu.meta"
ITERATIONS = "emu.iterations"
OP = "emu.op"
DUR_US = "emu.dur_us"
ITERATION = "emu.iteration"
WAITS = "emu.waits"


def _json(text: Any, where: str, name: str) -> Any:
    if not isinstance(text, str):
        raise TraceError(f"{where}: attribute {name!r} must be a string_val of JSON")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TraceError(f"{where}: attribute {name!r} is not JSON ({exc})") from None


def meta(attrs: dict[str, Any], where: str = "Chakra GlobalMetadata") -> TraceMeta | None:
    """The emu meta an exported file carries (None: none)."""
    from emu.traces.io import meta_from_dict

    if META not in attrs:
        return None
    return meta_from_dict(_json(attrs[META], where, META), where)


def world_size(attrs: dict[str, Any]) -> int | None:
    m = meta(attrs)
    return m.world_size if m is not None else None


def coll(value: Any, where: str) -> Coll:
    from emu.traces.io import op_from_dict

    op = op_from_dict(_json(value, where, OP), where)
    if not isinstance(op, Coll):
        raise TraceError(f"{where}: attribute {OP!r} must hold a collective (\"op\": \"coll\")")
    return op


def waits(value: Any, where: str) -> tuple[Wait, ...]:
    doc = _json(value, where, WAITS)
    try:
        return tuple(Wait(ids=tuple(int(i) for i in ids), blocked_us=None if blocked is None else float(blocked))
                     for ids, blocked in doc)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: attribute {WAITS!r} must be a list of [ids, blocked_us]") from None


def waits_text(ws: list[Wait]) -> str:
    return json.dumps([[list(w.ids), w.blocked_us] for w in ws])


def iterations(attrs: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The iterations an exported file records (None: none): step, measured_us, trailing waits."""
    if ITERATIONS not in attrs:
        return None
    doc = _json(attrs[ITERATIONS], where, ITERATIONS)
    if not isinstance(doc, list) or not all(isinstance(d, dict) and {"step", "measured_us", "waits"} <= d.keys()
                                            for d in doc):
        raise TraceError(f"{where}: attribute {ITERATIONS!r} must be a list of {{step, measured_us, waits}}")
    for d in doc:
        d["waits"] = waits(json.dumps(d["waits"]), where)
    return doc
