"""Every wall time the docs quote for a command a reader runs, measured again (issue 37).

Each figure is a command of README.md or docs/*.md (or the few its paragraph names), run here as
written, timed from start to end. The results go to docs/figures.json, each with its machine,
date and commit, and the docs show each where a marker stands:

    <!-- fig:ci-four-replays -->78 s (measured on 2026-12-04, benchmarks/docs_figures.py)<!-- /fig -->

``--write-docs`` rewrites the text between every marker from docs/figures.json; tests/test_docs.py
fails where a marker's text and docs/figures.json differ, where a marker names no figure of this
table, or where a figure has no marker. A figure that needs what this machine lacks (BMv2, root)
is skipped with a line and keeps its last measurement, dated. Figures written by the benchmarks
(BENCHMARKS.md, the tables of docs/compression.md, docs/sparse.md, docs/moe.md, docs/topology.md's
jobs, docs/FIDELITY.md's validations) come from those scripts, which say machine, date and command
beside them; docs/design-notes.md is the dated log of decisions and quotes what each measured then.

    .venv/bin/python benchmarks/docs_figures.py [--only ID,ID] [--all] [--write-docs] [--list] [--keep DIR]

Without ``--only`` every figure but the heavy ones (``make test``, the full validation: add
``--all``) runs; about 3 minutes here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from emu.files import write_atomic

ROOT = Path(__file__).resolve().parents[1]
FIGURES_JSON = ROOT / "docs" / "figures.json"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- fig:([a-z0-9-]+) -->(.*?)<!-- /fig -->", re.S)
EMU = str(Path(sys.executable).with_name("emu"))
CI_DESIGNS = ("baseline", "candidate")


class Need(Enum):
    """What a figure's command needs of the machine."""

    ROOT = "root (network namespaces)"
    BMV2 = "BMv2 (simple_switch_grpc on PATH: docs/p4.md)"


class Shown(Enum):
    """What a figure says: the wall time, or make's test count and wall time."""

    SECONDS = "seconds"
    TESTS = "tests"


@dataclass(frozen=True)
class Figure:
    """One figure: its commands, run in the repository's folder in turn (``{out}`` is a fresh
    temporary folder), and what they need."""

    id: str
    commands: tuple[tuple[str, ...], ...]
    needs: tuple[Need, ...] = ()
    heavy: bool = False
    shown: Shown = Shown.SECONDS


def _ci_replays() -> tuple[tuple[str, ...], ...]:
    """docs/ci.md's loop: two traces, each on the baseline and the candidate design."""
    return tuple((EMU, "replay", trace, "--workers", "8", "--iters", "2", "--network", f"examples/ci/{design}.toml",
                  "--report", f"{{out}}/{design}/{trace}.json")
                 for trace in ("mlp", "transformer") for design in CI_DESIGNS)


def _tp(fabric: str) -> tuple[str, ...]:
    return (EMU, "replay", "tp", "--mesh", "dp=8,tp=2", "--workers-per-node", "8", "--nics-per-node", "8",
            "--fabric", fabric, "--bandwidth", "10Gbps", "--iters", "3")


TOPOLOGY_DESIGNS = ("ina-flat-1to1", "ina-flat-4to1", "ina-hierarchical-4to1", "ring-flat-4to1")
WHAT_IF_GRID = ("mlp", "--workers", "8,64,512,1024", "--fabric", "ina,ring", "--bandwidth", "25Gbps,100Gbps",
                "--iters", "2")

