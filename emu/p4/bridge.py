"""The bridge between emu's switch process and BMv2: one job's pool, aggregated by the P4 program.

``Bmv2Pool`` takes the software switch's place in the switch process (``Fabric.pool``): it has
``AggregationSwitch``'s ``process``, so the synchronized clock's windows, the wall clock and the
routing of results are the same code as on ``--fabric ina``. For each batch of contributions
(on the synchronized clock: one window's, in stamp order):

1. emu's software switch, the model, takes the batch first and says which results the protocol
   gives and when each may leave (its stamps: the switch timing ``ina`` uses);
2. every contribution goes to BMv2 as an Ethernet frame, in the batch's order, all on worker 0's
   port: BMv2 does not order frames across ports, and the header's ``worker`` field, not the
   port, names the sender (a retransmission is answered on the port it came in, and the bridge
   routes by the answer's ``worker`` field). So BMv2 sees the packets in the order the
   emulated time dictates, as the software switch does;
3. after every ``BARRIER_ROWS`` frames, a FLUSH (``wire.MsgType.FLUSH``), which the program
   multicasts back on every port behind everything it processed before it: when it is back on
   every port, BMv2 is done with those frames (incomplete slot copies answer nothing, so this is
   how the bridge knows), and no more than ``BARRIER_ROWS`` frames and their results are ever in
   flight, well inside BMv2's queues (64 packets a port), so BMv2 drops nothing emu did not
   decide to lose;
4. the results are BMv2's (headers and sums), each multicast result checked to have come back
   on every worker's port, stamped with the model's stamps. A result the model gives that BMv2
   did not send (a frame BMv2 lost: overload, a crash) is asked for again by resending the
   contributions of its slot copy, which the protocol answers without counting any twice
   (``resent``); a result BMv2 sends that differs from the model's is counted (``differs``)
   and kept: the replay's verification then checks BMv2's sums.

The counters the report gives for a bmv2 fabric (packets, results, duplicates, ...) are the
model's, fed the packets BMv2 got: the program counts nothing. The bridge's own are ``bridge``.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch, Results, SwitchStats
from emu.errors import RunFailed

ETH_P_ALL = 0x0003
MAX_FRAME = 2048
BARRIER_ROWS = 48  # frames between barriers: each gives a port at most one result, BMv2 queues 64
BARRIER_TIMEOUT_S = 5.0  # a barrier not back on every port by then is sent again
BARRIER_TRIES = 4
RESEND_ROUNDS = 4
_TYPE_AT = wire.ETH_HEADER + wire.IPV4_HEADER + wire.UDP_HEADER  # the emu header's first byte in a frame

Key = tuple[int, int, int, int]  # a result's (destination worker, copy, slot, chunk)


class FramePorts(Protocol):
    """The switch's ports as the bridge sees them: frames out on a port, frames in from any."""

    ports: int

    def send(self, port: int, frame: bytes) -> None: ...

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]: ...

    def close(self) -> None: ...


class RawPorts:
    """Raw sockets on the host side of every worker's veth (``emu.p4.bmv2.host_interface``)."""

    def __init__(self, interfaces: list[str]) -> None:
        self.socks: list[socket.socket] = []
        try:
            for name in interfaces:
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                self.socks.append(sock)
                sock.bind((name, 0))
                sock.setblocking(False)
        except BaseException:
            self.close()
            raise
        self.ports = len(self.socks)
        self._port_of = {s.fileno(): p for p, s in enumerate(self.socks)}

    def send(self, port: int, frame: bytes) -> None:
        self.socks[port].send(frame)

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]:
        ready, _, _ = select.select(self.socks, [], [], timeout_s)
        out = []
        for sock in ready:
            port = self._port_of[sock.fileno()]
            while True:
                try:
                    out.append((port, sock.recv(MAX_FRAME)))
                except BlockingIOError:
                    break
        return out

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.socks = []


@dataclass
class BridgeStats:
    frames: int = 0  # contribution frames sent to BMv2, resends included
    results: int = 0  # result frames BMv2 sent back (every port's copy)
    barriers: int = 0  # FLUSH frames sent
    barrier_resends: int = 0  # barriers sent again: one had not come back on every port in time
    resent: int = 0  # contributions sent again for results BMv2 lost (real drops)
    differs: int = 0  # results whose header or sum differs from the model's, or that it does not give

    def as_dict(self) -> dict[str, int]:
        return {f"bridge_{f.name}": getattr(self, f.name) for f in fields(self)}


