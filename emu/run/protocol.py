"""The messages between a real rank's backend and emu run's coordinator (docs/run.md).

A request is a zmq multipart message: a JSON header, then one raw frame per tensor (its bytes,
little-endian, C order). The coordinator answers every request, with a JSON header and the
result's frames. Nothing is pickled; every header and frame is bounded and checked against
what the header declares; a request that fails a check ends the run, which reports why.

Header keys: ``v`` (the protocol version), ``rank``, ``kind`` (``hello``, ``coll``, ``wait``,
``step``, ``loss``, ``done``), ``compute_us`` (the rank's compute since its previous call returned),
``check`` (what the rank has checked of the results it received so far: ``Checked``), and
for a collective ``seq`` (its number in the rank's stream), ``coll`` (all_reduce, broadcast,
all_gather, reduce_scatter, barrier, all_to_all), ``dtype``, ``shapes`` (per tensor frame), ``op`` (the
reduction: sum, avg, max, min, product), ``root``, ``digest`` and, under ``--compress``,
``compress_us`` (the rank's time compressing the gradient this collective carries); for a wait,
``ids``; for a wait or a step, ``decompress_us`` (the rank's time decompressing what it waits
for, the K distinct messages' times M / K for an all_gather: ``emu.run.compress``); for a loss,
``value`` (what the script reported, ``emu.run.report_loss``; inf or NaN arrives as NaN).

``digest``: what the rank's own contribution must give, per tensor the real ranks receive a
result of (one; a reduce_scatter's first K inputs), small enough for a header, or null where
nothing is checked. An entry is ``{"p": [...], "a": [...]}`` for a sum of floats (the tensor's
projections on ``PROJECTIONS`` seeded vectors, and those of its magnitudes on theirs), ``{"p":
[...]}`` for a sum of integers (mod 2^64), ``{"h": hex}`` for a copy (blake2b of its bytes),
``{"hs": [hex, ...]}`` for an all_to_all (a hash of each of its M pieces), or null (a tensor
holding inf or NaN). An all_to_all also carries ``in_splits`` and ``out_splits``: its rows to and
from each of the M workers (its one input frame, its M output frames). The coordinator's reply to a collective relays, per real rank,
the entry of the tensor that the result reduces or copies (``digests``), untouched; its reply to
``hello`` says how many ranks are real (``real``).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

VERSION = 4  # 2: digests of the ranks' contributions, the ranks' own check; 3: compression's times, losses; 4: all_to_all
MAX_HEADER = 1 << 16
MAX_FRAME = 1 << 32  # bytes of one tensor
MAX_FRAMES = 1 << 12  # tensors of one request (an all_gather's outputs: one per worker)
KINDS = ("hello", "coll", "wait", "step", "loss", "done")
COLLS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "all_to_all")
OPS = ("sum", "avg", "max", "min", "product")
DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int64": "<i8", "int32": "<i4",
          "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?"}
PROJECTIONS = 2  # seeded projections of a sum's digest


class ComputeClock(str, Enum):
    """How a real rank's compute is timed between its calls into emu (``emu run --compute-clock``):
    its thread's CPU time (other processes' load does not count) or wall time."""

    THREAD = "thread"
    WALL = "wall"

    def timer(self) -> Callable[[], float]:
        return time.thread_time if self is ComputeClock.THREAD else time.perf_counter

    @property
    def label(self) -> str:
        """As a trace's note names it."""
        return "thread CPU" if self is ComputeClock.THREAD else "wall"


MAX_PIECE_HASHES = 1024  # an all_to_all's digests: a hash of each of its M pieces, from each of K real ranks
MAX_DIGESTS = 128  # real ranks whose digests travel (a header holds this many and more)
# results a rank does not check, by why (the keys of ``Checked.unchecked``)
UNCHECKED = {
    "product": "product",
    "max_min": "max/min of several real ranks: only bounded by each rank's own tensor",
    "int_avg": "avg of integers",
    "bool": "sum of bools",
    "nonfinite": "inf or NaN",
    "ranks": f"more than {MAX_DIGESTS} real ranks",
    "a2a_size": f"all_to_all whose pieces' hashes (real ranks x workers) pass {MAX_PIECE_HASHES}",
}
_HASH = re.compile(r"[0-9a-f]{32}")


class ProtocolError(Exception):
    """A malformed request: the coordinator refuses it and ends the run."""


