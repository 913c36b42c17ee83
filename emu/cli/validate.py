"""``emu validate``: real runs against their emulation, with errors.

A case whose real run failed twice is a row marked failed, with its error (naming the
kept log) below the table, and the exit code is 1. ``--report`` (by default
``KEEP/report.json`` with ``--keep``) is rewritten after every case, so an interrupted
validation keeps the cases it finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from emu.cli import cli
from emu.cli.output import Spinner, err, ms, out
from emu.errors import CheckFailed

if TYPE_CHECKING:
    from emu.validate.report import CaseResult


@cli.command()
@click.option("--quick", is_flag=True, help="A few cases (minutes): the mlp unshaped and at 300 Mbit/s.")
@click.option("--models", default="mlp,cnn", show_default=True, help="Built-in models to run.")
@click.option("--steps", type=int, default=20, show_default=True, help="Timed steps per case, split over two real runs (before and after the capture); unshaped settings time 4x as many, 1 Gbit/s ones 2x: their steps vary more.")
@click.option("--calibrate", is_flag=True, help="Also replay each capture with a link fitted to it.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep every captured trace and real run's step times in this folder.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report (JSON) here after every case [default: KEEP/report.json with --keep].")
@click.option("--json", "as_json", is_flag=True, help="Print cases and summary as JSON on stdout.")
def validate(quick: bool, models: str, steps: int, calibrate: bool, keep: Path | None, report: Path | None,
             as_json: bool) -> None:
    """Measure real DDP runs (two ranks, shaped links in network namespaces when root) and
    compare them with emu's replay of their captured traces."""
    from rich.table import Table

    from emu.errors import ConfigError, RunFailed
    from emu.traces.samples import MODELS
    from emu.validate import DEFAULT_SETTINGS, QUICK_SETTINGS, run_validation, trusted_enough

    names = tuple(m.strip() for m in models.split(",") if m.strip())
    if quick:
        names = names[:1]
    if not names or any(n not in MODELS for n in names):
        raise ConfigError(f"--models {models!r}: choose from {', '.join(MODELS)}")
    if steps < 3:
        raise ConfigError(f"--steps must be at least 3, got {steps}")
    if report is None and keep is not None:
        report = keep / "report.json"
    with Spinner("validating") as status:
        result = run_validation(names, QUICK_SETTINGS if quick else DEFAULT_SETTINGS, steps=steps,
                                calibrate=calibrate, keep=keep, report_path=report,
                                on_status=lambda text: status.update(f"validating: {text}"))
    for note in result.notes:
        err().print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        table = Table(title="emu validate: real step time against the emulated one")
        for name in ("case", "kind", "measured ms", "+/- ms", "predicted ms", "error", "vs capture",
                     "compute ms (real / emu)", "comm ms (real / emu)"):
            # a case's name keeps its first words whole in a terminal of 80 columns (or a pipe)
            table.add_column(name, justify="left" if name in ("case", "kind") else "right",
                             min_width=20 if name == "case" else None)
        for c in result.cases:
            own = "-" if c.error_vs_capture_pct is None else f"{c.error_vs_capture_pct:+.1f}%"
            table.add_row(c.name, c.kind.value, ms(c.measured_us), ms(c.spread_us), ms(c.predicted_us),
                          f"{c.error_pct:+.1f}%", own, *_where_the_step_went(c))
        for f in result.failures:
            table.add_row(f.name, "failed", "-", "-", "-", "-", "-", "-", "-")
        out().print(table)
        for f in result.failures:
            out().print(f"failed: {f.name}: {f.error}", markup=False, highlight=False, soft_wrap=True)
        for c in result.cases:
            for flag in c.flags:
                out().print(f"flagged: {c.name} ({c.kind.value}): {flag}", markup=False, highlight=False,
                            soft_wrap=True)
        s = result.summary
        trusted = [f"{kind}: {s[f'{kind}_trusted_mean_abs_error_pct']:.1f}% / "
                   f"{s[f'{kind}_trusted_max_abs_error_pct']:.1f}%" for kind in
                   ("same", "extrapolated", "calibrated", "held out", "run")
                   if any(c.kind.value == kind and not c.flags for c in result.cases)]
        out().print(f"trusted cases: {s['trusted_cases']:g} of {s['trusted_cases'] + s['flagged_cases']:g} "
                    f"(mean / max |error| by kind: {'; '.join(trusted) or 'none'})", markup=False, highlight=False)
        parts = [f"{kind}: {s[f'{kind}_mean_abs_error_pct']:.1f}% / {s[f'{kind}_max_abs_error_pct']:.1f}%"
                 for kind in ("same", "extrapolated", "calibrated", "held out", "run") if any(c.kind.value == kind for c in result.cases)]
        out().print(f"mean |error| {s['mean_abs_error_pct']:.1f}%, max {s['max_abs_error_pct']:.1f}% "
                    f"(mean / max by kind: {'; '.join(parts)})", markup=False, highlight=False)
        if any(c.error_vs_capture_pct is not None and c.kind.value == "same" for c in result.cases):
            out().print(f"same-configuration replays against their captures' own profiled steps: mean / max |error| "
                        f"{s['same_vs_capture_mean_abs_error_pct']:.1f}% / {s['same_vs_capture_max_abs_error_pct']:.1f}% "
                        "(the replays against the very steps they were made from: no drift between capture and "
                        "real runs, no profiler's overhead in it; what the machine did to the captured "
                        "communication still is)",
                        markup=False, highlight=False)
    if not result.failures and not trusted_enough(result.cases):
        raise CheckFailed(f"{result.summary['flagged_cases']:g} of {len(result.cases)} cases are flagged (their real "
                          "runs or captures were limited by the machine: each says why above): fewer than two "
                          "thirds trusted, or a setting without a trusted case (docs/FIDELITY.md, 'Trusted cases')")
    if result.failures:
        where = f" and in {report}" if report is not None else ""
        raise RunFailed(f"{len(result.failures)} of {len(result.failures) + len(result.cases)} cases failed "
                        f"({', '.join(f.name for f in result.failures)}); their errors, each naming the log kept, "
                        f"are above{where}")


def _where_the_step_went(c: CaseResult) -> tuple[str, str]:
    """The real ranks' threads ready a step against the prediction's compute, and the rest of the
    real step (blocked: waiting for collectives) against its exposed communication (docs/FIDELITY.md)."""
    blocked = None if c.real_ready_us is None else c.measured_us - c.real_ready_us
    return (f"{ms(c.real_ready_us)} / {ms(c.predicted_compute_us)}",
            f"{ms(blocked)} / {ms(c.predicted_exposed_comm_us)}")
