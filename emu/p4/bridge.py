"""The bridge between emu's hosts and BMv2: batches in, Ethernet frames out, and back.

It takes the switch process's place in a ``--fabric bmv2`` replay: contributions
arrive from the hosts as batches over pyzmq, leave as one frame each (``wire.frame``)
on the worker's veth towards BMv2, and BMv2's results come back as frames on the
workers' veths; the bridge groups them into result batches per host. BMv2 carries
no emulated time, so the bridge keeps it: a result is stamped with the latest
arrival stamp of the contributions of its chunk (a retransmission's answer, with that
retransmission's stamp if later), exactly what the software switch computes.
Point-to-point segments (ring and fallback collectives) are forwarded by the bridge.
"""

from __future__ import annotations

import select
import socket
from collections import defaultdict

import numpy as np

from emu.emulator.protocol import wire
from emu.emulator.protocol.transport import AggBatch

ETH_P_ALL = 0x0003
MAX_FRAME = 2048


class Bmv2Ports:
    """Raw sockets on the host side of every worker's veth."""

    def __init__(self, interfaces: list[str], elements: int) -> None:
        self.k = elements
        self.socks = []
        for name in interfaces:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind((name, 0))
            sock.setblocking(False)
            self.socks.append(sock)
        self.stamps: dict[int, np.ndarray] = {}  # chunk -> latest (first, last) contribution stamps

    def fileno_map(self) -> dict[int, int]:
        return {s.fileno(): w for w, s in enumerate(self.socks)}

    def submit(self, batch: AggBatch) -> None:
        for h, payload, stamp in zip(batch.headers, batch.payload, batch.stamps, strict=True):
            chunk = int(h["chunk"])
            prev = self.stamps.get(chunk)
            self.stamps[chunk] = np.maximum(prev, stamp) if prev is not None else np.array(stamp, float)
            body = payload[: 64 * int(h["size"])] if int(h["size"]) else None
            self.socks[int(h["worker"])].send(wire.frame(wire.agg_packet(h, body)))

    def drain(self) -> AggBatch | None:
        """Every result frame waiting on the ports, as one batch (destination in ``worker``)."""
        rows = []
        ready, _, _ = select.select(self.socks, [], [], 0)
        for sock in ready:
            while True:
                try:
                    data = sock.recv(MAX_FRAME)
                except BlockingIOError:
                    break
                try:
                    h, payload = wire.parse_agg_packet(wire.unframe(data))
                except ValueError:
                    continue  # not an emu frame (or one of our own going out)
                if int(h["msg_type"]) != wire.MsgType.RESULT:
                    continue
                rows.append((h, payload))
        if not rows:
            return None
        headers = np.zeros(len(rows), wire.AGG_HEADER)
        payload = np.zeros((len(rows), self.k), np.int32)
        stamps = np.zeros((len(rows), 2))
        for i, (h, p) in enumerate(rows):
            headers[i] = h
            payload[i, : len(p)] = p
            stamps[i] = self.stamps.get(int(h["chunk"]), np.zeros(2))
        return AggBatch(headers, payload, stamps)

    def route(self, batch: AggBatch, worker_hosts: tuple[tuple[int, int], ...]) -> dict[int, AggBatch]:
        out: dict[int, list[int]] = defaultdict(list)
        dest = batch.headers["worker"].astype(np.int64)
        for h, (first, last) in enumerate(worker_hosts):
            rows = np.flatnonzero((dest >= first) & (dest < last))
            if len(rows):
                out[h] = list(rows)
        return {h: batch.take(np.asarray(r)) for h, r in out.items()}

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
