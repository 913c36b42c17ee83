"""What several commands read from their options the same way: a trace named by path or by a
shipped sample's name, a number or ``auto``, whether the user typed an option, and the topology
flags (docs/topology.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from emu.errors import ConfigError

if TYPE_CHECKING:
    from emu.emulator.topology import Topology

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


_TOPOLOGY_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--workers-per-node", int, "Workers (GPUs) per node: gives the network a topology (docs/topology.md)."),
    ("--nics-per-node", int, "NICs per node, shared by its workers (topology; default 1)."),
    ("--intra-bandwidth", str, "Bandwidth inside a node, each worker's port (topology; default 900GBps)."),
    ("--intra-latency", str, "Latency inside a node (topology; default 1us)."),
    ("--leaf-ports", int, "NIC ports per leaf switch; more nodes take more leaves and a spine (default 32)."),
    ("--oversubscription", float, "A leaf's NIC ports' capacity over its links to the spine (topology; 2 for 2:1)."),
    ("--placement", str, "Workers on nodes: packed, spread, random, or a node index per worker (0,0,1,1)."),
    ("--algorithm", str, "flat or hierarchical where a fabric has both (topology; ina: leaves aggregate first; ring's dense all_reduces: by node)."),
    ("--spine-latency", str, "One leaf-spine hop (topology; default: the link's latency)."),
)


def topology_options(f: Callable) -> Callable:
    """The topology flags; any of them gives the replay a topology, the rest at their defaults."""
    for flag, kind, text in reversed(_TOPOLOGY_FLAGS):
        f = click.option(flag, type=kind, default=None, help=text)(f)
    return f


def topology_from(flags: dict) -> Topology | None:
    """The Topology the topology flags among a command's parameters give, or None."""
    from emu.replay import topology_from_flags

    return topology_from_flags(flags)
