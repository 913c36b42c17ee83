"""The keys of a network design, in one table (docs/design.md, "Network design files").

Each ``DesignKey`` is one thing a design sets: its dotted name in the TOML file, the flag that sets
it on ``emu replay``, ``sweep``, ``predict`` and ``run``, its value's kind and unit, the check that
turns a raw value into the configuration's (and names the file, the key and the fix when it
cannot), where it lands in a ``ReplayConfig``, its help text and whether a comma list of it is an
axis of a study. The design reader (``emu.replay.config.design``), the commands' options
(``emu.cli.options.design_options``) and their help come from this table, so a key is added in
one place.
"""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emu.emulator import fabric as fabrics
from emu.emulator.links.spec import LinkSpec, parse_bandwidth, parse_duration_us, parse_schedule
from emu.emulator.links.topology import Allocation, Hierarchy, Placement, SlotPolicy
from emu.emulator.protocol.wire import ELEMENTS_ALLOWED
from emu.errors import ConfigError
from emu.replay.plan.layout import parse_mesh
from emu.traces.mesh import Mesh

MAX_SLOTS = 1 << 24  # the --slots bound (ReplayConfig.check)

Check = Callable[[Any, str, str], Any]  # (raw value, where it came from, dotted key) -> the checked value


def check_label(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {key} = {show(value)} is {kind_of(value)}: give a string such as "
                          f'{key} = "ina-100g"')
    # the name labels table rows and plot legends, where a control character would break the line
    if key == "name" and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{source}: name = {show(value)} holds a control character: give one line of text")
    return value


def _fabric(value: Any, source: str) -> str:
    known = fabrics.names()
    if not isinstance(value, str):
        raise ConfigError(f'{source}: fabric = {show(value)} is {kind_of(value)}: give a fabric\'s name as a '
                          f'string, one of {", ".join(known)} (fabric = "ina")')
    if value not in known:
        near = difflib.get_close_matches(value.lower(), known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{source}: fabric = {show(value)} is not a fabric{hint}: give one of {', '.join(known)}")
    return value


def _bandwidth(value: Any, source: str, key: str) -> float:
    if not isinstance(value, str):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(f'{source}: {key} = {show(value)} has no unit: give a string like "100Gbps" '
                              '(b = bits, B = bytes: "12.5GBps")')
        raise ConfigError(f'{source}: {key} = {show(value)} is {kind_of(value)}: give a string like "100Gbps"')
    try:
        return parse_bandwidth(value)
    except ConfigError:
        raise ConfigError(f'{source}: {key} = {show(value)}: give a rate with a unit from 1kbps to 100Tbps, '
                          'e.g. "100Gbps", "400Gbit", "12.5GBps" (b = bits, B = bytes), or "ideal"') from None


def _duration(value: Any, source: str, key: str) -> float:
    if not isinstance(value, str):
        why = "has no unit" if isinstance(value, (int, float)) and not isinstance(value, bool) else f"is {kind_of(value)}"
        raise ConfigError(f'{source}: {key} = {show(value)} {why}: give a string like "5us" (ns, us, ms or s)')
    try:
        return parse_duration_us(value, key)
    except ConfigError:
        raise ConfigError(f'{source}: {key} = {show(value)}: give a duration with a unit, at most a day, '
                          'e.g. "5us", "1ms", "0us"') from None


def _schedule(value: Any, source: str, key: str) -> tuple[tuple[float, float], ...]:
    example = '"0s:100Gbps,20ms:10Gbps"'
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {key} = {show(value)} is {kind_of(value)}: give a string of TIME:BANDWIDTH "
                          f"steps such as {example}")
    try:
        steps = parse_schedule(value)
        LinkSpec(bandwidth_bps=steps[0][1], schedule=steps)  # the steps' own rules
    except ConfigError:
        raise ConfigError(f"{source}: {key} = {show(value)}: give TIME:BANDWIDTH steps from 0s, forward in "
                          f"time, each from 1kbps to 100Tbps, e.g. {example}") from None
    return steps


def _loss(value: Any, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {key} = {show(value)} is {kind_of(value)}: give a number such as 0.01 "
                          "(a probability, not a percentage)")
    if not 0 <= value < 1:  # NaN fails this too
        raise ConfigError(f"{source}: {key} = {show(value)}: give a probability in [0, 1), such as 0.01")
    return float(value)


