"""Two jobs sharing a spine (docs/topology.md, "Several jobs").

Two jobs of ``--workers`` each, on nodes of 8 workers with a NIC each, 16-port leaves (two nodes
a leaf), at oversubscription 1:1, 2:1 and 4:1; their nodes handed out contiguous (each job its own
leaves: they meet only in the switch) or interleaved (a node of each job on every leaf: they share
every leaf's links); flat INA, hierarchical INA, and the ring with each job's ranks packed on its
nodes and spread over them (every hop between nodes).

    .venv/bin/python benchmarks/jobs.py [--traces mlp,mlp] [--workers 32] [--fabrics ina,ina-hier,ring,ring-spread]
        [--bandwidth 100] [--iters 2] [--plot docs/topology/jobs-slowdown.png]

Each row: each job's median iteration alone and shared (over the iterations that ended while both
jobs ran) and its slowdown, the busiest link, and the wall time of the three replays (shared, each
alone).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Allocation, Hierarchy, Placement, Topology
from emu.replay import ReplayConfig
from emu.replay.jobs import Jobs, replay_jobs
from emu.traces import load_trace, sample_path

RATIOS = (1.0, 2.0, 4.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="mlp,mlp")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--fabrics", default="ina,ina-hier,ring,ring-spread")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="Gb/s of each NIC")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--plot", default=None, help="write the slowdowns as a PNG here")
    args = parser.parse_args()
    names = args.traces.split(",")
    traces = [load_trace(n if os.path.exists(n) else sample_path(n)) for n in names]
    link = LinkSpec(bandwidth_bps=args.bandwidth * 1e9, latency_us=5.0)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; jobs {names} at "
          f"{args.workers} workers each, 8 a node with a NIC each, 16-port leaves, {args.bandwidth:g} Gb/s, 5 us, "
          f"{args.iters} iterations\n")
    print("| fabric | nodes | ratio | job 0 alone | shared | slowdown | job 1 alone | shared | slowdown | "
          "busiest link | wall |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    points: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for fabric in args.fabrics.split(","):
        name, algorithm = ("ina", Hierarchy.HIERARCHICAL) if fabric == "ina-hier" else (fabric, Hierarchy.FLAT)
        placement = Placement.SPREAD if fabric == "ring-spread" else Placement.PACKED
        name = name.removesuffix("-spread")
        for allocation in Allocation:
            for ratio in RATIOS:
                topo = Topology(workers_per_node=8, nics_per_node=8, leaf_ports=16, oversubscription=ratio,
                                algorithm=algorithm, placement=placement)
                config = ReplayConfig(fabric=name, link=link, topology=topo, iters=args.iters)
                t0 = time.monotonic()
                report = replay_jobs(traces, config, Jobs((args.workers, args.workers), allocation), names)
                wall = time.monotonic() - t0
                assert report.verification.ok and report.emulator.trustworthy and report.jobs is not None
                a, b = report.jobs
                busiest = report.fabric.busiest_link or {}
                print(f"| {fabric} | {allocation.value} | {ratio:g}:1 | {_ms(a.alone_us)} | "
                      f"{_ms(a.shared_us)} | {a.slowdown:.3f} | {_ms(b.alone_us)} | "
                      f"{_ms(b.shared_us)} | {b.slowdown:.3f} | "
                      f"{busiest.get('kind', '-')} {100 * busiest.get('utilisation', 0):.0f}% | {wall:.1f} s |",
                      flush=True)
                points.setdefault((fabric, allocation.value), []).append((ratio, a.slowdown, b.slowdown))
    if args.plot:
        _plot(points, args.plot, names, args.workers)


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f} ms"


def _plot(points: dict[tuple[str, str], list[tuple[float, float, float]]], path: str, names: list[str],
          workers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, allocation in zip(axes, Allocation, strict=True):
        for (fabric, alloc), rows in points.items():
            if alloc != allocation.value:
                continue
            ratios = [r for r, _, _ in rows]
            ax.plot(ratios, [max(a, b) for _, a, b in rows], marker="o", label=fabric)
        ax.set_title(f"nodes {allocation.value}")
        ax.set_xlabel("oversubscription (x:1)")
        ax.set_xticks(RATIOS)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("slowdown (shared / alone)")
    axes[0].legend()
    fig.suptitle(f"two jobs ({' and '.join(names)}, {workers} workers each) sharing 16-port leaves")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
