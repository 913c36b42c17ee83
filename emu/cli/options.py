"""What several commands read from their options the same way: a trace named by path or by a
shipped sample's name, a number or ``auto``, and whether the user typed an option."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from emu.errors import ConfigError

T = TypeVar("T")


def trace_path(text: str) -> Path:
    """The file, or the shipped sample of that name (mlp, cnn, transformer, dlrm) where no file is."""
    from emu.traces import SAMPLES, sample_path

    path = Path(text)
    if not path.exists() and text in SAMPLES:
        return sample_path(text)
    return path


def typed(ctx: click.Context, name: str) -> bool:
    """Whether the user gave this option (a typed flag wins over a design file)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def auto(text: str, kind: Callable[[str], T], option: str) -> T | None:
    """A number, or None for ``auto``."""
    if text.strip().lower() == "auto":
        return None
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: give a number or auto") from None