def _whole(allowed: str, ok: Callable[[int], bool], example: int) -> Callable[[Any, str, str], int]:
    def check(value: Any, source: str, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} = {show(value)} is {kind_of(value)}: give a whole number such "
                              f"as {example}")
        if not ok(value):
            raise ConfigError(f"{source}: {key} = {show(value)}: give {allowed}")
        return value
    return check


def _ratio(value: Any, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {key} = {show(value)} is {kind_of(value)}: give a number such as 1 "
                          "(non-blocking) or 2 (2:1)")
    if not (math.isfinite(value) and value >= 1):
        raise ConfigError(f"{source}: {key} = {show(value)}: give 1 (non-blocking) or more (2 for 2:1)")
    return float(value)


def _placement(value: Any, source: str, key: str) -> tuple[Placement, tuple[int, ...]]:
    """packed, spread, random, or a list of node indices (one per worker)."""
    if isinstance(value, str) and value in (p.value for p in Placement if p != Placement.LIST):
        return Placement(value), ()
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return Placement.LIST, tuple(value)
    raise ConfigError(f'{source}: {key} = {show(value)}: give "packed", "spread", "random" or a list of node '
                      "indices, one per worker ([0, 0, 1, 1])")


def _choice(kind: type[enum.Enum]) -> Callable[[Any, str, str], Any]:
    names = [str(c.value) for c in kind]  # type: ignore[attr-defined]

    def check(value: Any, source: str, key: str) -> Any:
        if isinstance(value, str) and value in names:
            return kind(value)
        raise ConfigError(f"{source}: {key} = {show(value)}: give " + " or ".join(f'"{n}"' for n in names))
    return check


def _packet_rate(value: Any, source: str, key: str) -> float:
    """Packets a second: a number, or text with a unit ("1.2Gpps", "500Mpps", "2e9")."""
    try:
        rate = parse_packet_rate(value) if isinstance(value, str) else float(value)
    except (ValueError, TypeError, ConfigError):
        rate = math.nan
    if isinstance(value, bool) or not (math.isfinite(rate) and 1 <= rate <= 1e13):
        raise ConfigError(f'{source}: {key} = {show(value)}: give packets a second, 1 to 1e13 (1.2e9 or "1.2Gpps")')
    return rate


def parse_packet_rate(text: str) -> float:
    """'1.2Gpps', '500Mpps', '2e9', '800k' -> packets a second (ValueError if it is none of them)."""
    body = text.strip().lower().removesuffix("pps").strip()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(body[-1:], 1.0) if body else 1.0
    if scale != 1.0:
        body = body[:-1]
    return float(body) * scale


def _mesh(value: Any, source: str, key: str) -> Mesh:
    if not isinstance(value, str):
        raise ConfigError(f'{source}: {key} = {show(value)} is {kind_of(value)}: give the layout as a string of '
                          'NAME=SIZE pairs, outermost first, such as "dp=64,tp=2"')
    try:
        return parse_mesh(value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {key}: {str(exc).removeprefix('--mesh ')}") from None


def _imbalance(value: Any, source: str, key: str) -> float:
    ratio = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(ratio) and ratio >= 1):
        raise ConfigError(f"{source}: {key} = {show(value)}: give the largest split over the mean, a number >= 1 "
                          "(1: balanced routing)")
    return ratio


def _algorithm(value: Any, source: str, key: str) -> Hierarchy:
    if isinstance(value, str) and value in (a.value for a in Hierarchy):
        return Hierarchy(value)
    raise ConfigError(f'{source}: {key} = {show(value)}: give "flat" or "hierarchical"')


ALL = frozenset({"replay", "sweep", "predict", "run"})


def _as_nodes(value: Any) -> Any:
    """A --placement flag's text: a node index per worker (0,0,1,1), or a word left to the check."""
    if isinstance(value, str) and value.replace(",", "").strip().isdigit():
        return [int(x) for x in value.split(",")]
    return value


