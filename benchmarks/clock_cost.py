"""What a replay on the synchronized clock costs, against the work it cannot avoid.

For each case: the wall time of the replay (process start to stop, and per iteration), the
windows of the clock, the real bytes that crossed between processes, and the work bound: those
bytes over the switch's measured throughput plus one measured message round trip per window.
The round trip is measured here, in the same run (a zmq ping-pong between two forked processes
over ipc://, the replay's transport); the switch throughput is passed in (``--switch-gbps``,
from ``benchmarks/switch_throughput.py``; BENCHMARKS.md has the latest figure).

    .venv/bin/python benchmarks/clock_cost.py [--cases mlp:8:ina,mlp:8:ring,...] [--iters 2]
        [--processes 0,1,2] [--repeat 3] [--unpaced]

A case is TRACE:WORKERS:FABRIC[:PAYLOAD_SCALE]; without a payload scale, auto.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time

import zmq

from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path

DEFAULT_CASES = "mlp:8:ina,mlp:8:ring,mlp:8:ps,mlp:64:ring,mlp:64:ps,transformer:1024:ina"


def _echo(addr: str, n: int) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    for _ in range(n):
        s.send_multipart(s.recv_multipart())
    s.close(0)
    ctx.term()


def round_trip_us(n: int = 2000) -> float:
    """Median of a zmq DEALER-DEALER ping-pong between two processes (the replay's transport)."""
    workdir = tempfile.mkdtemp(prefix="emu-rtt-")
    addr = f"ipc://{workdir}/s"
    proc = multiprocessing.get_context("fork").Process(target=_echo, args=(addr, n))
    proc.start()
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(addr)
    times = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            s.send_multipart([b"G", b"x" * 17])
            if not s.poll(5000):
                raise RuntimeError("the echo process did not answer")
            s.recv_multipart()
            times.append(time.perf_counter() - t)
    finally:
        s.close(0)
        ctx.term()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)  # the bound socket's file outlives its close
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--processes", default="0", help="host processes to try; 0: the default")
    parser.add_argument("--unpaced", action="store_true",
                        help="also time the same replay on the wall clock unpaced (--tdf 1e-6): the work "
                             "the first wave's clock did before pacing, whose results were right only "
                             "while nothing reordered")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--switch-gbps", type=float, default=1.0,
                        help="the switch's measured throughput for 64-element packets (GB/s)")
    args = parser.parse_args()
    rtt = round_trip_us()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.iters} iteration(s), median of {args.repeat}; round trip {rtt:.0f} us (measured), "
          f"switch {args.switch_gbps:g} GB/s")
    print(f"{'case':>24} {'procs':>5} {'R':>5} {'wall s':>7} {'s/iter':>7} {'windows':>8} {'real MB':>8} "
          f"{'bound s':>8} {'x bound':>8} {'iteration ms':>13} {'verified':>8}"
          + (f" {'unpaced s':>9} {'x unpaced':>9}" if args.unpaced else ""))
    for case in args.cases.split(","):
        parts = case.split(":")
        name, workers, fabric = parts[0], int(parts[1]), parts[2]
        scale = int(parts[3]) if len(parts) > 3 else None
        trace = load_trace(sample_path(name) if name in ("mlp", "cnn", "transformer") else name)
        for procs in (int(p) for p in args.processes.split(",")):
            runs = []
            for _ in range(args.repeat):
                r = replay(trace, ReplayConfig(workers=workers, fabric=fabric, iters=args.iters,
                                               processes=procs or None, payload_scale=scale))
                runs.append(r)
            wall = statistics.median(r.emulator.wall_s for r in runs)
            r = runs[0]
            real = r.emulator.real_bytes or 0.0
            bound = real / (args.switch_gbps * 1e9) + (r.emulator.windows or 0) * rtt / 1e6
            print(f"{case:>24} {procs:>5} {r.emulator.payload_scale:>5} {wall:>7.2f} {wall / args.iters:>7.2f} "
                  f"{r.emulator.windows:>8} {real / 1e6:>8.1f} {bound:>8.2f} {wall / bound:>8.1f} "
                  f"{r.summary.iteration_us_median / 1000:>13.2f} {'ok' if r.verification.ok else 'FAILED':>8}",
                  end="", flush=True)
            if args.unpaced:
                unpaced = statistics.median(
                    replay(trace, ReplayConfig(workers=workers, fabric=fabric, iters=args.iters, processes=procs or None,
                                               payload_scale=r.emulator.payload_scale, tdf=1e-6)).emulator.wall_s
                    for _ in range(args.repeat))
                print(f" {unpaced:>9.2f} {wall / unpaced:>9.2f}", end="")
            print(flush=True)


if __name__ == "__main__":
    main()
