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


def load_json(text: str, where: str, name: str) -> Any:
    """JSON text of a Chakra attribute or node, bounded as emu's trace files are (depth, digits)."""
    from emu.traces.jsonfile import MAX_JSON_DEPTH, json_depth_exceeds

    data = text.encode()
    if json_depth_exceeds(data):
        raise TraceError(f"{where}: {name} nests its JSON more than {MAX_JSON_DEPTH} deep")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{where}: {name} is not JSON ({str(exc)[:80]})") from None


def _json(text: Any, where: str, name: str) -> Any:
    if not isinstance(text, str):
        raise TraceError(f"{where}: attribute {name!r} must be a string_val of JSON")
    return load_json(text, where, f"attribute {name!r}")


def meta(attrs: dict[str, Any], where: str = "Chakra GlobalMetadata") -> TraceMeta | None:
    """The emu meta an exported file carries (None: none)."""
    from emu.traces.io import meta_from_dict

    if META not in attrs:
        return None
    return meta_from_dict(_json(attrs[META], where, META), where)


def coll(value: Any, where: str) -> Coll:
    from emu.traces.io import op_from_dict

    op = op_from_dict(_json(value, where, OP), where)
    if not isinstance(op, Coll):
        raise TraceError(f"{where}: attribute {OP!r} must hold a collective (\"op\": \"coll\")")
    return op


def waits(value: Any, where: str) -> tuple[Wait, ...]:
    return _waits(_json(value, where, WAITS), where)


def _waits(doc: Any, where: str) -> tuple[Wait, ...]:
    """Waits from their JSON, already parsed: a list of [ids, blocked_us]."""
    try:
        return tuple(Wait(ids=tuple(_id(i) for i in ids), blocked_us=None if blocked is None else float(blocked))
                     for ids, blocked in doc)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: attribute {WAITS!r} must be a list of [ids, blocked_us]") from None


def _id(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise ValueError(value)
    return value


def waits_text(ws: list[Wait]) -> str:
    return json.dumps([[list(w.ids), w.blocked_us] for w in ws])


def iterations(attrs: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The iterations an exported file records (None: none): step, measured_us, trailing waits."""
    if ITERATIONS not in attrs:
        return None
    doc = _json(attrs[ITERATIONS], where, ITERATIONS)

    def good(d: Any) -> bool:
        return (isinstance(d, dict) and isinstance(d.get("step"), int) and not isinstance(d["step"], bool)
                and 0 <= d["step"] <= 2**40 and isinstance(d.get("measured_us"), int | float)
                and isinstance(d.get("waits"), list))

    if not isinstance(doc, list) or not all(good(d) for d in doc):
        raise TraceError(f"{where}: attribute {ITERATIONS!r} must be a list of {{step (an integer >= 0), "
                         "measured_us (a number), waits (a list)}}")
    for d in doc:
        d["waits"] = _waits(d["waits"], where)
    return doc
