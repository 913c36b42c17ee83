"""The golden set: reports and predictions of fixed cases, recorded once, compared on every change.

Each case is an ``emu`` command line with pinned inputs (copies of the samples under
tests/data/golden/traces/, workers, iterations, payload scale, seed and process count fixed).
Its JSON output, with the fields that describe the machine rather than the emulation removed
(wall and CPU times, process and event counts, clock windows, paths, the version), is kept in
tests/data/golden/CASE.json. A change that moves code must leave every emulated number as it
was; a change that alters numbers on purpose re-records the cases it touches in a commit of its
own, named in CHANGELOG.md (docs/design-notes.md, "The golden set").

    python -m tests.golden record [CASE ...]    # run and write (all cases without names)
    python -m tests.golden check [CASE ...]     # run and compare, as the tests do
    python -m tests.golden list
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden"
TRACES = GOLDEN / "traces"
DESIGNS = GOLDEN / "designs"

# Fields that describe the run, not the emulation: they may differ between two runs of a case.
VOLATILE = {
    ("emu_version",),
    ("trace", "path"),
    ("config", "processes"),
    ("config", "design", "file"),
    ("emulator", "wall_s"),
    ("emulator", "run_s"),
    ("emulator", "cpu_percent"),
    ("emulator", "processes"),
    ("emulator", "events"),
    ("emulator", "windows"),
    ("emulator", "real_bytes"),
    ("emulator", "advice"),
    ("emulator", "machines"),
    ("emulator", "calibration"),
}
# Difference two floats may have and still be the same number: float rounding only, relative, or
# absolute for a number that is the difference of two far larger ones (1e-6: a picosecond, a
# millionth of a byte), where the rounding of the large ones is what is left.
REL = 1e-12
ABS = 1e-6


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]  # after "emu"; {T} is the traces folder, {D} the designs folder
    fast: bool = False  # also in `make test` (every case runs in `make test-all`)

    def argv(self) -> list[str]:
        return [a.format(T=TRACES, D=DESIGNS) for a in self.args]


def _replay(trace: str, *rest: str, workers: str = "8", iters: str = "2", scale: str = "16") -> tuple[str, ...]:
    return ("replay", *(f"{{T}}/{t}.json.gz" for t in trace.split()), "--workers", workers, "--iters", iters,
            "--payload-scale", scale, "--seed", "0", "--processes", "2", "--json", *rest)


CASES: tuple[Case, ...] = (
    Case("ina", _replay("mlp", "--fabric", "ina"), fast=True),
    Case("ring", _replay("mlp", "--fabric", "ring"), fast=True),
    Case("ps", _replay("mlp", "--fabric", "ps")),
    Case("ina-10g", _replay("cnn", "--fabric", "ina", "--bandwidth", "10Gbps", iters="1")),
    Case("oversubscribed-ina", _replay("mlp", "--fabric", "ina", "--workers-per-node", "2", "--leaf-ports", "2",
                                       "--oversubscription", "2", workers="16", iters="1")),
    Case("oversubscribed-ring", _replay("mlp", "--fabric", "ring", "--workers-per-node", "2", "--leaf-ports", "2",
                                        "--oversubscription", "2", workers="16", iters="1")),
    Case("oversubscribed-ps", _replay("mlp", "--fabric", "ps", "--workers-per-node", "2", "--leaf-ports", "2",
                                      "--oversubscription", "2", workers="16", iters="1")),
    Case("hierarchical-ina", _replay("mlp", "--fabric", "ina", "--workers-per-node", "1", "--leaf-ports", "4",
                                     "--oversubscription", "4", "--algorithm", "hierarchical", workers="16",
                                     iters="1")),
    Case("hierarchical-ring", _replay("mlp", "--fabric", "ring", "--workers-per-node", "4", "--algorithm",
                                      "hierarchical", workers="16", iters="1")),
    Case("mesh-tp-ina", _replay("tp", "--fabric", "ina", "--mesh", "dp=4,tp=2", "--workers-per-node", "2",
                                iters="1")),
    Case("mesh-tp-ring", _replay("tp", "--fabric", "ring", "--mesh", "dp=4,tp=2", "--workers-per-node", "2",
                                 iters="1"), fast=True),
    Case("mesh-fsdp-ina", _replay("fsdp", "--fabric", "ina", "--mesh", "fsdp=8", iters="1")),
    Case("mesh-fsdp-ps", _replay("fsdp", "--fabric", "ps", "--mesh", "fsdp=8", iters="1")),
    Case("mesh-pp-ring", _replay("pp", "--fabric", "ring", "--mesh", "pp=2,dp=4", iters="1")),
    Case("jobs-ina", _replay("mlp cnn", "--fabric", "ina", "--workers-per-node", "1", "--leaf-ports", "2",
                             "--oversubscription", "2", workers="8,4", iters="1")),
    Case("jobs-ring", _replay("mlp cnn", "--fabric", "ring", workers="8,4", iters="1"), fast=True),
    Case("loss-ina", _replay("cnn", "--fabric", "ina", "--loss", "0.01", workers="4", iters="1")),
    Case("loss-ring", _replay("cnn", "--fabric", "ring", "--loss", "0.01", workers="4", iters="1")),
    Case("loss-ps", _replay("cnn", "--fabric", "ps", "--loss", "0.01", workers="4", iters="1")),
    Case("stragglers-ring", _replay("mlp", "--fabric", "ring", "--straggler", "3:1.5")),
    Case("stragglers-ina", _replay("mlp", "--fabric", "ina", "--straggler", "lognormal:0.1")),
    Case("schedule-jitter-ring", _replay("mlp", "--fabric", "ring", "--bandwidth-schedule", "0s:100Gbps,20ms:10Gbps",
                                         "--jitter", "1us", iters="1")),
    Case("sparse-ina", _replay("dlrm", "--fabric", "ina"), fast=True),
    Case("sparse-ring", _replay("dlrm", "--fabric", "ring")),
    Case("sparse-ps", _replay("dlrm", "--fabric", "ps", "--sparsity", "0.05")),
    Case("topk-ring", _replay("mlp", "--fabric", "ring", "--compress", "topk:0.01", workers="16", iters="1"), fast=True),
    Case("topk-ina", _replay("mlp", "--fabric", "ina", "--compress", "topk:0.01", iters="1")),
    Case("qsgd-ina", _replay("mlp", "--fabric", "ina", "--compress", "qsgd", iters="1")),
    Case("powersgd-ps", _replay("mlp", "--fabric", "ps", "--compress", "powersgd:4", iters="1")),
    Case("adaptive-ina", _replay("mlp", "--fabric", "ina", "--compress", "adaptive", "--bandwidth-schedule",
                                 "0s:100Gbps,20ms:10Gbps", iters="2")),
    Case("tree", _replay("mlp", "--fabric", "tree", "--bandwidth", "10Gbps"), fast=True),
    Case("tree-topology", _replay("mlp", "--fabric", "tree", "--workers-per-node", "4", workers="16", iters="1")),
    Case("mesh-tp-tree", _replay("tp", "--fabric", "tree", "--mesh", "dp=4,tp=2", iters="1")),
    Case("predict-tree", ("predict", "{T}/mlp.json.gz", "{T}/transformer.json.gz", "--workers", "16,64,256",
                          "--fabric", "tree", "--bandwidth", "10Gbps,100Gbps", "--json")),
    Case("predict-mesh", ("predict", "{T}/tp.json.gz", "--mesh", "dp=4,tp=2", "--fabric", "ina,ring,tree",
                          "--bandwidth", "10Gbps,100Gbps", "--iters", "2", "--json")),
    Case("predict-grid", ("predict", "{T}/mlp.json.gz", "{T}/cnn.json.gz", "--workers", "8,64", "--fabric",
                          "ina,ring,ps", "--bandwidth", "10Gbps,100Gbps", "--loss", "0,0.001", "--json"), fast=True),
    Case("predict-topology", ("predict", "{T}/mlp.json.gz", "--workers", "32", "--network",
                              "{D}/ina-hierarchical-4to1.toml", "--network", "{D}/ring-flat-4to1.toml",
                              "--network", "{D}/ina-flat-4to1.toml", "--json"), fast=True),
    Case("predict-compress", ("predict", "{T}/mlp.json.gz", "--workers", "16", "--fabric", "ina,ring,ps",
                              "--compress", "topk:0.01", "--json")),
    Case("predict-sparse", ("predict", "{T}/dlrm.json.gz", "--workers", "8,64", "--fabric", "ina,ring,ps",
                            "--bandwidth", "10Gbps", "--json")),
)
BY_NAME = {c.name: c for c in CASES}


def run(case: Case, timeout_s: float = 600) -> object:
    """The case's JSON output, as the installed emu prints it."""
    argv = [sys.executable, "-m", "emu", *case.argv()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"golden case {case.name} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def strip(value: object, path: tuple[str, ...] = ()) -> object:
    """``value`` without its volatile fields (at any depth of a report, and in every report of a list),
    and with the paths of the golden set's own files relative to it (a clone may sit anywhere)."""
    if isinstance(value, dict):
        return {k: strip(v, (*path, k)) for k, v in value.items() if _tail(path, k) not in VOLATILE}
    if isinstance(value, list):
        return [strip(v, path) for v in value]
    if isinstance(value, str):
        return _OWN.sub("{golden}/", value)
    return value


_OWN = re.compile(r"/\S*?/tests/data/golden/")


def _tail(path: tuple[str, ...], key: str) -> tuple[str, ...]:
    """The key's path from the nearest report (a report may sit inside a list or another report's jobs)."""
    full = (*path, key)
    for n in range(1, 4):
        if full[-n:] in VOLATILE:
            return full[-n:]
    return full


def differences(golden: object, current: object, path: str = "") -> list[str]:
    """Where ``current`` differs from ``golden``; keys that ``current`` adds are not differences."""
    if isinstance(golden, dict):
        if not isinstance(current, dict):
            return [f"{path}: {type(current).__name__} where the golden has an object"]
        out = []
        for k, v in golden.items():
            if k not in current:
                out.append(f"{path}.{k}: missing")
            else:
                out.extend(differences(v, current[k], f"{path}.{k}"))
        return out
    if isinstance(golden, list):
        if not isinstance(current, list) or len(current) != len(golden):
            n = len(current) if isinstance(current, list) else type(current).__name__
            return [f"{path}: {n} items where the golden has {len(golden)}"]
        return [d for i, (g, c) in enumerate(zip(golden, current, strict=True)) for d in differences(g, c, f"{path}[{i}]")]
    if isinstance(golden, float) and isinstance(current, (int, float)) and not isinstance(current, bool):
        if math.isclose(golden, current, rel_tol=REL, abs_tol=ABS) or (math.isnan(golden) and math.isnan(current)):
            return []
        return [f"{path}: {current!r} where the golden has {golden!r}"]
    if golden != current or type(golden) is not type(current):
        return [f"{path}: {current!r} where the golden has {golden!r}"]
    return []


def path_of(case: Case) -> Path:
    return GOLDEN / f"{case.name}.json"


def record(case: Case) -> None:
    path_of(case).write_text(json.dumps(strip(run(case)), indent=1, sort_keys=True) + "\n")


def check(case: Case) -> list[str]:
    golden = strip(json.loads(path_of(case).read_text()))
    return differences(golden, strip(run(case)))


def main(argv: list[str]) -> int:
    verb, names = (argv[0] if argv else "list"), argv[1:]
    cases = [BY_NAME[n] for n in names] if names else list(CASES)
    if verb == "list":
        for c in cases:
            print(c.name, "(fast)" if c.fast else "")
        return 0
    failed = 0
    for c in cases:
        if verb == "record":
            record(c)
            print(f"recorded {c.name}", file=sys.stderr)
        else:
            diffs = check(c)
            failed += bool(diffs)
            print(f"{c.name}: {'same' if not diffs else f'{len(diffs)} differences'}", file=sys.stderr)
            for d in diffs[:20]:
                print("   ", d, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