FIGURES = (
    Figure("make-test", (("make", "test"),), heavy=True, shown=Shown.TESTS),
    Figure("make-test-p4", (("make", "test-p4"),), needs=(Need.ROOT, Need.BMV2), heavy=True, shown=Shown.TESTS),
    Figure("bmv2-mlp-8", ((EMU, "replay", "mlp", "--workers", "8", "--fabric", "bmv2", "--iters", "2"),),
           needs=(Need.ROOT, Need.BMV2), heavy=True),
    Figure("capture-dlrm", ((EMU, "capture", "--model", "dlrm", "-o", "{out}/dlrm.json.gz"),)),
    Figure("ci-four-replays", _ci_replays()),
    Figure("ring-mlp-128", ((EMU, "replay", "mlp", "--workers", "128", "--fabric", "ring", "--iters", "1"),)),
    Figure("ring-mlp-1024", ((EMU, "replay", "mlp", "--workers", "1024", "--fabric", "ring", "--iters", "1"),)),
    Figure("tp-dp8-ina", (_tp("ina"),)),
    Figure("tp-dp8-ring", (_tp("ring"),)),
    Figure("run-64", ((EMU, "run", "--workers", "64", "--", sys.executable, "examples/ddp_train.py", "--steps", "8"),)),
    Figure("topology-sweep", ((EMU, "sweep", "mlp", *[a for d in TOPOLOGY_DESIGNS for a in
                                                      ("--network", f"examples/designs/topology/{d}.toml")],
                               "--workers", "16,32,64", "--iters", "2", "--out", "{out}/study"),)),
    Figure("what-if-sweep", ((EMU, "sweep", *WHAT_IF_GRID, "--out", "{out}/study"),)),
    Figure("what-if-predict", ((EMU, "predict", *WHAT_IF_GRID),)),
    Figure("validate-quick", ((EMU, "validate", "--quick"),), needs=(Need.ROOT,), heavy=True),
    Figure("validate-full", ((EMU, "validate", "--json"),), needs=(Need.ROOT,), heavy=True),
)
BY_ID = {f.id: f for f in FIGURES}


def missing(figure: Figure) -> list[Need]:
    """What this machine lacks of what the figure needs."""
    lacks = {Need.ROOT: os.geteuid() != 0, Need.BMV2: shutil.which("simple_switch_grpc") is None}
    return [n for n in figure.needs if lacks[n]]


def seconds_text(seconds: float) -> str:
    """78 s, 1 min 44 s, 9 min: as the docs write a wall time."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min" if rest == 0 or minutes >= 10 else f"{minutes} min {rest} s"


def rendered(entry: dict) -> str:
    """A figure as the docs show it, from its docs/figures.json entry (``by``: who measured it,
    where not this script)."""
    value = seconds_text(entry["seconds"])
    if entry.get("tests") is not None:
        value = f"{entry['tests']:,} tests in {value}"
    return f"{value} (measured on {entry['date']}, {entry.get('by', 'benchmarks/docs_figures.py')})"


class Failed(Exception):
    """A figure's command failed or ran out of time (its last lines)."""


def measure(figure: Figure, commit: str, keep: Path | None = None) -> dict:
    """Run the figure's commands in turn; its entry for docs/figures.json. A failing command
    raises Failed, naming it and its last lines. ``keep``: a folder for each command's stdout."""
    with tempfile.TemporaryDirectory(prefix="emu-figures-") as out:
        start, output = time.perf_counter(), ""
        for i, command in enumerate(figure.commands):
            argv = [a.replace("{out}", out) for a in command]
            code, stdout, stderr = _run(argv)
            output = stdout + stderr
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"{figure.id}.{i}.out").write_text(stdout)
            if code != 0:
                tail = "\n".join(output.strip().splitlines()[-5:])
                raise Failed(f"{figure.id}: {_shown(command)} exited {code}:\n{tail}")
        seconds = time.perf_counter() - start
    entry = {"seconds": round(seconds, 1), "date": datetime.date.today().isoformat(), "commit": commit,
             "machine": _machine(), "commands": [_shown(c) for c in figure.commands]}
    if figure.shown is Shown.TESTS:
        found = re.search(r"(\d+) passed(?:, (\d+) skipped)?", output)
        entry["tests"] = int(found.group(1)) + int(found.group(2) or 0) if found else None
    return entry


