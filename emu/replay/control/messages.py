"""The control messages between the orchestrator and its processes (hosts and the switch).

Small JSON objects on the control socket, one frozen dataclass per kind, tagged by
``type``: parsed into exactly these records (unknown types, missing or mistyped fields
are a FrameError), never unpickled, and bounded in size. The data plane (contributions,
results, segments, the clock's Go and Done) is binary: ``emu.emulator.protocol.transport``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

import zmq

from emu.emulator.protocol.transport import FrameError
from emu.errors import EmuError

CARRIED_UNIT = 1 << 10  # HostResult.carried's parts of a byte
MAX_CONTROL = 64 << 20  # a host's result carries every worker's iteration records and spans

Who = int | str  # a host's index, or "switch"


@dataclass(frozen=True)
class Ready:
    """A process is connected and waits for Start."""

    host: Who


@dataclass(frozen=True)
class Start:
    wall0: float  # the wall clock's emulated zero (time.monotonic() of the orchestrator's machine)


@dataclass(frozen=True)
class Stop:
    """Send your result and exit."""


@dataclass(frozen=True)
class Alive:
    """A heartbeat between the orchestrator and a machine of a replay spread over several
    (docs/multi-host.md); ``machine``: the sender's rank (0: the orchestrator's)."""

    machine: int


@dataclass(frozen=True)
class Abort:
    """The orchestrator ended the run: stop your processes (``reason``: why)."""

    reason: str


@dataclass(frozen=True)
class Ended:
    """The switch's synchronized clock ran out of events (every host finished, nothing in
    flight): ``windows`` were run. The orchestrator stops the processes only after this, so that
    no host stops while the switch still runs windows with it (found 2026-12-05: a parameter
    server's host had a last window to run after every worker's host reported, and the switch
    failed sending it to a host already stopped)."""

    windows: int


@dataclass(frozen=True)
class Progress:
    host: int
    iterations: int  # the fewest iterations any of its workers finished


@dataclass(frozen=True)
class Failed:
    host: Who
    error: str
    user: bool = False  # an EmuError: its message is the whole story (else a bug's type and text)


@dataclass(frozen=True)
class WorkerRecord:
    iterations: list[list[float]]  # per iteration: start, end, compute, blocked, comm (emulated us)
    spans: list[list[Any]]  # (category, name, start, end) for the Chrome trace, when asked for
    # per collective completed: iteration, id, start (when it had its stream), end (emulated us);
    # where adaptive compression measures the rates its buckets got (emu.replay.plan.adaptive)
    colls: list[list[float]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class HostResult:
    """What a host measured. Real messages and emulated packets are counted apart."""

    host: int
    workers: dict[str, WorkerRecord]  # by the worker's number in its job
    bytes_sent: float  # emulated wire bytes, every link direction
    lost: int  # real aggregation rows the links dropped
    packets_lost: int  # emulated packets lost on any link
    retransmissions: int  # real rows the stream resent
    fallbacks: dict[str, int]
    reordered: int
    reorder_error_us: float
    events: int
    real_bytes: int
    verify_elements: int
    verify_mismatches: int
    lag: dict[str, Any] | None = None  # a LagHistogram, on the wall clock
    # per kind of link (emu.replay.host.wiring.Wiring.usage): [links, busy us summed, busy us of the
    # busiest, its name]
    links: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    job: int = 0  # jobs sharing the fabric: whose endpoints these are (a host sends one result per job)
    # collectives its workers completed, by their group's role ("" for a collective without one)
    completed: dict[str, int] = dataclasses.field(default_factory=dict)
    rejected: int = 0  # messages its sockets dropped as unauthenticated (several machines)
    # point-to-point segments its endpoints sent that stood for payload, and those that carried no
    # real element (emu.replay.report.model.Verification)
    payload_segments: int = 0
    empty_segments: int = 0
    verify_distinct: int = 0  # distinct elements of the results checked (verify_elements: deliveries)
    # of packets_lost, those whose loss and resending were drawn by a model and timed, no real
    # message dropped: a point-to-point segment's packets, INA's rows at payload scale above 1
    packets_lost_modelled: int = 0
    # per collective (its seq in the job): the payload bytes (values and a sparse message's indices)
    # and the header and framing bytes its messages took on the links, once where each was sent (a
    # stream's result once for each worker it reached), resends aside; in CARRIED_UNIT parts of a
    # byte (a segment's emulated bytes are fractional; integers sum exactly in any order)
    carried: dict[str, list[int]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class SwitchResult:
    stats: dict[str, int]  # AggregationSwitch's counters (empty when it only forwards)
    segments: int  # point-to-point segments forwarded
    windows: int | None = None  # rounds of the synchronized clock
    pipeline_busy_us: float = 0.0  # the aggregation pipeline's busy time (a switch with a packet rate)
    rejected: int = 0  # messages its sockets dropped as unauthenticated (several machines)


def connect_control(ctx: zmq.Context, address: str, key: bytes | None = None,
                    identity: bytes | None = None) -> zmq.Socket:
    """A replay process's control socket to the orchestrator (sealed under ``key`` across machines)."""
    from emu.replay.machines import sealed

    ctrl = sealed.make(ctx, zmq.DEALER, key, "control", identity)
    ctrl.setsockopt(zmq.LINGER, 0)
    quick_reconnect(ctrl)
    ctrl.connect(address)
    return ctrl


