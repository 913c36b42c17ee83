"""Sharded and split jobs at larger data-parallel sizes (docs/parallelism.md), two tables.

1. The FSDP sample (fsdp=4, four blocks of 512 x 512 sharded by ``fully_shard``) at 8 and 64
   shards on ina and ring: the iteration, its exposed communication, the bytes on the links.
2. The tensor-parallel sample (dp=2 x tp=2) at tp=2 x dp=4..64 on ina and ring, on nodes of 8
   workers with a NIC each (packed: each tensor-parallel pair inside a node, its all_reduces over
   the node's links; the data-parallel groups across nodes, through the switch's pools or rings).

    .venv/bin/python benchmarks/parallelism.py [--bandwidth 100] [--fsdp 8,64] [--dp 4,8,16,32,64]
        [--fabrics ina,ring] [--iters 3] [--json OUT.json]

Each row also gives the replay's wall time; every replay's verification must be ok and every
collective of every group accounted for (the script stops otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Topology
from emu.replay import ReplayConfig, replay
from emu.replay.plan.layout import parse_mesh
from emu.traces import load_trace, sample_path


def _row(trace, config: ReplayConfig) -> dict:
    t0 = time.monotonic()
    report = replay(trace, config)
    wall = time.monotonic() - t0
    par = report.parallelism
    assert report.verification.ok and par is not None and par.accounted, report.verification
    it = report.iterations[len(report.iterations) // 2]
    return {"fabric": config.fabric, "workers": config.workers, "mesh": par.mesh,
            "median_ms": report.summary.iteration_us_median / 1e3, "exposed_ms": it.exposed_comm_us / 1e3,
            "bytes_gb": report.summary.bytes_sent / 1e9, "fallbacks": report.fabric.fallbacks,
            "groups": {g.role: {"ran": list(g.ran), "size": g.size, "groups": g.groups, "inside_nodes": g.inside_nodes}
                       for g in par.groups},
            "checked": report.verification.elements_checked, "wall_s": wall}


def _print(rows: list[dict]) -> None:
    print("| fabric | mesh | median ms | exposed ms | GB on the links | how the groups ran | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ran = "; ".join(f"{role}: {', '.join(g['ran'])}{' (inside nodes)' if g['inside_nodes'] else ''}"
                        for role, g in r["groups"].items())
        print(f"| {r['fabric']} | {r['mesh']} | {r['median_ms']:.2f} | {r['exposed_ms']:.2f} | {r['bytes_gb']:.3f} | "
              f"{ran} | {r['wall_s']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", type=float, default=100.0, help="Gb/s of each link (NIC)")
    parser.add_argument("--fsdp", default="8,64", help="shard counts of the FSDP table")
    parser.add_argument("--dp", default="4,8,16,32,64", help="data-parallel sizes of the tp=2 table")
    parser.add_argument("--fabrics", default="ina,ring")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--json", help="also write every row here")
    args = parser.parse_args()
    link = LinkSpec(bandwidth_bps=args.bandwidth * 1e9, latency_us=5.0)
    fabrics = args.fabrics.split(",")
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.bandwidth:g} Gb/s links, 5 us, {args.iters} iterations\n")
    out: dict[str, list[dict]] = {"fsdp": [], "tp": []}
    fsdp = load_trace(sample_path("fsdp"))
    for fabric in fabrics:
        for shards in (int(x) for x in args.fsdp.split(",")):
            out["fsdp"].append(_row(fsdp, ReplayConfig(workers=shards, fabric=fabric, link=link, iters=args.iters)))
    print("FSDP (the fsdp sample) on one switch, a port a worker:\n")
    _print(out["fsdp"])
    tp = load_trace(sample_path("tp"))
    nodes = Topology(workers_per_node=8, nics_per_node=8)
    for fabric in fabrics:
        for dp in (int(x) for x in args.dp.split(",")):
            mesh = parse_mesh(f"dp={dp},tp=2")
            out["tp"].append(_row(tp, ReplayConfig(workers=mesh.size, fabric=fabric, link=link, iters=args.iters,
                                                   mesh=mesh, topology=nodes)))
    print("\ntp=2 x dp (the tp sample) on nodes of 8 workers, a NIC each, packed:\n")
    _print(out["tp"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
