"""Switch throughput: payload bytes of all workers' contributions accepted per wall second.

A driver process plays H worker hosts in lockstep (as replay's hosts send): each
round, every host sends one batch with its workers' packets for the next S chunks
of the stream; the switch process (the real one, ``emu.replay.switch.daemon``) aggregates
and sends each host its results; the driver waits for them before the next round.
Payload is fixed random int32 made once, so the figure is the switch and the
transport alone, not payload generation.

    .venv/bin/python benchmarks/switch_throughput.py [--seconds 3] [--workers 2,8,32,128]
        [--batch 64,256,1024] [--elements 64,256] [--hosts 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import statistics
import struct
import tempfile
import time

import numpy as np
import zmq

from emu.emulator.protocol.transport import AGG, HELLO
from emu.emulator.protocol.wire import AGG_HEADER, FLAG_COPY, MsgType
from emu.replay.switch.daemon import SwitchSetup, switch_main


def _headers(workers: range, chunks: np.ndarray, slots: int, total: int) -> np.ndarray:
    w = np.repeat(np.asarray(workers), len(chunks))
    c = np.tile(chunks, len(workers))
    h = np.zeros(len(w), AGG_HEADER)
    h["msg_type"] = MsgType.CONTRIB
    h["flags"] = (c // slots) % 2 * FLAG_COPY
    h["worker"] = w
    h["num_workers"] = total
    h["slot"] = c % slots
    h["chunk"] = c
    return h


def measure(workers: int, batch: int, elements: int, hosts: int, seconds: float) -> tuple[float, int]:
    """Accepted payload bytes per second; the pool has 2 x batch slots, so that each host keeps two
    messages in flight (the next half window goes out while the switch works on the previous one)."""
    hosts = min(hosts, workers)
    slots = 2 * batch
    tmp = tempfile.mkdtemp(prefix="emu-bench-")
    split = [(i * workers // hosts, (i + 1) * workers // hosts) for i in range(hosts)]
    setup = SwitchSetup(address=f"ipc://{tmp}/s", control_addr=f"ipc://{tmp}/c", workers=workers, slots=slots,
                        elements=elements, fabric="ina", worker_hosts=tuple(split),
                        endpoint_host=tuple(h for h, (a, b) in enumerate(split) for _ in range(a, b)))
    proc = multiprocessing.get_context("fork").Process(target=switch_main, args=(setup,), daemon=True)
    proc.start()
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []
    ctrl = ctx.socket(zmq.ROUTER)
    try:
        ctrl.bind(setup.control_addr)
        for h in range(hosts):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"h{h}".encode())
            s.connect(setup.address)
            s.send(HELLO)
            socks.append(s)
        ident, _ = ctrl.recv_multipart()  # the switch is ready once every host said hello
        rng = np.random.default_rng(0)
        # the payload frame in network order, made once: the driver must not eat the switch's CPU
        wire = [np.ascontiguousarray(rng.integers(-(2**20), 2**20, (batch * (b - a), elements), dtype=np.int32)
                                     .astype(">i4")) for a, b in split]
        stamps = [np.zeros(2 * batch * (b - a)).tobytes() for a, b in split]
        meta = [struct.pack("<II", batch * (b - a), elements) for a, b in split]
        # the sparse stream's (block, next) and the packets each row stands for: zeros and ones
        # (emu.emulator.protocol.transport.AggBatch's frames)
        extra = [(np.zeros(2 * batch * (b - a), "<u4").tobytes(), np.ones(batch * (b - a), "<f8").tobytes())
                 for a, b in split]

        def send(half: int) -> None:
            chunks = np.arange(half * batch, (half + 1) * batch)
            for h, (s, (a, b)) in enumerate(zip(socks, split, strict=True)):
                s.send_multipart([AGG, meta[h], _headers(range(a, b), chunks, slots, workers), wire[h], stamps[h],
                                  *extra[h]], copy=False)

        accepted, halves = 0, 0
        send(0)
        send(1)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for s in socks:  # results of the oldest half window (any number of messages)
                got = 0
                while got < batch:
                    frames = s.recv_multipart(copy=False)
                    got += len(frames[2].buffer) // AGG_HEADER.itemsize
            accepted += workers * batch * elements * 4
            send(halves + 2)
            halves += 1
        elapsed = time.perf_counter() - start
        for _ in range(2):  # the two half windows still in flight
            for s in socks:
                got = 0
                while got < batch:
                    got += len(s.recv_multipart(copy=False)[2].buffer) // AGG_HEADER.itemsize
        ctrl.send_multipart([ident, b'{"type":"stop"}'])
        ctrl.recv_multipart()
        return accepted / elapsed, halves
    finally:
        for sock in socks + [ctrl]:
            sock.close(linger=0)
        ctx.term()
        proc.join(2)
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", default="2,8,32,128")
    parser.add_argument("--batch", default="64,256,1024", help="packets per worker per message (the window)")
    parser.add_argument("--elements", default="64,256")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.hosts} sending hosts; median of {args.repeat} runs of {args.seconds:g} s")
    print(f"{'workers':>8} {'batch':>6} {'elements':>8} {'GB/s':>8} {'messages/s':>11}")
    for k in (int(x) for x in args.elements.split(",")):
        for w in (int(x) for x in args.workers.split(",")):
            for b in (int(x) for x in args.batch.split(",")):
                runs = [measure(w, b, k, args.hosts, args.seconds) for _ in range(args.repeat)]
                gbps = statistics.median(r[0] for r in runs) / 1e9
                rps = statistics.median(r[1] for r in runs) / args.seconds
                print(f"{w:>8} {b:>6} {k:>8} {gbps:>8.2f} {rps * min(args.hosts, w):>11.1f}", flush=True)


if __name__ == "__main__":
    main()
