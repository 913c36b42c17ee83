"""A replay on one machine against the same replay spread over 2 and 4 machines stood in for by
network namespaces (docs/multi-host.md), each started by torchrun with one c10d rendezvous.

For each layout: the wall time of the whole command (torchrun, the rendezvous and torch's import
included), the run's own time (``emulator.run_s``: from Start to the last result), the CPU
seconds of every machine's processes, the switch's rate (real aggregation rows a second of the
run), the windows of the synchronized clock and the real bytes that crossed between processes,
and whether the report equals the one machine's. The namespaces share this machine's cores, so
the spread adds TCP, tags and heartbeats and no cores: the figures say what spreading costs and
where the bottleneck sits, not what more machines buy.

Needs root, iproute2 and unshare; the namespaces and the bridge (``emu.validate.netns.BridgedHosts``)
are removed whatever happens.

    sudo .venv/bin/python benchmarks/multihost.py [--workers 1024] [--trace transformer]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emu.validate.netns import BridgedHosts

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MACHINE_KEYS = {"wall_s", "cpu_percent", "processes", "run_s", "events", "real_bytes", "machines"}


def exact(doc: dict) -> dict:
    doc = dict(doc)
    doc["emulator"] = {k: v for k, v in doc["emulator"].items() if k not in MACHINE_KEYS}
    doc["config"] = {k: v for k, v in doc["config"].items() if k != "processes"}
    return doc


def wait_with_usage(p: subprocess.Popen) -> tuple[int, float]:
    """Exit code and the CPU seconds of the process and every descendant it waited for."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_utime + usage.ru_stime


def one(args: list[str], processes: int, out: Path) -> tuple[float, float, dict]:
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "emu", "replay", *args, "--processes", str(processes),
                          "--report", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    code, cpu = wait_with_usage(p)
    if code != 0:
        raise SystemExit(f"one machine failed: {p.stderr.read().decode()[-2000:] if p.stderr else ''}")
    return time.monotonic() - t0, cpu, json.loads(out.read_text())


def spread(args: list[str], n: int, folder: Path, port: int) -> tuple[float, list[float], dict]:
    with BridgedHosts(n) as hosts:
        t0 = time.monotonic()
        procs = []
        for k in range(n):
            cmd = (f"exec {TORCHRUN} --nnodes {n} --nproc-per-node 1 --rdzv-backend c10d "
                   f"--rdzv-endpoint m0:{port} --max-restarts 0 -m emu replay {' '.join(args)} --processes 1 "
                   f"--report {folder}/m{k}.json")
            procs.append(subprocess.Popen(hosts.command(k, cmd), cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=open(folder / f"err{k}.txt", "w")))
        done = [wait_with_usage(p) for p in procs]
        wall = time.monotonic() - t0
        if any(code != 0 for code, _ in done):
            raise SystemExit("a machine failed: " + "".join((folder / f"err{k}.txt").read_text()[-1500:]
                                                           for k in range(n)))
        (report,) = [json.loads((folder / f"m{k}.json").read_text()) for k in range(n)
                     if (folder / f"m{k}.json").exists()]
        return wall, [cpu for _, cpu in done], report


def row(label: str, wall: float, cpus: list[float], report: dict, same: bool | None) -> str:
    em = report["emulator"]
    run_s = em["run_s"]
    rate = report["fabric"]["packets"] / run_s if run_s else 0.0
    cpu = " + ".join(f"{c:.1f}" for c in cpus)
    return (f"| {label} | {wall:.1f} | {run_s:.2f} | {cpu} | {rate / 1e3:,.0f} | {em['windows']:,} | "
            f"{em['real_bytes'] / 1e6:,.1f} | {em['rejected_messages']} | {'-' if same is None else 'yes' if same else 'NO'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="transformer")
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--fabric", default="ina")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--payload-scale", default="auto")
    ap.add_argument("--machines", default="2,4")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each layout; the median run is shown")
    opts = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise SystemExit("network namespaces need root, iproute2 and unshare")
    args = [opts.trace, "--workers", str(opts.workers), "--fabric", opts.fabric, "--iters", str(opts.iters),
            "--payload-scale", opts.payload_scale, "--bandwidth", "100Gbps"]
    counts = [int(x) for x in opts.machines.split(",")]
    print(f"`emu replay {' '.join(args)}`, {os.cpu_count()} cores, {resource.getpagesize()}-byte pages\n")
    print("| layout | wall s | run s | CPU s (per machine) | switch krows/s | windows | real MB | rejected | same report |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory(prefix="emu-bench-") as tmp:
        folder = Path(tmp)
        for n in [1, *counts]:
            runs = []
            for i in range(opts.repeat):
                if n == 1:
                    wall, cpu, report = one(args, max(counts), folder / "one.json")
                    runs.append((wall, [cpu], report))
                else:
                    runs.append(spread(args, n, folder, 29450 + i))
            walls = [r[0] for r in runs]
            wall, cpus, report = runs[walls.index(statistics.median_low(walls))]
            if n == 1:
                base = exact(report)
                label = f"1 machine, {max(counts)} host processes"
            else:
                label = f"{n} namespace machines, 1 host process each"
            print(row(label, wall, cpus, report, None if n == 1 else exact(report) == base), flush=True)


if __name__ == "__main__":
    main()
