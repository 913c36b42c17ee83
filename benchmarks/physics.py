"""Physics checks: the emulated time of one large all_reduce against the formulas.

For a trace of one all_reduce and no compute (``emu.traces.synthetic``), replays it on
``ina`` and ``ring`` at several worker counts and bandwidths (tdf and payload scale
on auto) and compares the emulated iteration time with ``emu.emulator.physics.forms``:
``ina`` against S/B + 2L, ``ring`` against 2(M-1)/M x S/B + 2(M-1) hops (S: wire bytes).
A real ring past 512 workers is millions of messages: those cells give the analytic
estimate only. Also prints the emulation cost (wall over emulated time, and against
the bound set by the real bytes over the switch's measured throughput) and memory.

    .venv/bin/python benchmarks/physics.py [--mb 64] [--workers 2,8,32,128,512]
        [--bandwidth 1,10,100,400] [--latency 5] [--fabrics ina,ring]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource

from emu.emulator.fabric import P2P_WORKER_LIMIT
from emu.emulator.links.spec import LinkSpec
from emu.emulator.physics import forms as physics
from emu.replay import ReplayConfig, replay
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

RING_LIMIT = P2P_WORKER_LIMIT
SWITCH_GBPS = 1.3  # measured by benchmarks/switch_throughput.py (64-element packets, BENCHMARKS.md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=64.0, help="all_reduce size in MB of float32")
    parser.add_argument("--workers", default="2,8,32,128,512")
    parser.add_argument("--bandwidth", default="1,10,100,400", help="Gb/s")
    parser.add_argument("--latency", type=float, default=5.0, help="one-way, microseconds")
    parser.add_argument("--fabrics", default="ina,ring")
    args = parser.parse_args()
    count = int(args.mb * 1e6 / 4)
    trace = single_collective(CollKind.ALL_REDUCE, count)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"one all_reduce of {count * 4 / 1e6:g} MB float32, latency {args.latency:g} us, tdf and payload "
          "scale auto")
    print(f"{'fabric':>6} {'M':>5} {'Gb/s':>5} {'emulated ms':>12} {'formula ms':>11} {'error %':>8} "
          f"{'trusted':>8} {'tdf':>7} {'R':>6} {'wall s':>7} {'cost':>8} {'bound':>7} {'MB/worker':>9}")
    for fabric in args.fabrics.split(","):
        for m in (int(x) for x in args.workers.split(",")):
            for gbps in (float(x) for x in args.bandwidth.split(",")):
                link = LinkSpec(bandwidth_bps=gbps * 1e9, latency_us=args.latency)
                if fabric == "ina":
                    formula = physics.ina_time_us(count, link)
                else:
                    formula = physics.ring_time_us(count, 4, m, link)
                if fabric == "ring" and m > RING_LIMIT:
                    print(f"{fabric:>6} {m:>5} {gbps:>5g} {'-':>12} {formula / 1000:>11.3f} {'-':>8} "
                          f"{'analytic':>8}  (a real ring of {m} is {physics.ring_messages(m):,} messages)")
                    continue
                before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                r = replay(trace, ReplayConfig(workers=m, fabric=fabric, link=link, iters=1))
                rss = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
                emulated = r.summary.iteration_us_median
                real_bytes = r.summary.bytes_sent / r.emulator.payload_scale
                bound = real_bytes / (SWITCH_GBPS * 1e9) / (emulated / 1e6)
                per_worker = rss / max(1, m // r.emulator.processes)
                print(f"{fabric:>6} {m:>5} {gbps:>5g} {emulated / 1000:>12.3f} {formula / 1000:>11.3f} "
                      f"{100 * (emulated - formula) / formula:>8.2f} {str(r.emulator.trustworthy):>8} "
                      f"{'-' if r.emulator.tdf is None else format(r.emulator.tdf, '.3g'):>7} {r.emulator.payload_scale:>6} {r.emulator.wall_s:>7.1f} "
                      f"{r.emulator.run_s / (emulated / 1e6):>8.0f} {bound:>7.1f} {per_worker:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
