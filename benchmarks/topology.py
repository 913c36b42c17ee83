"""A job on nodes (docs/topology.md), two tables.

1. The same trace flat and on nodes of 8 workers: packed and spread, with one NIC a node and one
   a worker, on ina and ring.
2. ``--oversubscribed`` workers on nodes of 8 with a NIC a worker, 16-port leaves (two nodes a
   leaf), packed and spread, at oversubscription 1:1, 2:1 and 4:1; and INA hierarchical (its
   leaves aggregate first).

    .venv/bin/python benchmarks/topology.py [--trace mlp] [--workers 32] [--oversubscribed 64]
        [--fabrics ina,ring] [--bandwidth 100] [--iters 2]

Each row: the shape, the median emulated iteration, its exposed communication, the bytes on
the network's links (NICs and leaf-spine links) and the wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Hierarchy, Placement, Topology
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
    parser.add_argument("--oversubscribed", type=int, default=64, help="workers of the second table (0: skip it)")
    args = parser.parse_args()
    path = args.trace if os.path.exists(args.trace) else sample_path(args.trace)
    trace = load_trace(path)
    link = LinkSpec(bandwidth_bps=args.bandwidth * 1e9, latency_us=5.0)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.trace} at {args.workers} workers, {args.bandwidth:g} Gb/s NICs, 5 us, {args.iters} iterations\n")
    fabrics = args.fabrics.split(",")
    _table(trace, link, args.workers, args.iters, [(f, label, topo) for f in fabrics for label, topo in SHAPES])
    if args.oversubscribed:
        print(f"\n{args.oversubscribed} workers, 8 a node with a NIC each, 16-port leaves (two nodes a leaf):\n")
        rows = [(f, f"{place.value}, {r}:1", Topology(workers_per_node=8, nics_per_node=8, leaf_ports=16,
                                                          oversubscription=r, placement=place))
                for f in fabrics for place in (Placement.PACKED, Placement.SPREAD) for r in (1, 2, 4)]
        if "ina" in fabrics:  # its leaves aggregate first
            rows += [("ina", f"hierarchical, {r}:1", Topology(workers_per_node=8, nics_per_node=8, leaf_ports=16,
                                                               oversubscription=r, algorithm=Hierarchy.HIERARCHICAL))
                     for r in (1, 2, 4)]
        _table(trace, link, args.oversubscribed, args.iters, rows)


def _table(trace, link: LinkSpec, workers: int, iters: int, rows: list[tuple[str, str, Topology | None]]) -> None:
    print("| fabric | shape | iteration (median) | exposed comm | bytes on the links | wall |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for fabric, label, topo in rows:
        config = ReplayConfig(workers=workers, fabric=fabric, link=link, topology=topo, iters=iters)
        t0 = time.monotonic()
        report = replay(trace, config)
        wall = time.monotonic() - t0
        assert report.verification.ok and report.emulator.trustworthy
        exposed = sorted(it.exposed_comm_us for it in report.iterations)[len(report.iterations) // 2]
        print(f"| {fabric} | {label} | {report.summary.iteration_us_median / 1e3:.2f} ms | "
              f"{exposed / 1e3:.2f} ms | {report.summary.bytes_sent / 1e9:.2f} GB | {wall:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
