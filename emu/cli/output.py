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
    # Not cached: click's test runner swaps sys.stdout per invocation.
    return Console()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"