# The longest a replay process waits to hand a message to a peer: a send with nowhere to go (its
# peer killed, its socket gone) would otherwise wait forever, and so would the process.
SEND_TIMEOUT_MS = 10_000


def quick_reconnect(sock: zmq.Socket) -> None:
    """Retry a connect every 5 ms (backing off to 100 ms), not zmq's 100: a forked process
    usually connects before its peer has bound, and each replay would wait a retry for it. And
    bound every send (``SEND_TIMEOUT_MS``: zmq.Again past it)."""
    sock.setsockopt(zmq.RECONNECT_IVL, 5)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)


def failure(host: Who, exc: BaseException) -> Failed:
    if isinstance(exc, EmuError):
        return Failed(host, str(exc), user=True)
    return Failed(host, f"{type(exc).__name__}: {exc}")


Message = Ready | Start | Stop | Progress | Failed | HostResult | SwitchResult | Alive | Abort | Ended
_TYPES: dict[str, type] = {"ready": Ready, "start": Start, "stop": Stop, "progress": Progress, "error": Failed,
                           "result": HostResult, "switch": SwitchResult, "alive": Alive, "abort": Abort,
                           "ended": Ended}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(msg: Message) -> bytes:
    doc = {"type": _NAMES[type(msg)], **dataclasses.asdict(msg)}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    if len(data) > MAX_CONTROL:
        raise FrameError(f"control message of {len(data)} bytes (at most {MAX_CONTROL})")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"control message is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("type") not in _TYPES:
        raise FrameError("control message without a known type")
    return _build(_TYPES[doc.pop("type")], doc)


def _build(cls: type, doc: Any) -> Any:
    if not isinstance(doc, dict):
        raise FrameError(f"control message {cls.__name__}: not an object")
    hints, fields = _layout(cls)
    if not doc.keys() <= hints.keys():
        raise FrameError(f"control message {cls.__name__}: unknown fields {sorted(set(doc) - set(hints))}")
    args = {}
    for f in fields:
        if f.name not in doc:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FrameError(f"control message {cls.__name__}: no {f.name}")
            continue
        args[f.name] = _check(cls.__name__, f.name, hints[f.name], doc[f.name])
    return cls(**args)


@functools.cache
def _layout(cls: type) -> tuple[dict[str, Any], tuple[dataclasses.Field, ...]]:
    """A message class's fields and their types, resolved once (a host's result names every worker
    it ran: resolving the string annotations per record took 0.6 s at 8,192 workers)."""
    fields = dataclasses.fields(cls)
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields}, fields


def _check(where: str, name: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _check(where, name, option, value)
            except FrameError:
                continue
        raise FrameError(f"control message {where}: {name} has the wrong type")
    if hint is type(None):
        if value is None:
            return None
    elif hint is Any:
        return value
    elif dataclasses.is_dataclass(hint):
        return _build(hint, value)
    elif origin is dict and isinstance(value, dict):
        _, vt = typing.get_args(hint)
        return {str(k): _check(where, name, vt, v) for k, v in value.items()}
    elif origin is list and isinstance(value, list):
        (vt,) = typing.get_args(hint)
        return [_check(where, name, vt, v) for v in value]
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif hint is bool and isinstance(value, bool):
        return value
    elif hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif hint is str and isinstance(value, str):
        return value
    raise FrameError(f"control message {where}: {name} has the wrong type")


__all__ = ["Abort", "Alive", "Ended", "Failed", "HostResult", "Message", "Progress", "Ready", "Start", "Stop", "SwitchResult", "WorkerRecord",
           "decode", "encode"]
