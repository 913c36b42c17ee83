"""What a replay costs against the work it cannot avoid, side by side with another build of emu.

Each case is an ``emu replay`` command line, run end to end as a user runs it (process start and
stop included) by each build given (``--emu PATH``: an ``emu`` executable; the first is the
baseline column, typically a checkout of the commit before a change). For each run: wall seconds
per emulated iteration end to end and inside the replay's run (the report's ``emulator.run_s``:
the emulation itself, without the interpreter's start, the trace's load and the report), the
clock's windows, the emulated iteration, and the ratio of each to the work bound, which does not
depend on how emu is built:

    bound = rows x (measured cost of aggregating and copying one row)
          + dependent steps x (measured process round trip)

``rows`` are the real rows the design must touch: every row a worker sends is moved and summed
once and delivered once, so twice the workers' emulated bytes (``summary.bytes_sent``) over the
payload scale and a packet's wire bytes (the same in one process and across many), plus one for
each point-to-point segment (``verification.segments``: a message to take, queue and hand to its
collective whatever its size, those inside a node included; a ring moves ``2 M (M - 1)`` of them
a collective however few real elements payload scale leaves in each); the dependent
steps are the protocol's rounds that must follow one another, counted from the trace: per
collective, the stream's round trips through its real slots (``ceil(chunks / slots)``, plus the
exponent round) on ``ina``, ``2 (M - 1)`` hand-offs on a ring, 2 on a parameter server,
``2 ceil(log2 M)`` on a tree, and one a compute phase. The row cost is the switch's data plane on
8 workers' full pool of rows (``AggregationSwitch.process``) plus their frames' encode and parse;
the round trip a zmq ping-pong between two processes (``benchmarks/clock_cost.py``); both are
measured before each case and the bound of every case uses their medians over the run (measured
once at a run's start, the row cost was 0.38 us in one run and 0.26 us in the next, 18 minutes
later, and every ratio moved by the difference; a case's own measurement ranged 0.20 to 0.33 us
within one run, too short to stand alone).

    .venv/bin/python benchmarks/replay_cost.py --emu OLD/.venv/bin/emu --emu .venv/bin/emu \\
        [--set quick|issue30] [--timeout 600] [--out results.json]

A commit's build without a virtual environment of its own: a worktree of it (``git worktree add
OLD COMMIT``) and a script ``OLD/emu-run`` that runs it with this interpreter, ``-P`` so that the
folder the benchmark runs in does not come first on the path (``python -m`` puts it there)::

    #!/bin/sh
    PYTHONPATH=OLD exec .venv/bin/python -P -m emu "$@"

Each build first runs the smallest case once, unmeasured, with bytecode written (the harness
drops ``PYTHONDONTWRITEBYTECODE`` from the runs' environment): the end-to-end figures are those
of a build whose modules are compiled, as an installed package's are, not of one that compiles
its hundred modules at every start (about 0.15 s a run on the build machine, whose environment
sets that variable).

``--repeat N`` runs each case N times on each build, the builds alternating and each round after a
measurement of its own of the row cost and round trip; the table shows each build's median run (by
its time inside the replay) and the bounds use the medians of those runs' measurements. On a
shared machine one run of a case may meet a busy moment that its neighbours did not: one run of
the whole table put the tp sample at dp=64 on ``ring`` at 2.3 times its bound and the next at 3.7.

Writes a markdown table to stdout and every measurement to ``--out`` (``every``: each repeat).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clock_cost import round_trip_us  # noqa: E402

from emu.emulator.protocol.switch import AggregationSwitch  # noqa: E402
from emu.emulator.protocol.transport import AggBatch  # noqa: E402
from emu.emulator.protocol.wire import AGG_HEADER, MsgType  # noqa: E402
from emu.traces import load_trace, sample_path  # noqa: E402
from emu.traces.model import Coll  # noqa: E402

BANDWIDTHS = ("1Gbps", "10Gbps", "25Gbps", "100Gbps")
TP = ("--workers-per-node", "8", "--nics-per-node", "8")


@dataclass(frozen=True)
class Case:
    name: str
    trace: str
    workers: int
    fabric: str
    iters: int
    bandwidth: str = "100Gbps"
    extra: tuple[str, ...] = ()

    def argv(self, report: str) -> list[str]:
        return ["replay", self.trace, "--workers", str(self.workers), "--fabric", self.fabric, "--iters",
                str(self.iters), "--bandwidth", self.bandwidth, *self.extra, "--report", report]


def case_set(name: str) -> list[Case]:
    if name == "quick":
        return [Case(f"mlp {f} 8 {bw}", "mlp", 8, f, 1, bw) for f in ("ina", "ring") for bw in ("1Gbps", "100Gbps")]
    cases = [Case(f"mlp {f} {m} {bw}", "mlp", m, f, 1, bw)
             for m in (8, 64) for f in ("ina", "ring", "ps", "tree") for bw in BANDWIDTHS if f != "tree" or m == 8]
    for dp in (8, 64):
        cases += [Case(f"tp dp={dp} {f} 10Gbps", "tp", 2 * dp, f, 3, "10Gbps", ("--mesh", f"dp={dp},tp=2", *TP))
                  for f in ("ina", "ring")]
    cases += [Case(f"mlp {f} {m} 100Gbps", "mlp", m, f, 1) for m in (512, 1024, 4096) for f in ("ring", "ps")]
    # up to 4,096 workers a replay runs in one process by default; the socketed layout beside it
    cases += [Case(f"mlp {f} {m} 100Gbps, 2 processes", "mlp", m, f, 1, extra=("--processes", "2"))
              for m in (8, 1024) for f in ("ina", "ring", "ps")]
    cases += [Case(f"transformer ina {m} 100Gbps", "transformer", m, "ina", 2) for m in (1024, 8192, 32768)]
    return cases


@dataclass(frozen=True)
class Run:
    emu: str
    case: str
    status: str  # replayed, estimate, failed, timeout
    wall_s: float
    run_s: float | None = None
    windows: int | None = None
    iteration_ms: float | None = None
    rows: float | None = None
    steps: int | None = None
    bound_s: float | None = None
    verified: bool | None = None
    segments: int | None = None
    row_us: float | None = None  # the bound's row cost and round trip, measured right before the case
    rtt_us: float | None = None


def row_cost_us(workers: int = 8, slots: int = 1024, k: int = 64, repeat: int = 5) -> float:
    """Median time to aggregate one row on the switch's data plane and move it through its frames."""
    n = workers * slots
    h = np.zeros(n, AGG_HEADER)
    h["msg_type"] = MsgType.CONTRIB
    h["worker"] = np.repeat(np.arange(workers), slots)
    h["num_workers"] = workers
    h["slot"] = np.tile(np.arange(slots), workers)
    h["chunk"] = h["slot"]
    h["size"] = k // 64
    h["exponent"] = 0
    payload = np.ones((n, k), np.int32)
    stamps = np.stack([np.arange(n, dtype=np.float64)] * 2, axis=1)
    times = []
    for _ in range(repeat):
        sw = AggregationSwitch(slots, workers, k)
        t = time.perf_counter()
        batch = AggBatch.parse([bytes(memoryview(f)) for f in AggBatch(h, payload, stamps).frames(b"A")])
        res = sw.process(batch.headers, batch.payload, batch.stamps, batch.sparse)
        AggBatch.parse([bytes(memoryview(f)) for f in AggBatch(res.headers, res.payload, res.stamps).frames(b"R")])
        times.append((time.perf_counter() - t) / (n + len(res)))
    return float(np.median(times)) * 1e6