@dataclass(frozen=True)
class Checked:
    """What real ranks checked of the results they received, each in its own process, against
    the digests of what every real rank contributed: the results checked, their elements, the
    results that disagreed (a sum outside its rounding bound, a copy whose bytes differ, a
    maximum below the rank's own tensor), and the results not checked, by why (``UNCHECKED``).
    A rank's counts are cumulative; the coordinator adds the ranks' latest."""

    results: int = 0
    elements: int = 0
    mismatches: int = 0
    unchecked: tuple[tuple[str, int], ...] = ()  # (reason, results), sorted by reason

    def record(self, reason: str | None, elements: int, ok: bool) -> Checked:
        """These counts and one more result: checked (``reason`` None) or not, and whether a
        check of it failed."""
        miss = self.mismatches + (not ok)
        if reason is not None:
            return Checked(self.results, self.elements, miss, _merged(self.unchecked, ((reason, 1),)))
        return Checked(self.results + 1, self.elements + elements, miss, self.unchecked)

    def __add__(self, other: Checked) -> Checked:
        return Checked(self.results + other.results, self.elements + other.elements,
                       self.mismatches + other.mismatches, _merged(self.unchecked, other.unchecked))

    def header(self) -> dict[str, Any]:
        return {"results": self.results, "elements": self.elements, "mismatches": self.mismatches,
                "unchecked": dict(self.unchecked)}

    @staticmethod
    def of(value: object, rank: object) -> Checked:
        """A header's ``check`` (ProtocolError where it is malformed)."""
        keys = ("results", "elements", "mismatches")
        if not isinstance(value, dict) or set(value) != {*keys, "unchecked"} or not all(
                _count(value[key]) for key in keys):
            raise ProtocolError(f"rank {rank}: check {str(value)[:200]} is not the counts of a rank's check")
        unchecked = value["unchecked"]
        if not isinstance(unchecked, dict) or not all(
                reason in UNCHECKED and _count(n) for reason, n in unchecked.items()):
            raise ProtocolError(f"rank {rank}: unchecked results {str(unchecked)[:200]} are not counts by "
                                f"{', '.join(UNCHECKED)}")
        return Checked(value["results"], value["elements"], value["mismatches"], _merged((), tuple(unchecked.items())))


