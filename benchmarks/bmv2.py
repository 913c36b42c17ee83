"""emu's P4 program on BMv2 against the software switch: same numbers, and what BMv2 costs.

For each worker count, replays the trace on ``--fabric bmv2`` and on ``--fabric ina`` (the
synchronized clock, the same payload scale and seed) and prints a markdown table: the emulated
iteration on both and whether every emulated number is identical, both verifications, the
frames the bridge sent BMv2 and BMv2's contribution rate (frames over the bmv2 run's wall time,
setup included: compile, veths, pipeline), the bridge's resends, and both wall times. Needs root,
p4c-bm2-ss, simple_switch_grpc and finsy (docs/p4.md).

    sudo .venv/bin/python benchmarks/bmv2.py [--trace mlp] [--workers 2,4,8,16,32] [--iters 2]
        [--payload-scale 256]
"""

from __future__ import annotations

import argparse
import os
import platform

from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path


def _same(a, b) -> bool:
    """Every emulated number of the two reports alike: iterations, bytes, packets, results, windows."""
    return ([it.emulated_us for it in a.iterations] == [it.emulated_us for it in b.iterations]
            and a.summary.bytes_sent == b.summary.bytes_sent and a.fabric.packets == b.fabric.packets
            and a.fabric.results == b.fabric.results and a.emulator.windows == b.emulator.windows
            and a.verification.elements_checked == b.verification.elements_checked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mlp")
    parser.add_argument("--workers", default="2,4,8,16,32")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--payload-scale", type=int, default=256)
    args = parser.parse_args()
    trace = load_trace(sample_path(args.trace) if "/" not in args.trace else args.trace)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; trace "
          f"{args.trace}, {args.iters} iterations, payload scale {args.payload_scale}, synchronized clock, "
          "defaults otherwise")
    print()
    print("| workers | bmv2 iteration ms | ina iteration ms | identical | verified | frames to BMv2 | "
          "contributions/s | resent | bmv2 wall s | ina wall s |")
    print("| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for m in (int(x) for x in args.workers.split(",")):
        got = {f: replay(trace, ReplayConfig(workers=m, fabric=f, iters=args.iters, payload_scale=args.payload_scale))
               for f in ("bmv2", "ina")}
        b, i = got["bmv2"], got["ina"]
        bridge = b.fabric.bridge
        ok = "both" if b.verification.ok and i.verification.ok else f"bmv2 {b.verification.ok}, ina {i.verification.ok}"
        print(f"| {m} | {b.summary.iteration_us_median / 1e3:.3f} | {i.summary.iteration_us_median / 1e3:.3f} | "
              f"{'yes' if _same(b, i) else 'NO'} | {ok} | {bridge.frames:,} | {bridge.frames / b.emulator.wall_s:,.0f} | "
              f"{bridge.resent} | {b.emulator.wall_s:.1f} | {i.emulator.wall_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