def _ceil(a: int, b: int) -> int:
    return -(-a // max(1, b))


def dependent_steps(case: Case, scale: int, slots: int, elements: int) -> int:
    """The protocol's rounds that must follow one another in the case's iterations (module docstring)."""
    trace = load_trace(sample_path(case.trace))
    m = case.workers
    steps = 0
    for op in trace.ranks[0].iterations[0].ops:
        if not isinstance(op, Coll):
            steps += 1
            continue
        if case.fabric == "ina":
            chunks = _ceil(_ceil(op.count, scale), elements)
            steps += _ceil(chunks, slots) + 1
        elif case.fabric == "ring":
            steps += 2 * (m - 1)
        elif case.fabric == "ps":
            steps += 2
        else:
            steps += 2 * math.ceil(math.log2(max(2, m)))
    return steps * case.iters


# the runs' environment: bytecode written and read (module docstring)
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def warm_up(emu: str, timeout_s: float) -> None:
    """Run the smallest case once, unmeasured: the build's modules compiled, its files cached."""
    with tempfile.TemporaryDirectory(prefix="emu-cost-") as tmp:
        case = Case("warm-up", "mlp", 8, "ina", 1)
        subprocess.run([emu, *case.argv(os.path.join(tmp, "r.json"))], capture_output=True, timeout=timeout_s,
                       env=_ENV, check=False)


def run_case(emu: str, case: Case, timeout_s: float, row_us: float, rtt_us: float) -> Run:
    with tempfile.TemporaryDirectory(prefix="emu-cost-") as tmp:
        report = os.path.join(tmp, "r.json")
        t = time.monotonic()
        try:
            proc = subprocess.run([emu, *case.argv(report)], capture_output=True, text=True, timeout=timeout_s,
                                  env=_ENV)
        except subprocess.TimeoutExpired:
            return Run(emu, case.name, "timeout", timeout_s)
        wall = time.monotonic() - t
        if proc.returncode != 0 or not os.path.exists(report):
            status = "estimate" if "estimate" in proc.stderr + proc.stdout else "failed"
            return Run(emu, case.name, status, wall)
        doc = json.loads(Path(report).read_text())
    e, cfg = doc["emulator"], doc["config"]
    segments = int(doc["verification"].get("segments") or 0)
    rows = 2 * doc["summary"]["bytes_sent"] / e["payload_scale"] / cfg["packet_wire_bytes"] + segments
    steps = dependent_steps(case, int(e["payload_scale"]), int(doc["fabric"]["slots"]), int(cfg["elements"]))
    bound = (rows * row_us + steps * rtt_us) / 1e6
    return Run(emu, case.name, "replayed", wall, e.get("run_s"), e.get("windows"), doc["summary"]["iteration_us_median"] / 1e3,
               rows, steps, bound, doc["verification"]["ok"], segments, row_us, rtt_us)


def run_bounds(runs: dict[tuple[str, str], Run]) -> tuple[dict[tuple[str, str], Run], float, float]:
    """Every run's bound from the medians of the row costs and round trips measured in the run
    (module docstring), with those medians."""
    rows = [r.row_us for r in runs.values() if r.row_us]
    rtts = [r.rtt_us for r in runs.values() if r.rtt_us]
    if not rows or not rtts:
        return runs, math.nan, math.nan
    row, rtt = float(np.median(rows)), float(np.median(rtts))
    return {k: (replace(r, bound_s=(r.rows * row + r.steps * rtt) / 1e6) if r.rows is not None and r.steps is not None
                else r) for k, r in runs.items()}, row, rtt


def _cell(r: Run, iters: int) -> str:
    if r.status != "replayed":
        return r.status if r.status != "timeout" else f"> {r.wall_s:.0f} s"
    return f"{r.wall_s / iters:.2f}"


def label(emu: str) -> str:
    """A build's name: its checkout's folder (``OLD/.venv/bin/emu`` is ``OLD``, ``OLD/emu-run``
    is ``OLD``)."""
    path = Path(emu).absolute()
    return path.parents[2].name if path.parent.name == "bin" else path.parent.name


def _ratio(wall: float | None, bound: float | None) -> str:
    return f"{wall / bound:.1f}" if wall and bound else ""


def table(cases: list[Case], runs: dict[tuple[str, str], Run], emus: list[str]) -> str:
    cols = [f"s/iter ({label(e)})" for e in emus]
    head = ["case", *cols, "speed-up", "run s/iter", "windows (first / last)", "iteration ms", "segments",
            "us a segment (run)", "bound s", "x bound", "x bound (run)", "verified"]
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    for c in cases:
        rs = [runs.get((e, c.name), Run(e, c.name, "not run", 0.0)) for e in emus]
        first, last = rs[0], rs[-1]
        speed = (f"{first.wall_s / last.wall_s:.1f}x" if first.status == last.status == "replayed" else "")
        win = f"{first.windows if first.windows is not None else '-'} / {last.windows if last.windows is not None else '-'}"
        out.append("| " + " | ".join([
            c.name, *(_cell(r, c.iters) for r in rs), speed,
            f"{last.run_s / c.iters:.2f}" if last.run_s else "", win,
            f"{last.iteration_ms:.2f}" if last.iteration_ms else "",
            f"{last.segments:,}" if last.segments else "",
            f"{last.run_s / last.segments * 1e6:.2f}" if last.segments and last.run_s else "",
            f"{last.bound_s:.2f}" if last.bound_s else "-", _ratio(last.wall_s, last.bound_s),
            _ratio(last.run_s, last.bound_s), str(last.verified) if last.verified is not None else ""]) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emu", action="append", required=True, help="an emu executable (repeat; first: baseline)")
    ap.add_argument("--set", default="issue30", choices=("quick", "issue30"))
    ap.add_argument("--cases", default="", help="only the cases whose name contains one of these (comma list)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    ap.add_argument("--out", default="replay_cost.json")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each case on each build, alternating; the table shows each's median run")
    ap.add_argument("--keep", action="append", default=[], metavar="EMU",
                    help="reuse this build's runs from --out instead of measuring them again (repeat)")
    ap.add_argument("--skip-first", default="", metavar="PATTERNS",
                    help="cases (names containing one of these, comma list) not run on the first build")
    ap.add_argument("--render", metavar="JSON", help="print the table of a saved --out file, run nothing")
    args = ap.parse_args()
    cases = case_set(args.set)
    if args.cases:
        cases = [c for c in cases if any(p in c.name for p in args.cases.split(","))]
    if args.render:
        saved = [Run(**r) for r in json.loads(Path(args.render).read_text())["runs"]]
        done = {r.case for r in saved}
        print(table([c for c in cases if c.name in done], _bounded({(r.emu, r.case): r for r in saved}), args.emu))
        return
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}", file=sys.stderr)
    runs: dict[tuple[str, str], Run] = {}
    out = Path(args.out)
    if args.keep and out.exists():  # a build measured once (the baseline) is not measured again
        runs = {(r.emu, r.case): r for r in (Run(**d) for d in json.loads(out.read_text())["runs"])
                if r.emu in args.keep}
    for e in args.emu:
        if e not in args.keep:
            warm_up(e, args.timeout)
    every: dict[tuple[str, str], list[Run]] = {}
    for c in cases:  # the builds side by side, case by case: the machine's load hits both alike
        for _ in range(args.repeat):
            rtt, row = round_trip_us(), row_cost_us()  # the bound as the machine is now
            for e in args.emu:
                if (e, c.name) in runs and (e, c.name) not in every:
                    continue
                if e == args.emu[0] and any(p and p in c.name for p in args.skip_first.split(",")):
                    continue
                r = run_case(e, c, args.timeout, row, rtt)
                every.setdefault((e, c.name), []).append(r)
                runs[(e, c.name)] = median_run(every[(e, c.name)])
                print(f"{c.name} [{e}]: {r.status} {r.wall_s:.1f} s, windows {r.windows}", file=sys.stderr, flush=True)
                out.write_text(json.dumps({"runs": [asdict(r) for r in runs.values()],  # nothing lost
                                           "every": [asdict(r) for rs in every.values() for r in rs]}, indent=1))
    print(table(cases, _bounded(runs), args.emu))


def median_run(runs: list[Run]) -> Run:
    """Of a case's repeats on one build, the run whose time inside the replay is the median (the
    lower of the two middle ones for an even count); a run that did not replay stands for all if
    none did."""
    done = sorted((r for r in runs if r.status == "replayed" and r.run_s is not None), key=lambda r: r.run_s)
    return done[(len(done) - 1) // 2] if done else runs[-1]


def _bounded(runs: dict[tuple[str, str], Run]) -> dict[tuple[str, str], Run]:
    """``run_bounds``, saying on stderr what the run measured."""
    rows = [r.row_us for r in runs.values() if r.row_us]
    rtts = [r.rtt_us for r in runs.values() if r.rtt_us]
    runs, row, rtt = run_bounds(runs)
    if rows and rtts:
        print(f"# row {min(rows):.2f} to {max(rows):.2f} us, round trip {min(rtts):.0f} to {max(rtts):.0f} us, "
              f"measured before each case; the bounds use their medians, {row:.2f} us and {rtt:.0f} us", file=sys.stderr)
    return runs


if __name__ == "__main__":
    main()
