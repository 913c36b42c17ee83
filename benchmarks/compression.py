"""Every compressor on a shipped trace: iteration time, bytes on the wire and error.

For each compressor of ``emu.emulator.compression.compressors`` (its default parameter; ``--compressors`` to
choose), each worker count and bandwidth, replays the trace (one iteration, latency 5 us, payload
scale auto, the synchronized clock) on ``ring`` and on ``ina`` and prints a markdown table: the
emulated median iteration, its compute (compression included), the bytes on the wire
(``summary.bytes_sent``), the compressor's ratio, the error and cosine of one step's aggregate
(docs/compression.md), and the wall time of the replay.

    .venv/bin/python benchmarks/compression.py [--trace mlp] [--workers 8,32,128]
        [--bandwidth 10,25,100] [--fabrics ring,ina] [--compressors none,fp16,topk,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.compression.compressors import COMPRESSORS
from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import CompressOption
from emu.traces import load_trace, sample_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mlp")
    parser.add_argument("--workers", default="8,32,128")
    parser.add_argument("--bandwidth", default="10,25,100", help="Gb/s")
    parser.add_argument("--fabrics", default="ring,ina")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    args = parser.parse_args()
    trace = load_trace(sample_path(args.trace) if "/" not in args.trace else args.trace)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; trace "
          f"{args.trace}, latency 5 us, 1 iteration, payload scale auto, synchronized clock")
    print()
    print("| compressor | fabric | workers | Gb/s | iteration ms | compute ms | MB on the wire | ratio | error "
          "| cosine | verification | wall s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    start = time.perf_counter()
    for name in args.compressors.split(","):
        for m in (int(x) for x in args.workers.split(",")):
            for fabric in args.fabrics.split(","):
                for gbps in (float(x) for x in args.bandwidth.split(",")):
                    t = time.perf_counter()
                    r = replay(trace, ReplayConfig(workers=m, fabric=fabric, iters=1,
                                                   link=LinkSpec(bandwidth_bps=gbps * 1e9),
                                                   compress=CompressOption(name)))
                    c = r.compression
                    ratio, error, cosine = ("1.0", "0", "1") if c is None else (
                        f"{c.ratio:.1f}", f"{c.error:.3g}", f"{c.cosine:.3f}")
                    it = r.iterations[0]
                    print(f"| {name} | {fabric} | {m} | {gbps:g} | {r.summary.iteration_us_median / 1e3:.2f} "
                          f"| {it.compute_us / 1e3:.2f} | {r.summary.bytes_sent / 1e6:.1f} | {ratio} | {error} "
                          f"| {cosine} | {'ok' if r.verification.ok else 'FAILED'} | {time.perf_counter() - t:.1f} |",
                          flush=True)
    print()
    print(f"total wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