def _run(argv: list[str], timeout_s: float = 3600) -> tuple[int, str, str]:
    """The command's exit code and output; past ``timeout_s`` it and everything it started (its own
    session) get SIGTERM, then SIGKILL, and the code is -1."""
    import signal

    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stdout, stderr
    except BaseException:  # the timeout, Ctrl-C: nothing this started outlives it
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                stdout, stderr = proc.communicate(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            stdout, stderr = "", ""
        if sys.exc_info()[0] is not subprocess.TimeoutExpired:
            raise
        return -1, stdout, stderr + f"\n(timed out after {timeout_s:.0f} s)"


def _shown(command: tuple[str, ...]) -> str:
    """A command as the docs write it (emu and python by name)."""
    return " ".join("emu" if a == EMU else "python" if a == sys.executable else a for a in command)


def commit_measured() -> str:
    """The commit whose code the figures measure: HEAD, ``+changes`` where code (not the docs, whose
    markers this script rewrites) differs from it or is new and untracked."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "emu", "benchmarks", "examples", "tests", "Makefile",
                            "pyproject.toml"], cwd=ROOT, capture_output=True, text=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load {os.getloadavg()[0]:.1f} at the start")


def write_docs(figures: dict) -> list[str]:
    """Rewrite every marker's text from ``figures``; the files changed."""
    changed = []
    for path in DOCS:
        text = path.read_text()
        new = MARKER.sub(lambda m: f"<!-- fig:{m.group(1)} -->{rendered(figures[m.group(1)])}<!-- /fig -->", text)
        if new != text:
            write_atomic(path, new, "the docs' figures")
            changed.append(str(path.relative_to(ROOT)))
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma list of figure ids")
    parser.add_argument("--all", action="store_true", help="the heavy figures too")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs' markers afterwards")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument("--json", type=Path, default=FIGURES_JSON, help="where the figures are kept")
    parser.add_argument("--keep", type=Path, help="a folder for each command's stdout (FIGURE.N.out)")
    args = parser.parse_args()
    if args.list:
        for f in FIGURES:
            print(f"{f.id:18} {'heavy ' if f.heavy else ''}{' ; '.join(' '.join(c) for c in f.commands)}")
        return
    only = [i.strip() for i in (args.only or "").split(",") if i.strip()]
    unknown = [i for i in only if i not in BY_ID]
    if unknown or (args.only is not None and not only):
        parser.error(f"--only {','.join(unknown) or args.only!r}: no such figure; --list lists them")
    chosen = [BY_ID[i] for i in only] if only else [f for f in FIGURES if args.all or not f.heavy]
    figures = json.loads(args.json.read_text())["figures"] if args.json.exists() else {}
    commit, failed = commit_measured(), []
    for figure in chosen:
        lacks = missing(figure)
        if lacks:
            print(f"{figure.id}: skipped, this machine lacks {', '.join(n.value for n in lacks)}; "
                  f"kept: {figures.get(figure.id, {}).get('date', 'never measured')}", file=sys.stderr)
            continue
        print(f"{figure.id}: running", file=sys.stderr, flush=True)
        try:
            figures[figure.id] = measure(figure, commit, args.keep)
        except Failed as exc:
            print(f"{exc}\n{figure.id}: not measured, kept: {figures.get(figure.id, {}).get('date', 'never')}",
                  file=sys.stderr)
            failed.append(figure.id)
            continue
        print(f"{figure.id}: {rendered(figures[figure.id])}", file=sys.stderr, flush=True)
        write_atomic(args.json, json.dumps({"figures": dict(sorted(figures.items()))}, indent=1) + "\n", "the figures")
    if args.write_docs:
        for name in write_docs(figures):
            print(f"wrote {name}", file=sys.stderr)
    if failed:
        sys.exit(f"not measured: {', '.join(failed)}")


if __name__ == "__main__":
    main()
