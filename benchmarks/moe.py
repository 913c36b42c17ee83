"""A mixture of experts on a network (docs/moe.md): the shipped moe sample (a real capture, ep=4,
its router's uneven token counts) laid out at 64 and 256 workers (dp=8 x ep=8, dp=16 x ep=16) on
one flat switch and on nodes of 8 workers behind leaves of 4 NIC ports at 1:1, 2:1 and 4:1,
workers packed or spread over the nodes, with the measured routing and with balanced routing
(--moe-imbalance 1), on ina and ring.

    .venv/bin/python benchmarks/moe.py [--sizes 64,256] [--iters 2] [--bandwidth 100]
        [--json docs/moe/moe-100g.json] [--plot docs/moe]   (figures moe-100g-*.png)

Each row: the median emulated iteration, and where a worker's iteration goes (the mean over every
worker and iteration, from the replay's own spans): compute, time blocked on all_to_alls (the token
exchanges, including waiting for the slowest expert), time blocked on all_reduces (the dense and
expert gradients); and the wall time. Every run is verified (every element checked) or the script
stops.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Placement, Topology
from emu.replay import ReplayConfig, replay
from emu.replay.plan.layout import parse_mesh
from emu.traces import load_trace, sample_path

MESHES = {64: "dp=8,ep=8", 256: "dp=16,ep=16"}


@dataclass(frozen=True)
class Case:
    fabric: str
    shape: str  # "flat", or "4-port leaves R:1"
    placement: str  # "-" on the flat switch
    routing: str  # "measured" or "balanced"
    topology: Topology | None


def cases(fabrics: list[str]) -> list[Case]:
    out = []
    for f in fabrics:
        for routing in ("measured", "balanced"):
            out.append(Case(f, "flat", "-", routing, None))
        for place in (Placement.PACKED, Placement.SPREAD):
            for ratio in (1, 2, 4):
                for routing in ("measured", "balanced") if ratio == 4 else ("measured",):
                    topo = Topology(workers_per_node=8, leaf_ports=4, oversubscription=ratio, placement=place)
                    out.append(Case(f, f"4-port leaves {ratio}:1", place.value, routing, topo))
    return out


def breakdown(chrome: Path) -> dict[str, float]:
    """Per worker and iteration (mean): compute, and the waits by the kind of collective they end
    with (a wait ends when the last collective it names completes)."""
    events = json.loads(chrome.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    ends: dict[tuple[int, int, float], str] = {}
    totals: dict[str, float] = defaultdict(float)
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        if e["cat"] == "comm":
            ends[(e["pid"], e["tid"], round(e["ts"] + e["dur"], 3))] = e["name"]
    workers = {(e["pid"], e["tid"]) for e in spans}
    for e in spans:
        if e["cat"] == "compute":
            totals["compute"] += e["dur"]
        elif e["cat"] == "wait":
            kind = ends.get((e["pid"], e["tid"], round(e["ts"] + e["dur"], 3)), "other")
            totals[f"blocked on {kind}"] += e["dur"]
    return {k: v / len(workers) for k, v in totals.items()}


def run(trace, case: Case, workers: int, iters: int, link: LinkSpec) -> dict:
    mesh = parse_mesh(MESHES[workers])
    config = ReplayConfig(workers=workers, fabric=case.fabric, iters=iters, link=link, mesh=mesh,
                          topology=case.topology, moe_imbalance=1.0 if case.routing == "balanced" else None)
    with tempfile.TemporaryDirectory() as tmp:
        chrome = Path(tmp) / "spans.json"
        start = time.perf_counter()
        report = replay(trace, config, chrome_trace=chrome)
        wall = time.perf_counter() - start
        if not report.verification.ok:
            raise SystemExit(f"{case}: the replay did not verify")
        parts = {k: v / iters for k, v in breakdown(chrome).items()}
    return {"workers": workers, "mesh": MESHES[workers], "fabric": case.fabric, "shape": case.shape,
            "placement": case.placement, "routing": case.routing,
            "iteration_us": report.summary.iteration_us_median, **{f"{k}_us": v for k, v in parts.items()},
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--fabrics", default="ina,ring")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--bandwidth", type=float, default=100.0, help="Gb/s of each NIC (a port a worker when flat)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--plot", type=Path, help="write the figures into this folder")
    parser.add_argument("--from-json", type=Path, help="plot these rows (a former --json) without replaying")
    args = parser.parse_args()
    if args.from_json:
        plot(json.loads(args.from_json.read_text()), args.plot or args.from_json.parent, f"moe-{args.bandwidth:g}g",
             f"{args.bandwidth:g} Gb/s")
        return
    trace = load_trace(sample_path("moe"))
    link = LinkSpec(bandwidth_bps=args.bandwidth * 1e9, latency_us=5.0)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; moe sample, "
          f"{args.bandwidth:g} Gb/s, 5 us, {args.iters} iterations\n")
    print(f"{'workers':>7} {'fabric':>6} {'shape':>20} {'placement':>9} {'routing':>8} {'iteration':>10} "
          f"{'compute':>8} {'a2a':>7} {'allred':>7} {'wall':>6}")
    rows = []
    for workers in (int(x) for x in args.sizes.split(",")):
        for case in cases(args.fabrics.split(",")):
            row = run(trace, case, workers, args.iters, link)
            rows.append(row)
            print(f"{workers:>7} {case.fabric:>6} {case.shape:>20} {case.placement:>9} {case.routing:>8} "
                  f"{row['iteration_us'] / 1e3:>8.2f}ms {row.get('compute_us', 0) / 1e3:>8.2f} "
                  f"{row.get('blocked on all_to_all_us', 0) / 1e3:>7.2f} {row.get('blocked on all_reduce_us', 0) / 1e3:>7.2f} "
                  f"{row['wall_s']:>5.1f}s", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot, f"moe-{args.bandwidth:g}g", f"{args.bandwidth:g} Gb/s")


def plot(rows: list[dict], folder: Path, prefix: str, bandwidth: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    sizes = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 5), squeeze=False)
    for ax, workers in zip(axes[0], sizes, strict=True):
        chosen = [r for r in rows if r["workers"] == workers and r["routing"] == "measured"]
        labels = [f"{r['fabric']}\n{r['shape'].replace('4-port leaves ', '')}\n{r['placement']}" for r in chosen]
        bottom = [0.0] * len(chosen)
        for key, colour in (("compute_us", "#999999"), ("blocked on all_to_all_us", "#d62728"),
                            ("blocked on all_reduce_us", "#1f77b4")):
            values = [r.get(key, 0.0) / 1e3 for r in chosen]
            ax.bar(range(len(chosen)), values, bottom=bottom, color=colour, label=key.removesuffix("_us"))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(chosen)), labels, fontsize=6)
        ax.set_ylabel("ms a worker an iteration (mean)")
        ax.set_title(f"moe at {workers} workers ({MESHES[workers]}), {bandwidth}, measured routing")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"{prefix}-breakdown.png", dpi=110)
    fig, ax = plt.subplots(figsize=(8, 5))
    for routing, style in (("measured", "-o"), ("balanced", "--s")):
        for fabric in sorted({r["fabric"] for r in rows}):
            for shape in ("flat", "4-port leaves 4:1"):
                pts = [(r["workers"], r["iteration_us"] / 1e3) for r in rows if r["fabric"] == fabric and
                       r["routing"] == routing and r["shape"] == shape and r["placement"] in ("-", "packed")]
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), style, label=f"{fabric}, {shape}, {routing}")
    ax.set_xlabel("workers")
    ax.set_ylabel("median iteration (ms)")
    ax.set_xscale("log", base=2)
    ax.set_title(f"moe: iteration against workers, {bandwidth}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"{prefix}-iteration.png", dpi=110)
    plot_ina(rows, folder, prefix, bandwidth)


def plot_ina(rows: list[dict], folder: Path, prefix: str, bandwidth: str) -> None:
    """What INA buys: per shape, placement and size, the time blocked on all_reduces (the dense and
    expert gradients) on ring and on ina, and the iterations' difference."""
    import matplotlib.pyplot as plt

    keys = sorted({(r["workers"], r["shape"], r["placement"]) for r in rows if r["routing"] == "measured"},
                  key=lambda k: (k[0], k[1] != "flat", k[2], k[1]))
    by = {(r["workers"], r["shape"], r["placement"], r["fabric"]): r for r in rows if r["routing"] == "measured"}
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.4
    for i, (fabric, colour) in enumerate((("ring", "#ff7f0e"), ("ina", "#2ca02c"))):
        values = [by[(*k, fabric)].get("blocked on all_reduce_us", 0.0) / 1e3 if (*k, fabric) in by else 0.0
                  for k in keys]
        ax.bar([j + (i - 0.5) * width for j in range(len(keys))], values, width, color=colour,
               label=f"{fabric}: blocked on all_reduce")
    ax.set_xticks(range(len(keys)), [f"{w}\n{s.replace('4-port leaves ', '')}\n{p}" for w, s, p in keys], fontsize=6)
    ax.set_ylabel("ms a worker an iteration (mean)")
    ax.set_title(f"moe, {bandwidth}: the gradients' all_reduces (dense over the job, experts' over dp) on ring and ina")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / f"{prefix}-ina.png", dpi=110)


if __name__ == "__main__":
    main()
