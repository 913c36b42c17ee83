"""The consoles of the CLI: status and errors on stderr, data on stdout.

rich is used here and in the command modules only; it honours NO_COLOR.
"""

from __future__ import annotations

from functools import cache

from rich.console import Console


@cache
def err() -> Console:
    return Console(stderr=True)


def out() -> Console:
    # Not cached: click's test runner swaps sys.stdout per invocation. Written to a file or a CI log,
    # a table keeps its rows whole instead of wrapping at rich's default of 80 columns.
    import os

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_bandwidth(bps: float | None) -> str:
    """A link rate for a table ('25 Gbps'; 'ideal' for an infinite link, None in reports)."""
    from emu.emulator.links.spec import format_bandwidth

    return format_bandwidth(bps, " ")


def warn_design(config) -> None:
    """A design's settings that cannot act at its size, on stderr (``Topology.warning``)."""
    warning = config.topology.warning(config.workers) if config.topology is not None else None
    if warning:
        err().print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)


def ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"


class ProgressBar:
    """A progress bar on a terminal; elsewhere (a pipe, a CI log) a line per status and per
    quarter done, on stderr, so that a long run shows it is alive there too."""

    def __init__(self, label: str, quiet: bool = False) -> None:
        """``quiet``: no bar and no lines (a machine whose run machine 0 reports)."""
        self._label = label
        self._bar = None
        self._quarter = 4 if quiet else 0
        self._quiet = quiet
        if err().is_terminal and not quiet:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import ProgressBar as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), console=err(), transient=True)

    def __enter__(self) -> ProgressBar:
        if self._bar is not None:
            self._bar.__enter__()
            self._task = self._bar.add_task(self._label, total=1.0)
        return self

    def update(self, fraction: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=fraction)
        elif int(fraction * 4) > self._quarter:
            self._quarter = int(fraction * 4)
            err().print(f"{self._label}: {25 * self._quarter}%", markup=False, highlight=False)

    def status(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self._label}: {text}")
        elif not self._quiet:
            err().print(f"{self._label}: {text}", markup=False, highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


class Spinner:
    """A spinner on a terminal; on a pipe or a log file, one line per new status, so that long
    runs (validate takes minutes) show their progress there too."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._live = err().status(text) if err().is_terminal else None

    def __enter__(self) -> Spinner:
        if self._live is not None:
            self._live.__enter__()
        else:
            err().print(self._text, markup=False, highlight=False)
        return self

    def update(self, text: str) -> None:
        if self._live is not None:
            self._live.update(text)
        elif text != self._text:
            err().print(text, markup=False, highlight=False)
        self._text = text

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
