"""A replay on one machine against the same replay spread over 2 and 4 machines stood in for by
network namespaces (docs/multi-host.md), each started by torchrun with one c10d rendezvous.

For each layout: the wall time of the whole command (torchrun, the rendezvous and torch's import
included), the run's own time (``emulator.run_s``: from Start to the last result), the CPU
seconds of every machine's processes, the switch's rate (real aggregation rows a second of the
run), the windows of the synchronized clock and the real bytes that crossed between processes,
and whether the report equals the one machine's. The namespaces share this machine's cores, so
the spread adds TCP, tags and heartbeats and no cores: the figures say what spreading costs and
where the bottleneck sits, not what more machines buy.

Needs root, iproute2 and unshare; the namespaces and the bridge are removed whatever happens.

    sudo .venv/bin/python benchmarks/multihost.py [--workers 1024] [--trace transformer]
"""

from __future__ import annotations

import argparse
import itertools
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

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MACHINE_KEYS = {"wall_s", "cpu_percent", "processes", "run_s", "events", "real_bytes", "machines"}
TAG = "emubm"


def exact(doc: dict) -> dict:
    doc = dict(doc)
    doc["emulator"] = {k: v for k, v in doc["emulator"].items() if k not in MACHINE_KEYS}
    doc["config"] = {k: v for k, v in doc["config"].items() if k != "processes"}
    return doc


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


_MADE = itertools.count()


def make_machines(n: int) -> list[str]:
    tag = f"{TAG}{next(_MADE)}"  # names of their own: a deleted namespace's links linger a while
    ip("link", "add", f"{tag}br", "type", "bridge")
    ip("link", "set", f"{tag}br", "up")
    hosts = "127.0.0.1 localhost\n" + "".join(f"10.78.0.{k + 1} m{k}\n" for k in range(n))
    names = []
    for k in range(n):
        ns = f"{tag}m{k}"
        ip("netns", "add", ns)
        names.append(ns)
        ip("link", "add", f"{ns}h", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", f"{ns}h", "master", f"{tag}br")
        ip("link", "set", f"{ns}h", "up")
        ip("-n", ns, "addr", "add", f"10.78.0.{k + 1}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        (Path("/etc/netns") / ns).mkdir(parents=True, exist_ok=True)
        (Path("/etc/netns") / ns / "hosts").write_text(hosts)
    return names


def remove_machines() -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for ns in [x for x in listed if x.startswith(TAG)]:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip()
        if name.startswith(TAG):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


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
    names = make_machines(n)
    try:
        t0 = time.monotonic()
        procs = []
        for k, ns in enumerate(names):
            cmd = (f"hostname m{k} && exec {TORCHRUN} --nnodes {n} --nproc-per-node 1 --rdzv-backend c10d "
                   f"--rdzv-endpoint m0:{port} --max-restarts 0 -m emu replay {' '.join(args)} --processes 1 "
                   f"--report {folder}/m{k}.json")
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", cmd], cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=open(folder / f"err{k}.txt", "w")))
        done = [wait_with_usage(p) for p in procs]
        wall = time.monotonic() - t0
        if any(code != 0 for code, _ in done):
            raise SystemExit("a machine failed: " + "".join((folder / f"err{k}.txt").read_text()[-1500:]
                                                           for k in range(n)))
        (report,) = [json.loads((folder / f"m{k}.json").read_text()) for k in range(n)
                     if (folder / f"m{k}.json").exists()]
        return wall, [cpu for _, cpu in done], report
    finally:
        remove_machines()


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
    remove_machines()  # a killed earlier run's
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
