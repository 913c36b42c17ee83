"""``emu check``: current replay reports against a baseline, for CI (docs/ci.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from emu.cli import cli
from emu.cli.output import err, out


@cli.command()
@click.argument("current", metavar="CURRENT", type=click.Path(path_type=Path))
@click.option("--baseline", required=True, type=click.Path(path_type=Path),
              help="The baseline: a report, or a folder of reports (searched recursively).")
@click.option("--tolerance", default="5%", show_default=True,
              help="Slower than the baseline by more than this is a regression: 5%, 0.05, or 0 (any slower).")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here.")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a GitHub-flavoured summary here (e.g. for $GITHUB_STEP_SUMMARY).")
@click.option("--ignore-config", is_flag=True,
              help="Pair reports by trace alone (to compare two network designs); one report per trace a side.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON on stdout.")
def check(current: Path, baseline: Path, tolerance: str, junit: Path | None, markdown: Path | None,
          ignore_config: bool, as_json: bool) -> None:
    """Compare the replay reports in CURRENT with those in --baseline (each a report or a folder).

    Reports pair by point: the trace's content hash and every configuration value that changes
    results. Exit 1 on a regression beyond the tolerance, a failed verification, an untrustworthy
    or incomplete current report, or a point on one side only; exit 2 on reports that cannot be
    read or paired.

    \b
      emu check current/ --baseline baseline/ --tolerance 0 --junit junit.xml --markdown summary.md
    """
    from emu.errors import CheckFailed, ConfigError
    from emu.files import check_writable, write_atomic
    from emu.study.check import check as run_check
    from emu.study.check import parse_tolerance, render_junit, render_markdown

    fraction = parse_tolerance(tolerance)
    outputs = [(option, path) for option, path in (("--junit", junit), ("--markdown", markdown)) if path is not None]
    for option, path in outputs:  # found before any work, not after
        check_writable(path, option)
    if junit is not None and markdown is not None and junit.resolve() == markdown.resolve():
        raise ConfigError(f"--junit and --markdown are both {junit}; give two files")
    comparison = run_check(current, baseline, fraction, ignore_config)
    if as_json:  # the verdict first: a file that cannot be written below does not hide it
        click.echo(json.dumps(comparison.to_dict(), indent=2))
    else:
        _table(comparison, current, baseline)
    if junit is not None:
        write_atomic(junit, render_junit(comparison), "the JUnit XML")
        err().print(f"wrote {junit}", markup=False, highlight=False)
    if markdown is not None:
        write_atomic(markdown, render_markdown(comparison), "the Markdown summary")
        err().print(f"wrote {markdown}", markup=False, highlight=False)
    if not comparison.ok:
        raise CheckFailed(comparison.summary())
    err().print(f"emu check: {comparison.summary()}", markup=False, highlight=False)


def _table(comparison, current: Path, baseline: Path) -> None:
    from rich.table import Table
    from rich.text import Text

    from emu.study.check import Verdict, format_change, format_ms, format_tolerance

    styles = {Verdict.OK: "", Verdict.FASTER: "green", Verdict.REGRESSION: "bold red", Verdict.FAILED: "bold red",
              Verdict.MISSING: "bold red", Verdict.NEW: "bold red"}
    t = Table(title=Text(f"{current} against {baseline} (tolerance {format_tolerance(comparison.tolerance)})"))
    t.add_column("point")
    t.add_column("baseline (ms)", justify="right")
    t.add_column("current (ms)", justify="right")
    t.add_column("change", justify="right")
    t.add_column("verdict")
    for p in comparison.points:  # Text cells: a label or a reason is never read as rich markup
        t.add_row(Text(p.label), format_ms(p.baseline_us), format_ms(p.current_us), format_change(p.change),
                  Text(p.verdict_text, style=styles[p.verdict]))
    out().print(t)
