"""A stand-in for BMv2 behind the bridge's ports: the P4 program's behaviour, packet by packet.

It answers as ``emu/p4/emu_agg.p4`` does (emu's software switch applied one packet at a time,
which the conformance vectors hold both to): a completed copy's result multicast with each
port's worker id, a retransmission of a complete copy answered on the port it came in, a FLUSH
sent back on every port as FLUSHED. It can lose frames, as an overloaded BMv2 does, going in
(``drop_in``: the indices of the contributions it ignores) or out (``drop_out``: of the result frames
it would send), to test the bridge's resends without BMv2.
"""

from __future__ import annotations

import numpy as np

from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch


class FakeBmv2:
    def __init__(self, workers: int, slots: int, elements: int = 64, job: int = 0,
                 drop_in: frozenset[int] = frozenset(), drop_out: frozenset[int] = frozenset(),
                 drop_flush: int = 0) -> None:
        self.ports = workers
        self.switch = AggregationSwitch(slots, workers, elements, job)
        self.k = elements
        self.drop_in, self.drop_out = drop_in, drop_out
        self.drop_flush = drop_flush  # the first this many barriers are lost
        self.seen = self.sent = self.flushes = 0
        self.out: list[tuple[int, bytes]] = []
        self.closed = False

    def send(self, port: int, frame: bytes) -> None:
        body = wire.unframe(frame)
        h = np.frombuffer(body[:wire.AGG_HEADER.itemsize], wire.AGG_HEADER)[0]
        if int(h["msg_type"]) == wire.MsgType.FLUSH:
            self.flushes += 1
            if self.flushes > self.drop_flush:
                self._emit(h, np.zeros(0, np.int32), wire.MsgType.FLUSHED, range(self.ports))
            return
        self.seen += 1
        if self.seen - 1 in self.drop_in:
            return
        p = np.zeros((1, self.k), np.int32)
        values = np.frombuffer(body[wire.AGG_HEADER.itemsize:], wire.PAYLOAD).astype(np.int32)
        p[0, : len(values)] = values
        res = self.switch.process(np.array([h]), p)
        for rh, rp in zip(res.headers, res.payload, strict=True):
            multicast = int(rh["worker"]) == MULTICAST
            dests = range(self.ports) if multicast else (port,)
            self._emit(rh, rp[: 64 * int(rh["size"])], wire.MsgType.RESULT, dests, multicast)

    def _emit(self, h: np.void, payload: np.ndarray, kind: int, ports: range | tuple[int, ...],
              rewrite: bool = True) -> None:
        for port in ports:
            out = np.array(h, wire.AGG_HEADER)
            out["msg_type"] = kind
            if rewrite:
                out["worker"] = port  # egress writes the replica id: the port's worker
            lost = False
            if kind == wire.MsgType.RESULT:  # drop_out counts result frames
                self.sent += 1
                lost = self.sent - 1 in self.drop_out
            if not lost:
                self.out.append((port, wire.frame(out.tobytes() + np.asarray(payload, wire.PAYLOAD).tobytes())))

    def receive(self, timeout_s: float) -> list[tuple[int, bytes]]:
        out, self.out = self.out, []
        return out

    def close(self) -> None:
        self.closed = True
