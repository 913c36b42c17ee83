"""Replay wall time against workers: how the emulator's cost grows with M.

Replays a shipped sample on each fabric at several worker counts with a fixed
payload scale and the time dilation on auto (the smallest at which the emulator keeps
up, with ``--clock wall``; the default is the synchronized clock), and prints the dilation (- on the
synchronized clock), the wall time of the replay (calibration not
included), the emulated iteration time, whether the run is trustworthy and verified.

    .venv/bin/python benchmarks/replay_scaling.py [--trace mlp] [--workers 2,8,32,64]
        [--fabrics ina,ring,ps] [--payload-scale 16] [--iters 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource

from emu.replay import ReplayConfig, replay
from emu.replay.config.options import Clock
from emu.traces import load_trace, sample_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mlp")
    parser.add_argument("--workers", default="2,8,32,64")
    parser.add_argument("--fabrics", default="ina,ring,ps")
    parser.add_argument("--payload-scale", type=int, default=16)
    parser.add_argument("--iters", type=int, default=1)
    parser.add_argument("--clock", choices=["sync", "wall"], default="sync")
    args = parser.parse_args()
    trace = load_trace(sample_path(args.trace) if args.trace in ("mlp", "cnn", "transformer") else args.trace)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"trace {args.trace}, payload scale {args.payload_scale}, {args.iters} iteration(s), clock {args.clock}")
    print(f"{'fabric':>6} {'workers':>8} {'tdf':>7} {'wall s':>8} {'iteration ms':>13} {'trusted':>8} "
          f"{'verified':>9} {'max RSS MB':>11}")
    for fabric in args.fabrics.split(","):
        for m in (int(x) for x in args.workers.split(",")):
            r = replay(trace, ReplayConfig(workers=m, fabric=fabric, iters=args.iters, clock=Clock(args.clock),
                                           payload_scale=args.payload_scale))
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            tdf = "-" if r.emulator.tdf is None else f"{r.emulator.tdf:.1f}"
            print(f"{fabric:>6} {m:>8} {tdf:>7} {r.emulator.wall_s:>8.2f} "
                  f"{r.summary.iteration_us_median / 1000:>13.2f} {str(r.emulator.trustworthy):>8} "
                  f"{'ok' if r.verification.ok else 'FAILED':>9} {rss:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
