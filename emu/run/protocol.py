"""The messages between a real rank's backend and emu run's coordinator (docs/run.md).

A request is a zmq multipart message: a JSON header, then one raw frame per tensor (its bytes,
little-endian, C order). The coordinator answers every request, with a JSON header and the
result's frames. Nothing is pickled; every header and frame is bounded and checked against
what the header declares; a request that fails a check ends the run, which reports why.

Header keys: ``v`` (the protocol version), ``rank``, ``kind`` (``hello``, ``coll``, ``wait``,
``step``, ``done``), ``compute_us`` (the rank's compute since its previous call returned), and
for a collective ``seq`` (its number in the rank's stream), ``coll`` (all_reduce, broadcast,
all_gather, reduce_scatter, barrier), ``dtype``, ``shapes`` (per tensor frame), ``op`` (the
reduction: sum, avg, max, min, product) and ``root``; for a wait, ``ids``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

VERSION = 1
MAX_HEADER = 1 << 16
MAX_FRAME = 1 << 32  # bytes of one tensor
MAX_FRAMES = 1 << 12  # tensors of one request (an all_gather's outputs: one per worker)
KINDS = ("hello", "coll", "wait", "step", "done")
COLLS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier")
OPS = ("sum", "avg", "max", "min", "product")
DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int64": "<i8", "int32": "<i4",
          "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?"}


class ProtocolError(Exception):
    """A malformed request: the coordinator refuses it and ends the run."""


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
    compute = head.get("compute_us", 0.0)
    if not isinstance(compute, (int, float)) or not math.isfinite(compute) or compute < 0:
        raise ProtocolError(f"rank {head['rank']}: compute_us is {compute!r}, not a time")
    if head["kind"] == "coll":
        if head.get("coll") not in COLLS or head.get("dtype") not in DTYPES or head.get("op") not in (*OPS, None):
            raise ProtocolError(f"rank {head['rank']}: unknown collective {head.get('coll')!r}, dtype "
                                f"{head.get('dtype')!r} or reduction {head.get('op')!r}")
        shapes = head.get("shapes")
        if not isinstance(shapes, list) or len(shapes) != len(parts) - 1 or not all(
                isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes):
            raise ProtocolError(f"rank {head['rank']}: shapes {shapes!r} do not describe the request's "
                                f"{len(parts) - 1} tensors")
    return head


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
