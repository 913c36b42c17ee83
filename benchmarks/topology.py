"""A job on nodes (docs/topology.md): the same trace, flat and on nodes of 8 workers, packed and
spread, with one NIC a node and one a worker, on ina and ring; each replay's emulated iteration
against the closed form of its all_reduces (docs/physics.md, "On a topology"), and the wall time.

    .venv/bin/python benchmarks/topology.py [--trace mlp] [--workers 32] [--fabrics ina,ring]
        [--bandwidth 100] [--iters 2]

Prints a markdown table: the placement, the median emulated iteration, its exposed
communication, the bytes on the NICs, and the wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.links import LinkSpec
from emu.emulator.topology import Placement, Topology
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path

SHAPES: tuple[tuple[str, Topology | None], ...] = (
    ("one switch (a port a worker)", None),
    ("8/node packed, 1 NIC", Topology(workers_per_node=8)),
    ("8/node spread, 1 NIC", Topology(workers_per_node=8, placement=Placement.SPREAD)),
    ("8/node packed, 8 NICs", Topology(workers_per_node=8, nics_per_node=8)),
    ("8/node spread, 8 NICs", Topology(workers_per_node=8, nics_per_node=8, placement=Placement.SPREAD)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mlp")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--fabrics", default="ina,ring")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="Gb/s of each NIC")
    parser.add_argument("--iters", type=int, default=2)
    args = parser.parse_args()
    path = args.trace if os.path.exists(args.trace) else sample_path(args.trace)
    trace = load_trace(path)
    link = LinkSpec(bandwidth_bps=args.bandwidth * 1e9, latency_us=5.0)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.trace} at {args.workers} workers, {args.bandwidth:g} Gb/s NICs, 5 us, {args.iters} iterations\n")
    print("| fabric | shape | iteration (median) | exposed comm | bytes on NICs | wall |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for fabric in args.fabrics.split(","):
        for label, topo in SHAPES:
            config = ReplayConfig(workers=args.workers, fabric=fabric, link=link, topology=topo, iters=args.iters)
            t0 = time.monotonic()
            report = replay(trace, config)
            wall = time.monotonic() - t0
            assert report.verification.ok and report.emulator.trustworthy
            exposed = sorted(it.exposed_comm_us for it in report.iterations)[len(report.iterations) // 2]
            print(f"| {fabric} | {label} | {report.summary.iteration_us_median / 1e3:.2f} ms | "
                  f"{exposed / 1e3:.2f} ms | {report.summary.bytes_sent / 1e9:.2f} GB | {wall:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
