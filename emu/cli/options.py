"""What several commands read from their options the same way: a trace named by path or by a
shipped sample's name, a number or ``auto``, whether the user typed an option, and the topology
flags (docs/topology.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from emu.errors import ConfigError

if TYPE_CHECKING:
    from emu.emulator.links.topology import Topology
    from emu.replay import ReplayConfig

T = TypeVar("T")


def trace_path(text: str) -> Path:
    """The file, or the shipped sample of that name (emu.traces.SAMPLES) where no file is."""
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


def design_options(command: str, networks_axis: bool = False) -> Callable[[Callable], Callable]:
    """``--network`` and the flag of every design key the command takes (the table of
    ``emu.replay.DESIGN_KEYS``: its help, type and default); on ``sweep`` and ``predict``
    (``networks_axis``) ``--network`` repeats for an axis of designs and a comma list of an axis
    key (fabric, bandwidth, latency, loss) is an axis."""
    from emu.replay import DESIGN_KEYS

    def decorate(f: Callable) -> Callable:
        for key in reversed([k for k in DESIGN_KEYS if k.flag is not None and command in k.commands]):
            axis = networks_axis and key.axis
            kind = str if axis else key.flag_type
            default = None if key.default is None else (str(key.default) if axis else key.default)
            text = key.help + (" A comma list is an axis." if axis else "")
            f = click.option(key.flag, key.param, type=kind, default=default, show_default=default is not None,
                             help=text)(f)
        if networks_axis:
            return click.option("--network", "networks", multiple=True, type=click.Path(dir_okay=False),
                                help="A network design file (TOML); repeat for an axis of designs; typed flags "
                                     "win over it.")(f)
        return click.option("--network", "network", type=click.Path(dir_okay=False),
                            help="A network design file (TOML: fabric, [link], [switch], [topology], ...); flags "
                                 "typed beside it win.")(f)
    return decorate


def design_values(ctx: click.Context, params: dict, command: str, skip: frozenset[str] = frozenset()
                  ) -> tuple[dict[str, Any], frozenset[str]]:
    """The checked values of the design keys the command's flags set (defaults included), and the
    dotted keys the user typed (they win over a design file); ``skip``: keys the caller reads itself
    (a study's axes)."""
    from emu.replay import DESIGN_KEYS
    from emu.replay.config.keys import flag_value

    values: dict[str, Any] = {}
    given = set()
    for key in DESIGN_KEYS:
        if key.param is None or command not in key.commands or key.key in skip:
            continue
        raw = params.get(key.param)
        if typed(ctx, key.param):
            given.add(key.key)
        if raw is not None and key.lands:
            values[key.key] = flag_value(key, raw)
    if "link.bandwidth_schedule" in values:
        if "link.bandwidth" in given:
            raise ConfigError("--bandwidth-schedule sets the bandwidth over time: drop --bandwidth (its first step "
                              "is the bandwidth from 0s)")
        values.pop("link.bandwidth", None)
    return values, frozenset(given)


def network_config(ctx: click.Context, params: dict, command: str, base: ReplayConfig,
                   network: str | None) -> ReplayConfig:
    """``base`` with the network the flags and ``network`` (a design file) give: the defaults, then
    the design, then what the user typed (docs/design.md, "Network design files")."""
    from dataclasses import replace

    from emu.replay import apply_design, load_design

    values, given = design_values(ctx, params, command)
    config = apply_design(base, values)
    if network is None:
        return config
    design = load_design(network)
    return replace(design.overlay(config, given), design_file=network, design_name=design.name)


def topology_from(flags: dict) -> Topology | None:
    """The Topology the topology flags among a command's parameters give, or None."""
    from emu.replay import topology_from_flags

    return topology_from_flags(flags)