@dataclass(frozen=True)
class DesignKey:
    """One key of a network design, and the flag that sets it (module docstring)."""

    key: str  # dotted, as the file writes it: "link.bandwidth"
    check: Check  # raw value (from the file, or the flag's) -> the configuration's value
    lands: str  # where the value goes in a ReplayConfig: "link.bandwidth_bps", "topology.leaf_ports", ...
    help: str
    unit: str = ""  # what the value's number counts, as the docs' table says it
    flag: str | None = None  # "--bandwidth"; None: files only
    flag_type: type = str  # the flag's type on the command line (click converts it)
    flag_value: Callable[[Any], Any] = lambda v: v  # noqa: E731  # the flag's value as the file would write it
    default: Any = None  # the flag's default (None: unset, the configuration's default holds)
    axis: bool = False  # a comma list of it is an axis of a study (emu sweep, emu predict)
    commands: frozenset[str] = ALL  # the commands whose flag it is

    @property
    def table(self) -> str | None:
        return self.key.split(".")[0] if "." in self.key else None

    @property
    def name(self) -> str:
        return self.key.split(".")[-1]

    @property
    def param(self) -> str | None:
        """The flag's parameter name in click (``--bandwidth-schedule``: ``bandwidth_schedule``)."""
        return None if self.flag is None else self.flag.removeprefix("--").replace("-", "_")


def _fabric_key(value: Any, source: str, key: str) -> str:
    return _fabric(value, source)


KEYS: tuple[DesignKey, ...] = (
    DesignKey("fabric", _fabric_key, "fabric",
              f"The fabric: {fabrics.listing()} (emu/emulator/fabric.py); on emu replay a comma list replays each "
              "and compares them.", flag="--fabric", default="ina", axis=True),
    DesignKey("link.bandwidth", _bandwidth, "link.bandwidth_bps", "Link bandwidth, e.g. 10Gbps, 400Gbit.",
              "bits/s", "--bandwidth", default="100Gbps", axis=True),
    DesignKey("link.bandwidth_schedule", _schedule, "link.schedule",
              "A bandwidth that changes over emulated time, TIME:BANDWIDTH steps from 0s, e.g. "
              "0s:100Gbps,20ms:10Gbps (replaces --bandwidth; docs/physics.md).", "s:bits/s", "--bandwidth-schedule"),
    DesignKey("link.latency", _duration, "link.latency_us", "One-way link latency, e.g. 5us, 1ms.", "us",
              "--latency", default="5us", axis=True),
    DesignKey("link.loss", _loss, "link.loss", "Packet loss probability per link.", "probability", "--loss",
              float, default=0.0, axis=True),
    DesignKey("link.jitter", _duration, "link.jitter_us", "Uniform extra delay per packet, up to this.", "us",
              "--jitter", default="0us"),
    DesignKey("switch.slots", _whole(f"1..{MAX_SLOTS}", lambda v: 1 <= v <= MAX_SLOTS, 4096), "slots",
              "INA slot pool (the window); default covers 2x the bandwidth-delay product.", "slots", "--slots", int),
    DesignKey("switch.elements", _whole(" or ".join(map(str, ELEMENTS_ALLOWED)), lambda v: v in ELEMENTS_ALLOWED, 64),
              "elements", "int32 elements per aggregation packet (64 or 256).", "elements", "--elements", int,
              default=64),
    DesignKey("switch.packet_rate", lambda value, source, key: _packet_rate(value, source, key), "packet_rate",
              "Contributions the switch's pipeline processes a second (1.2Gpps, 5e8); default: unlimited "
              "(docs/topology.md).", "packets/s", "--packet-rate"),
    DesignKey("topology.workers_per_node", _whole("1..1024", lambda v: 1 <= v <= 1024, 8),
              "topology.workers_per_node", "Workers (GPUs) per node: gives the network a topology (docs/topology.md).",
              "workers", "--workers-per-node", int),
    DesignKey("topology.nics_per_node", _whole("1..1024", lambda v: 1 <= v <= 1024, 1), "topology.nics_per_node",
              "NICs per node, shared by its workers (topology; default 1).", "NICs", "--nics-per-node", int),
    DesignKey("topology.intra_node_bandwidth", _bandwidth, "topology.intra.bandwidth_bps",
              "Bandwidth inside a node, each worker's port (topology; default 900GBps).", "bits/s",
              "--intra-bandwidth"),
    DesignKey("topology.intra_node_latency", _duration, "topology.intra.latency_us",
              "Latency inside a node (topology; default 1us).", "us", "--intra-latency"),
    DesignKey("topology.leaf_ports", _whole("1..4096", lambda v: 1 <= v <= 4096, 32), "topology.leaf_ports",
              "NIC ports per leaf switch; more nodes take more leaves and a spine (default 32).", "ports",
              "--leaf-ports", int),
    DesignKey("topology.oversubscription", _ratio, "topology.oversubscription",
              "A leaf's NIC ports' capacity over its links to the spine (topology; 2 for 2:1).", "ratio",
              "--oversubscription", float),
    DesignKey("topology.placement", _placement, "topology.placement",
              "Workers on nodes: packed, spread, random, or a node index per worker (0,0,1,1).", "",
              "--placement", flag_value=_as_nodes),
    DesignKey("topology.algorithm", _algorithm, "topology.algorithm",
              "flat or hierarchical where a fabric has both (topology; ina: leaves aggregate first; ring's dense "
              "all_reduces: by node).", "", "--algorithm"),
    DesignKey("topology.spine_latency", _duration, "topology.spine_latency_us",
              "One leaf-spine hop (topology; default: the link's latency).", "us", "--spine-latency"),
    DesignKey("jobs.allocation", _choice(Allocation), "",
              "Several traces on a topology: hand each job whole nodes in turn (interleaved: the jobs share leaves) "
              "or in blocks (contiguous, the default); docs/topology.md.", "", "--allocation",
              commands=frozenset({"replay"})),
    DesignKey("jobs.slot_policy", _choice(SlotPolicy), "", "Several jobs: how they share the switch's slots.",
              commands=frozenset({"replay"})),
    DesignKey("parallelism.mesh", _mesh, "mesh",
              "The layout of a sharded or split trace: its mesh with new sizes for the data-parallel dimensions, "
              "e.g. dp=64,tp=2 (the workers are its product; docs/parallelism.md).", "", "--mesh",
              commands=frozenset({"replay", "predict"})),
    DesignKey("parallelism.moe_imbalance", _imbalance, "moe_imbalance",
              "A mixture of experts at a new ep size: each step's largest all_to_all split over the mean (1: "
              "balanced); default: the trace's measured routing, resampled (docs/moe.md).", "ratio",
              "--moe-imbalance", float, commands=frozenset({"replay", "predict"})),
)
BY_KEY: dict[str, DesignKey] = {k.key: k for k in KEYS}
BY_PARAM: dict[str, DesignKey] = {k.param: k for k in KEYS if k.param is not None}
TABLES: dict[str, tuple[str, ...]] = {}
for _k in KEYS:
    if _k.table is not None:
        TABLES.setdefault(_k.table, ())
        TABLES[_k.table] += (_k.name,)


