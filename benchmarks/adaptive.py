"""Adaptive compression against a link whose bandwidth drops (docs/compression.md, "Adaptive").

For each fabric, worker count and compressor speed, replays the trace for ``--iters`` iterations
on a link of 100 Gb/s that drops to ``--to`` Gb/s at ``--at`` ms, three ways: uncompressed,
``--compress adaptive`` and ``--compress topk:FLOOR`` throughout, and prints a markdown table: the
median and mean iteration, bytes on the wire, the adaptive run's passes and its choices over
time, and the wall time (adaptive: every pass).

    .venv/bin/python benchmarks/adaptive.py [--trace mlp] [--workers 8,32] [--fabrics ring,ina]
        [--speeds 1,100] [--to 10] [--at 100] [--iters 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import ADAPTIVE_FLOOR, CompressOption
from emu.traces import load_trace, sample_path


def _choices(report) -> str:
    runs: list[list] = []
    for step in report.compression.adaptive.steps:
        label = "/".join(sorted(set(step.choices)))
        if runs and runs[-1][2] == label:
            runs[-1][1] = step.iteration
        else:
            runs.append([step.iteration, step.iteration, label])
    return ", ".join(f"{a}{'' if a == b else f'-{b}'} {label}" for a, b, label in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mlp")
    parser.add_argument("--workers", default="8,32")
    parser.add_argument("--fabrics", default="ring,ina")
    parser.add_argument("--speeds", default="1,100", help="--compress-speed values")
    parser.add_argument("--to", type=float, default=10.0, help="Gb/s after the drop")
    parser.add_argument("--at", type=float, default=100.0, help="ms: when the link drops")
    parser.add_argument("--iters", type=int, default=8)
    args = parser.parse_args()
    trace = load_trace(sample_path(args.trace) if "/" not in args.trace else args.trace)
    link = LinkSpec(bandwidth_bps=100e9, schedule=((0.0, 100e9), (args.at * 1e3, args.to * 1e9)))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; trace "
          f"{args.trace}, 100 Gb/s then {args.to:g} Gb/s from {args.at:g} ms, latency 5 us, {args.iters} "
          "iterations, payload scale auto, synchronized clock")
    print()
    print("| fabric | workers | speed | compress | median ms | mean ms | GB on the wire | passes | choices | wall s |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    start = time.perf_counter()
    for fabric in args.fabrics.split(","):
        for m in (int(x) for x in args.workers.split(",")):
            for speed in (float(x) for x in args.speeds.split(",")):
                for text in ("none", "adaptive", f"topk:{ADAPTIVE_FLOOR:g}"):
                    if text == "none" and speed != float(args.speeds.split(",")[0]):
                        continue  # nothing to compress: the speed changes nothing
                    t = time.perf_counter()
                    r = replay(trace, ReplayConfig(workers=m, fabric=fabric, iters=args.iters, link=link,
                                                   compress=CompressOption(text, speed)))
                    times = [it.emulated_us / 1e3 for it in r.iterations]
                    adaptive = r.compression is not None and r.compression.adaptive is not None
                    print(f"| {fabric} | {m} | {speed:g} | {text} | {statistics.median(times):.2f} "
                          f"| {statistics.fmean(times):.2f} | {r.summary.bytes_sent / 1e9:.2f} "
                          f"| {r.compression.adaptive.passes if adaptive else '-'} "
                          f"| {_choices(r) if adaptive else '-'} | {time.perf_counter() - t:.1f} |", flush=True)
    print()
    print(f"total wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
