"""A validation's `same` and extrapolated cases with two readings of the replay's iteration.

The report's iteration (``emulated_us``, docs/design.md) is its period: the last worker's end less
the previous iteration's last end (the first from the earliest start), what the real runs measure
from optimizer step to optimizer step. Its span (``span_us``: the earliest worker's start to the
last end) holds the workers' skew too; report versions before 6 gave the span as the iteration.
This replays the traces a validation kept (``emu validate --keep DIR``) as the validation does
(``emu.validate.core.predict``) and prints, per case, the error of the median span and of the
median period against the real runs' measured step, from the validation's own report:

    .venv/bin/python benchmarks/iteration_period.py --keep DIR --report REPORT.json

With ``--trace``, instead, one trace on each fabric and worker count given, the medians of both
readings side by side (a fabric whose workers end apart, a parameter server's answers leaving one
after another, against the switch's results that reach every worker at once):

    .venv/bin/python benchmarks/iteration_period.py --trace T --fabrics ring,ps,ina --workers 2,8 \
        --bandwidth 300e6
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, ReplayReport, replay
from emu.traces import load_trace, sample_path
from emu.validate.core import DEFAULT_SETTINGS, VETH_LATENCY_US, _link


def medians(r: ReplayReport) -> tuple[float, float]:
    """The report's median span and median period (us)."""
    return (statistics.median(it.span_us for it in r.iterations), statistics.median(it.emulated_us for it in r.iterations))


def cases(report: dict) -> list[tuple[str, str, str, object]]:
    """(case name, kind, kept trace, setting) of every `same` and extrapolated case in the report."""
    names = {c["name"] for c in report["cases"]}
    out = []
    for s in DEFAULT_SETTINGS:
        bucket = s.name.split("/")[1]
        for model in ("mlp", "cnn"):
            out.append((f"{model} {s.name}", "same", f"{model}-{s.name.replace('/', '-')}", s))
            if s.rate_bps is not None:
                out.append((f"{model} {s.name} from unshaped/{bucket}", "extrapolated", f"{model}-unshaped-{bucket}", s))
    return [c for c in out if c[0] in names]


def fabrics(trace_path: str, names: list[str], workers: list[int], bandwidth_bps: float) -> None:
    """One trace on each fabric and worker count: the median span and period."""
    trace = load_trace(trace_path if Path(trace_path).exists() else sample_path(trace_path))
    link = LinkSpec(bandwidth_bps=bandwidth_bps, latency_us=VETH_LATENCY_US)
    print("| fabric | workers | span (median ms) | period (median ms) | span over period |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for fabric in names:
        for m in workers:
            span, period = medians(replay(trace, ReplayConfig(workers=m, fabric=fabric, link=link)))
            print(f"| {fabric} | {m} | {span / 1e3:.1f} | {period / 1e3:.1f} | {100 * (span / period - 1):+.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="the folder the validation kept its traces in")
    parser.add_argument("--report", help="the validation's report (emu validate --json)")
    parser.add_argument("--trace", help="instead: this trace (a file, or a sample's name) on each of --fabrics and --workers")
    parser.add_argument("--fabrics", default="ring,ps,ina")
    parser.add_argument("--workers", default="2,8")
    parser.add_argument("--bandwidth", type=float, default=300e6, help="bits a second")
    args = parser.parse_args()
    if args.trace:
        fabrics(args.trace, args.fabrics.split(","), [int(w) for w in args.workers.split(",")], args.bandwidth)
        return
    if not args.keep or not args.report:
        parser.error("give --keep and --report (a validation's), or --trace")
    report = json.loads(Path(args.report).read_text())
    by_name = {c["name"]: c for c in report["cases"]}
    print("| case | kind | flagged | error (span) | error (period) |")
    print("| --- | --- | --- | ---: | ---: |")
    errors: list[tuple[float, float]] = []
    for name, kind, kept, setting in cases(report):
        trace = load_trace(Path(args.keep) / f"{kept}.json.gz")
        span, period = medians(replay(trace, ReplayConfig(workers=trace.meta.world_size, fabric="ring",
                                                          link=_link(setting, trace))))  # as predict replays
        measured = by_name[name]["measured_us"]
        flagged = bool(by_name[name]["flags"])
        e = (100 * (span / measured - 1), 100 * (period / measured - 1))
        if not flagged:
            errors.append(e)
        print(f"| {name} | {kind} | {'yes' if flagged else ''} | {e[0]:+.1f}% | {e[1]:+.1f}% |")
    if errors:
        for i, what in enumerate(("span", "period")):
            got = [abs(e[i]) for e in errors]
            print(f"# not flagged ({len(got)}): mean |error| {what} {statistics.fmean(got):.2f}%, max {max(got):.1f}%")


if __name__ == "__main__":
    main()