def _merged(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    out = dict(a)
    for reason, n in b:
        out[reason] = out.get(reason, 0) + n
    return tuple(sorted(out.items()))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def encode(header: dict[str, Any], frames: list[bytes | memoryview] | None = None) -> list[bytes | memoryview]:
    return [json.dumps(header, separators=(",", ":")).encode(), *(frames or [])]


def header_of(parts: list[bytes]) -> dict[str, Any]:
    """The checked header of a request (ProtocolError where it is malformed)."""
    if not parts or len(parts[0]) > MAX_HEADER:
        raise ProtocolError("a request's header is missing or longer than 64 KiB")
    if len(parts) - 1 > MAX_FRAMES:
        raise ProtocolError(f"a request carries {len(parts) - 1} tensors, more than {MAX_FRAMES}")
    try:
        head = json.loads(parts[0])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"a request's header is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("v") != VERSION:
        raise ProtocolError(f"a request's header is not an emu run v{VERSION} header (another emu version?)")
    if head.get("kind") not in KINDS or not isinstance(head.get("rank"), int):
        raise ProtocolError(f"a request has kind {head.get('kind')!r} and rank {head.get('rank')!r}")
    for key in ("compute_us", "compress_us", "decompress_us"):
        value = head.get(key, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ProtocolError(f"rank {head['rank']}: {key} is {value!r}, not a time")
    if head["kind"] == "loss" and (not isinstance(head.get("value"), (int, float)) or isinstance(head["value"], bool)):
        raise ProtocolError(f"rank {head['rank']}: a loss of {head.get('value')!r}, not a number")
    if head["kind"] == "coll":
        if head.get("coll") not in COLLS or head.get("dtype") not in DTYPES or head.get("op") not in (*OPS, None):
            raise ProtocolError(f"rank {head['rank']}: unknown collective {head.get('coll')!r}, dtype "
                                f"{head.get('dtype')!r} or reduction {head.get('op')!r}")
        shapes = head.get("shapes")
        if not isinstance(shapes, list) or len(shapes) != len(parts) - 1 or not all(
                isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes):
            raise ProtocolError(f"rank {head['rank']}: shapes {shapes!r} do not describe the request's "
                                f"{len(parts) - 1} tensors")
        _check_splits(head)
        _check_digests(head.get("digest"), f"rank {head['rank']}")
    if "check" in head:
        head["check"] = Checked.of(head["check"], head["rank"])
    return head


def reply_of(parts: list[bytes]) -> dict[str, Any]:
    """The checked header of the coordinator's reply, on the rank's side (ProtocolError where it
    is malformed)."""
    if not parts or len(parts[0]) > MAX_HEADER:
        raise ProtocolError("a reply's header is missing or longer than 64 KiB")
    try:
        head = json.loads(parts[0])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"a reply's header is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("v") != VERSION or head.get("ok") is not True:
        raise ProtocolError(f"a reply's header is not an emu run v{VERSION} answer (another emu version?)")
    real = head.get("real", 1)
    if not _count(real) or real < 1:
        raise ProtocolError(f"a reply says {real!r} ranks are real")
    _check_digests(head.get("digests"), "the coordinator's reply")
    return head


def _check_splits(head: dict[str, Any]) -> None:
    """An all_to_all's ``in_splits`` and ``out_splits``: rows to and from each worker (at most
    ``MAX_FRAMES`` of each), the input's adding up to its one frame's rows; the output's are checked
    against what the coordinator's answer gives (``coordinator._exchanged``)."""
    if head["coll"] != "all_to_all":
        return
    shapes = head["shapes"]
    rows = shapes[0][0] if len(shapes) == 1 and shapes[0] else None
    for key in ("in_splits", "out_splits"):
        value = head.get(key)
        if rows is None or not isinstance(value, list) or len(value) > MAX_FRAMES \
                or not all(_count(v) for v in value) or (key == "in_splits" and sum(value) != rows):
            raise ProtocolError(f"rank {head['rank']}: all_to_all {key} {str(value)[:200]} are not rows per worker "
                                f"of its one input of {rows} rows")


def _check_digests(digests: object, who: str) -> None:
    """A header's digests: null, or at most ``MAX_DIGESTS`` entries (module docstring)."""
    if digests is None:
        return
    if not isinstance(digests, list) or len(digests) > MAX_DIGESTS or not all(map(_entry, digests)):
        raise ProtocolError(f"{who}: digests {str(digests)[:200]} are not at most {MAX_DIGESTS} entries of "
                            f"{PROJECTIONS} projections or a 32-digit hash")


def _entry(entry: object) -> bool:
    if entry is None:
        return True
    if not isinstance(entry, dict):
        return False
    if set(entry) == {"h"}:
        return isinstance(entry["h"], str) and _HASH.fullmatch(entry["h"]) is not None
    if set(entry) == {"hs"}:  # an all_to_all: a hash of each piece
        return isinstance(entry["hs"], list) and len(entry["hs"]) <= MAX_PIECE_HASHES and all(
            isinstance(h, str) and _HASH.fullmatch(h) is not None for h in entry["hs"])
    if set(entry) == {"p"}:  # a sum of integers: mod 2^64
        return _numbers(entry["p"], _word)
    return set(entry) == {"p", "a"} and _numbers(entry["p"], _finite) and _numbers(entry["a"], _finite)


def _numbers(values: object, ok: Callable[[object], bool]) -> bool:
    return isinstance(values, list) and len(values) == PROJECTIONS and all(map(ok, values))


def _word(value: object) -> bool:
    return _count(value) and value < 1 << 64  # type: ignore[operator]


def _finite(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def arrays(head: dict[str, Any], parts: list[bytes]) -> list[np.ndarray]:
    """The request's tensors as numpy arrays (read-only views of the frames), checked against
    the header's shapes and dtype."""
    dt = np.dtype(DTYPES[head["dtype"]])
    out = []
    for shape, frame in zip(head["shapes"], parts[1:], strict=True):
        want = math.prod(shape) * dt.itemsize
        if len(frame) != want or want > MAX_FRAME:
            raise ProtocolError(f"rank {head['rank']}: a tensor of shape {shape} and dtype {head['dtype']} is "
                                f"{want} bytes, its frame {len(frame)}")
        out.append(np.frombuffer(frame, dtype=dt).reshape(shape))
    return out