class _Stats:
    """The model's counters and the bridge's, as the switch process reports a pool's."""

    def __init__(self, model: SwitchStats, bridge: BridgeStats) -> None:
        self.model, self.bridge = model, bridge

    def as_dict(self) -> dict[str, int]:
        return {**self.model.as_dict(), **self.bridge.as_dict()}


class Bmv2Pool:
    """One job's slot pool on BMv2 behind ``AggregationSwitch.process`` (the module's docstring)."""

    def __init__(self, slots: int, workers: int, elements: int, job: int, ports: FramePorts,
                 where: Callable[[], str] = lambda: "BMv2") -> None:
        if ports.ports < workers:
            raise RunFailed(f"the bridge has {ports.ports} ports for {workers} workers")
        self.model = AggregationSwitch(slots, workers, elements, job)
        self.workers, self.k, self.job = workers, elements, job
        self.ports, self.where = ports, where
        self.bridge = BridgeStats()
        self.stats = _Stats(self.model.stats, self.bridge)
        self.seq = 0
        # each slot copy's frames since its last result (what a resend sends again), and the copy
        # each worker last sent to on each slot
        self.open: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        self.last: dict[tuple[int, int], int] = {}

    def process(self, headers: np.ndarray, payload: np.ndarray, stamps: np.ndarray | None = None,
                sparse: np.ndarray | None = None) -> Results:
        if len(headers) and (headers["msg_type"] != wire.MsgType.CONTRIB).any():
            raise RunFailed("the P4 program runs the dense stream: a sparse contribution reached BMv2's bridge")
        expected = self.model.process(headers, payload, stamps, sparse)
        frames = [_frame(h, p) for h, p in zip(headers, payload, strict=True)]
        for h, f in zip(headers, frames, strict=True):
            slot, copy, w = int(h["slot"]), int(h["flags"]) & wire.FLAG_COPY, int(h["worker"])
            self.open.setdefault((slot, copy), []).append((w, f))
            self.last[(slot, w)] = copy
        got: dict[Key, tuple[np.void, np.ndarray]] = {}
        self._exchange(frames, got)
        want = self._keys(expected)
        wanted = set(want)
        self.bridge.differs += sum(1 for key in got if key not in wanted)  # results the protocol does not give
        for _ in range(RESEND_ROUNDS):
            missing = [key for key in want if key not in got]
            if not missing:
                break
            again = self._again(missing)
            self.bridge.resent += len(again)
            self._exchange(again, got)
        else:
            missing = [key for key in want if key not in got]
            if missing:
                w, copy, slot, chunk = missing[0]
                raise RunFailed(f"BMv2 did not send {len(missing)} results the protocol gives (the first: slot "
                                f"{slot} copy {copy} chunk {chunk} for worker {w}) after {RESEND_ROUNDS} resends of "
                                f"their contributions; {self.where()}")
        for _, copy, slot, _ in want:  # complete: a resend from here on would be a new round's
            self.open.pop((slot, copy), None)
        return self._merge(expected, got)

    def _again(self, missing: list[Key]) -> list[bytes]:
        """The frames to send again for missing results: every frame of their slot copies since the
        copies' last results, in order, which the protocol answers without counting any twice. A
        worker that has since sent to the slot's other copy would be cleared from it: refused."""
        out = []
        for slot, copy in dict.fromkeys((slot, copy) for _, copy, slot, _ in missing):
            for w, f in self.open.get((slot, copy), ()):
                if self.last[(slot, w)] != copy:
                    raise RunFailed(f"BMv2 lost a result of slot {slot} copy {copy} after worker {w} went on to the "
                                    f"other copy: resending could count it twice, so the run stops; {self.where()}")
                out.append(f)
        return out

    def close(self) -> None:
        self.ports.close()

    def _keys(self, res: Results) -> list[Key]:
        keys = []
        for h in res.headers:
            dests = range(self.workers) if int(h["worker"]) == MULTICAST else (int(h["worker"]),)
            copy, slot, chunk = int(h["flags"]) & wire.FLAG_COPY, int(h["slot"]), int(h["chunk"])
            keys += [(w, copy, slot, chunk) for w in dests]
        return keys

    def _exchange(self, frames: list[bytes], got: dict[Key, tuple[np.void, np.ndarray]]) -> None:
        """Every frame to BMv2 in order, a barrier after each ``BARRIER_ROWS``; results into ``got``."""
        for start in range(0, len(frames), BARRIER_ROWS):
            for f in frames[start:start + BARRIER_ROWS]:
                self.ports.send(0, f)
            self.bridge.frames += len(frames[start:start + BARRIER_ROWS])
            self._barrier(got)

    def _barrier(self, got: dict[Key, tuple[np.void, np.ndarray]]) -> None:
        for _ in range(BARRIER_TRIES):
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            self.bridge.barriers += 1
            self.ports.send(0, flush_frame(self.job, self.workers, self.seq))
            back: set[int] = set()
            deadline = time.monotonic() + BARRIER_TIMEOUT_S
            while len(back) < self.workers:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for port, data in self.ports.receive(min(left, 0.5)):
                    self._take(port, data, got, back)
            if len(back) == self.workers:
                return
            self.bridge.barrier_resends += 1
        raise RunFailed(f"BMv2 did not send the bridge's barrier back on every port within {BARRIER_TIMEOUT_S:g} s, "
                        f"{BARRIER_TRIES} times (stopped or overloaded); {self.where()}")

    def _take(self, port: int, data: bytes, got: dict[Key, tuple[np.void, np.ndarray]], back: set[int]) -> None:
        if len(data) <= _TYPE_AT or data[_TYPE_AT] not in (wire.MsgType.RESULT, wire.MsgType.FLUSHED):
            return  # not BMv2's answer (the kernel's own frames, or ours going out)
        try:
            body = wire.unframe(data)
        except ValueError:
            return
        h = np.frombuffer(body[:wire.AGG_HEADER.itemsize], wire.AGG_HEADER)[0]
        if data[_TYPE_AT] == wire.MsgType.FLUSHED:
            if int(h["chunk"]) == self.seq:
                back.add(port)
            return
        p = np.frombuffer(body[wire.AGG_HEADER.itemsize:], wire.PAYLOAD).astype(np.int32)
        self.bridge.results += 1
        got.setdefault((int(h["worker"]), int(h["flags"]) & wire.FLAG_COPY, int(h["slot"]), int(h["chunk"])), (h, p))

    def _merge(self, expected: Results, got: dict[Key, tuple[np.void, np.ndarray]]) -> Results:
        """The model's results with BMv2's headers and sums (every copy of a multicast checked alike)."""
        headers, payload = expected.headers.copy(), expected.payload.copy()
        for i, key_set in enumerate(_per_result(self._keys(expected), expected.headers, self.workers)):
            copies = [got[key] for key in key_set]
            h, p = copies[0]
            if any(int(c[0]["exponent"]) != int(h["exponent"]) or not np.array_equal(c[1], p) for c in copies[1:]):
                self.bridge.differs += 1
            row = np.zeros(self.k, np.int32)
            row[: len(p)] = p[: self.k]
            if (int(h["exponent"]) != int(headers[i]["exponent"]) or int(h["size"]) != int(headers[i]["size"])
                    or not np.array_equal(row, payload[i])):
                self.bridge.differs += 1
            headers[i]["exponent"], headers[i]["size"] = h["exponent"], h["size"]
            payload[i] = row
        return Results(headers, payload, expected.stamps, expected.sparse)


def _per_result(keys: list[Key], headers: np.ndarray, workers: int) -> list[list[Key]]:
    """``keys`` (``Bmv2Pool._keys``) cut into each result's: a multicast's ``workers``, a unicast's one."""
    out, at = [], 0
    for h in headers:
        n = workers if int(h["worker"]) == MULTICAST else 1
        out.append(keys[at:at + n])
        at += n
    return out


def _frame(h: np.void, p: np.ndarray) -> bytes:
    size = int(h["size"])
    body = np.asarray(p[: 64 * size], wire.PAYLOAD).tobytes() if size else b""
    return wire.frame(np.asarray(h, wire.AGG_HEADER).tobytes() + body)


def flush_frame(job: int, workers: int, seq: int) -> bytes:
    """The bridge's barrier as a frame (``wire.MsgType.FLUSH``, its sequence number in ``chunk``)."""
    h = np.zeros((), wire.AGG_HEADER)
    h["msg_type"], h["job"], h["num_workers"], h["chunk"] = wire.MsgType.FLUSH, job, workers, seq
    return wire.frame(h.tobytes())