def flag_value(key: DesignKey, raw: Any) -> Any:
    """A flag's value checked as the design key it sets, its refusal worded for the flag
    ("--bandwidth 'fast': give a rate ..."), not the file ("d.toml: link.bandwidth = 'fast': ...")."""
    assert key.flag is not None
    try:
        return key.check(key.flag_value(raw), key.flag, key.key)
    except ConfigError as exc:
        text = str(exc)
        for prefix in (f"{key.flag}: {key.key} = ", f"{key.flag}: {key.key}"):
            if text.startswith(prefix):
                text = f"{key.flag} " + text[len(prefix):].lstrip()
                break
        raise ConfigError(text) from None


def kind_of(value: Any) -> str:
    """The TOML type of a parsed value, with its article."""
    if isinstance(value, bool):
        return "a boolean"
    for types, name in ((str, "a string"), (int, "an integer"), (float, "a float"), (list, "an array"),
                        (dict, "a table")):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"  # datetime, date, time


def show(value: Any) -> str:
    """A value for a one-line message: short, and safe for integers too long to print."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"(an integer of {value.bit_length()} bits)"
    if isinstance(value, (list, dict)):
        return "[...]" if isinstance(value, list) else "{...}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_text(key: str) -> str:
    """A key as TOML writes it: bare where it can be, else quoted (shortened for a message)."""
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare and len(key) <= 60 else show(key)


def one_line(text: str) -> str:
    return " ".join(text.split())


