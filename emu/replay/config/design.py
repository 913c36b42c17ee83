"""Network design files: the TOML a user passes as ``--network design.toml``.

This module owns the design file's keys and their meaning (docs/design.md, "Network design
files"): reading and checking a file (``load_design``, ``parse_design``), laying a design over a
replay's configuration with the flags a user typed winning (``NetworkDesign.overlay``), and the
design as a run resolved it for the report (``resolved_design``). Every refusal is one ConfigError
line naming the file, the dotted key and the fix. ``[topology]`` describes nodes, NICs, leaves and
the placement (``emu.emulator.topology``, docs/topology.md); ``[parallelism]`` the layout a sharded
or split trace replays at (``mesh``, docs/parallelism.md), which sets the number of workers.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emu.emulator import fabric as fabrics
from emu.emulator.links import LinkSpec, parse_bandwidth, parse_duration_us, parse_schedule
from emu.emulator.topology import Algorithm, Allocation, Placement, SlotPolicy, Topology
from emu.emulator.wire import ELEMENTS_ALLOWED
from emu.errors import ConfigError
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.layout import parse_mesh
from emu.traces.mesh import Mesh

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, packaged before it joined the standard library
    import tomli as tomllib

# A design is a few lines; anything this large is the wrong file, and reading it whole would be
# the only cost a mistyped path could impose.
MAX_DESIGN_BYTES = 1 << 20
MAX_SLOTS = 1 << 24  # the --slots bound (ReplayConfig.check)

# The dotted keys a design may set that map to the configuration, in the order they are written.
TOPOLOGY_KEYS: tuple[str, ...] = ("topology.workers_per_node", "topology.nics_per_node",
                                  "topology.intra_node_bandwidth", "topology.intra_node_latency",
                                  "topology.leaf_ports", "topology.oversubscription", "topology.placement",
                                  "topology.algorithm", "topology.spine_latency")
KEYS: tuple[str, ...] = ("fabric", "link.bandwidth", "link.bandwidth_schedule", "link.latency", "link.loss",
                         "link.jitter", "switch.slots", "switch.elements", "switch.packet_rate", *TOPOLOGY_KEYS,
                         "parallelism.mesh")
# The replay flags (click's parameter names) that set the same things: a flag the user typed wins.
FLAG_KEYS: dict[str, str] = {"fabric": "fabric", "bandwidth": "link.bandwidth",
                             "bandwidth_schedule": "link.bandwidth_schedule", "latency": "link.latency",
                             "loss": "link.loss", "jitter": "link.jitter", "slots": "switch.slots",
                             "packet_rate": "switch.packet_rate",
                             "elements": "switch.elements", "workers_per_node": "topology.workers_per_node",
                             "nics_per_node": "topology.nics_per_node",
                             "intra_bandwidth": "topology.intra_node_bandwidth",
                             "intra_latency": "topology.intra_node_latency", "leaf_ports": "topology.leaf_ports",
                             "oversubscription": "topology.oversubscription", "placement": "topology.placement",
                             "algorithm": "topology.algorithm", "spine_latency": "topology.spine_latency",
                             "mesh": "parallelism.mesh"}
_LABELS = ("name", "description")
_TABLES = {"link": ("bandwidth", "bandwidth_schedule", "latency", "loss", "jitter"),
           "switch": ("slots", "elements", "packet_rate"),
           "topology": tuple(k.split(".")[1] for k in TOPOLOGY_KEYS),
           "jobs": ("allocation", "slot_policy"),  # several jobs sharing the fabric (emu.replay.jobs)
           "parallelism": ("mesh",)}  # the layout of a sharded or split trace (emu.replay.plan.layout)
_ALLOWED = (*_LABELS, "fabric", *_TABLES)
_EXAMPLE = "examples/designs/ina-100g.toml"


@dataclass(frozen=True)
class NetworkDesign:
    """A parsed design; every value None where the file does not set it (the flag's default holds)."""

    path: str | None = None
    """The file it came from (or the source name given to parse_design)."""
    name: str | None = None
    """A label for tables and plots."""
    description: str | None = None
    fabric: str | None = None
    bandwidth_bps: float | None = None
    """math.inf for an ideal link."""
    schedule: tuple[tuple[float, float], ...] | None = None
    """A bandwidth that steps over emulated time (``link.bandwidth_schedule``); its first step is the
    bandwidth."""
    latency_us: float | None = None
    loss: float | None = None
    jitter_us: float | None = None
    slots: int | None = None
    elements: int | None = None
    packet_rate: float | None = None
    """Contributions the switch's pipeline processes a second (``switch.packet_rate``)."""
    workers_per_node: int | None = None
    nics_per_node: int | None = None
    intra_bps: float | None = None
    intra_latency_us: float | None = None
    leaf_ports: int | None = None
    oversubscription: float | None = None
    placement: tuple[Placement, tuple[int, ...]] | None = None
    algorithm: Algorithm | None = None
    spine_latency_us: float | None = None
    allocation: Allocation | None = None
    """Several jobs: how the fabric's nodes are handed out (``--allocation``)."""
    slot_policy: SlotPolicy | None = None
    """Several jobs: how they share the switch's slots."""
    mesh: Mesh | None = None
    """The layout a sharded or split trace replays at (``parallelism.mesh = "dp=64,tp=2"``)."""

    def value(self, key: str) -> Any:
        """The value the design gives dotted ``key`` (one of KEYS), None where unset."""
        return getattr(self, _FIELDS[key])

    def overlay(self, config: ReplayConfig, given: frozenset[str]) -> ReplayConfig:
        """``config`` with every key this design sets replaced, except the dotted keys in ``given``
        (the flags the user typed: flags win over the design, the design over the defaults).

        ``given`` holds keys of KEYS (FLAG_KEYS maps flag names to them); any other is a caller's
        mistake that would silently lose a flag, so it raises ValueError. The caller runs
        ``config.check()`` on the result.
        """
        unknown = sorted(set(given) - set(KEYS))
        if unknown:
            raise ValueError(f"overlay: {unknown} are not design keys (one of {KEYS})")
        take = {key: self.value(key) for key in KEYS if key not in given and self.value(key) is not None}
        if "link.bandwidth_schedule" in take and "link.bandwidth" in given:
            raise ConfigError(f"{self.path}: link.bandwidth_schedule sets the bandwidth over time, and --bandwidth "
                              "was given too: drop --bandwidth, or the design's schedule")
        if "link.bandwidth_schedule" in given:  # the typed schedule's first step is the bandwidth
            take.pop("link.bandwidth", None)
        link = {_FIELDS[k]: v for k, v in take.items() if k.startswith("link.")}
        if "schedule" in link:
            link["bandwidth_bps"] = link["schedule"][0][1]
        top: dict[str, Any] = {}
        if "fabric" in take:
            top["fabric"] = take["fabric"]
        if "switch.slots" in take:
            top["slots"] = take["switch.slots"]
        if "switch.elements" in take:
            top["elements"] = take["switch.elements"]
        if "switch.packet_rate" in take:
            top["packet_rate"] = take["switch.packet_rate"]
        if "parallelism.mesh" in take:  # the workers follow it (the CLI checks a typed --workers)
            top["mesh"] = take["parallelism.mesh"]
            top["workers"] = take["parallelism.mesh"].size
        if link:
            top["link"] = dataclasses.replace(config.link, **link)
        shape = {k: v for k, v in take.items() if k.startswith("topology.")}
        if shape:
            top["topology"] = topology_with(config.topology or Topology(), shape)
        return dataclasses.replace(config, **top) if top else config


def topology_from_flags(flags: dict[str, Any]) -> Topology | None:
    """The topology the typed flags give (click's parameter names: FLAG_KEYS), the rest defaults;
    None where no topology flag was given. Each value is checked as the design key it sets."""
    flag_of = {key: name for name, key in FLAG_KEYS.items()}
    values = {}
    for key in TOPOLOGY_KEYS:
        raw = flags.get(flag_of[key])
        if raw is None:
            continue
        if key == "topology.placement" and isinstance(raw, str) and raw.replace(",", "").strip().isdigit():
            raw = [int(x) for x in raw.split(",")]  # a node index per worker; anything else is checked below
        values[key] = _CHECKS[key](raw, f"--{flag_of[key].replace('_', '-')}", key)
    return topology_with(Topology(), values) if values else None


def topology_with(base: Topology, values: dict[str, Any]) -> Topology:
    """``base`` with the dotted topology keys in ``values`` (checked values, as the design holds them)."""
    change: dict[str, Any] = {}
    intra = base.intra
    for key, value in values.items():
        name = key.split(".")[1]
        if name == "intra_node_bandwidth":
            intra = dataclasses.replace(intra, bandwidth_bps=value)
        elif name == "intra_node_latency":
            intra = dataclasses.replace(intra, latency_us=value)
        elif name == "placement":
            change["placement"], change["nodes"] = value
        else:
            change[_FIELDS[key]] = value
    return dataclasses.replace(base, intra=intra, **change)


_FIELDS = {"fabric": "fabric", "link.bandwidth": "bandwidth_bps", "link.bandwidth_schedule": "schedule",
           "link.latency": "latency_us",
           "link.loss": "loss", "link.jitter": "jitter_us", "switch.slots": "slots",
           "switch.packet_rate": "packet_rate",
           "switch.elements": "elements", "topology.workers_per_node": "workers_per_node",
           "topology.nics_per_node": "nics_per_node", "topology.intra_node_bandwidth": "intra_bps",
           "topology.intra_node_latency": "intra_latency_us", "topology.leaf_ports": "leaf_ports",
           "topology.oversubscription": "oversubscription", "topology.placement": "placement",
           "topology.algorithm": "algorithm", "topology.spine_latency": "spine_latency_us",
           "jobs.allocation": "allocation", "jobs.slot_policy": "slot_policy", "parallelism.mesh": "mesh"}


def load_design(path: str | os.PathLike) -> NetworkDesign:
    """Read and check the design file at ``path`` (ConfigError naming it for anything wrong)."""
    name = os.fsdecode(path)
    try:
        with open(name, "rb") as f:
            # one byte past the bound tells a too-large file without reading all of it
            data = f.read(MAX_DESIGN_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file: give the path of a network design (a .toml file such as "
                          f"{_EXAMPLE})") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory: give a design file in it (a .toml file such as "
                          f"{_EXAMPLE})") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read it ({exc.strerror or type(exc).__name__}): give a readable "
                          "design file") from None
    if len(data) > MAX_DESIGN_BYTES:
        raise ConfigError(f"{name}: larger than {MAX_DESIGN_BYTES} bytes, and a network design is a few lines: "
                          "give the design's .toml file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text (byte {exc.start}): save the design as UTF-8") from None
    return parse_design(text, name)


def parse_design(text: str, source: str) -> NetworkDesign:
    """Check a design's TOML ``text``; ``source`` names it in every message."""
    if len(text) > MAX_DESIGN_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_DESIGN_BYTES} characters, and a network design is a few "
                          "lines: give the design's .toml file")
    try:
        doc = tomllib.loads(text.removeprefix("\ufeff"))  # editors on Windows begin UTF-8 with a BOM
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {_one_line(str(exc))}: fix the syntax there (values that "
                          'are text need quotes: bandwidth = "100Gbps")') from None
    except RecursionError:
        raise ConfigError(f"{source}: nests arrays or tables too deeply: a design is a few keys in [link] and "
                          "[switch]") from None
    except ValueError:  # an integer past Python's limit on digits (4300): no design value is near it
        raise ConfigError(f"{source}: holds an integer of thousands of digits: give values of ordinary size "
                          "(switch.slots = 4096)") from None
    return _design(doc, source)


def _design(doc: dict[str, Any], source: str) -> NetworkDesign:
    _refuse_unknown(doc, source)
    values: dict[str, Any] = {"path": source}
    for label in _LABELS:
        if label in doc:
            values[label] = _label(doc[label], source, label)
    if "fabric" in doc:
        values["fabric"] = _fabric(doc["fabric"], source)
    for table, keys in _TABLES.items():
        sub = doc.get(table, {})
        for key in keys:
            if key in sub:
                dotted = f"{table}.{key}"
                values[_FIELDS[dotted]] = _CHECKS[dotted](sub[key], source, dotted)
    if values.get("schedule") is not None and values.get("bandwidth_bps") is not None:
        raise ConfigError(f"{source}: link.bandwidth and link.bandwidth_schedule both set the bandwidth: keep "
                          "one (the schedule's first step is the bandwidth from 0s)")
    return NetworkDesign(**values)


def _refuse_unknown(doc: dict[str, Any], source: str) -> None:
    for key in doc:
        if key not in _ALLOWED:
            raise ConfigError(f"{source}: unknown key {_key(key)}{_closest(key, None)}: a design takes "
                              "name, description, fabric, [link], [switch], [topology], [jobs] and [parallelism]")
    for table, keys in _TABLES.items():
        if table not in doc:
            continue
        sub = doc[table]
        if not isinstance(sub, dict):
            raise ConfigError(f"{source}: {table} = {_show(sub)} is {_kind(sub)}: write a [{table}] table "
                              f"with its keys ({', '.join(keys)})")
        for key in sub:
            if key not in keys:
                dotted = f"{table}.{_key(key)}"
                raise ConfigError(f"{source}: unknown key {dotted}{_closest(key, table)}: [{table}] takes "
                                  f"{', '.join(keys)}")


def _closest(key: str, table: str | None) -> str:
    """' (did you mean X?)' for the allowed key nearest to a mistyped one, or ''."""
    dotted = [f"{t}.{k}" for t, ks in _TABLES.items() for k in ks]
    if table is None:
        pool = [*_ALLOWED, *dotted]
        candidates = {k.lower(): k for k in pool}
        # a key of a table written at the top (bandwidth instead of [link] bandwidth)
        leaf = [d for d in dotted if d.split(".")[1] == key.lower()]
    else:
        candidates = {k: f"{table}.{k}" for k in _TABLES[table]}
        # a key of the other table (link.slots instead of switch.slots)
        leaf = [d for d in dotted if d.split(".")[1] == key.lower() and not d.startswith(table + ".")]
    best = leaf or [candidates[m] for m in difflib.get_close_matches(key.lower(), list(candidates), n=1)]
    return f" (did you mean {best[0]}?)" if best else ""


def _label(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {key} = {_show(value)} is {_kind(value)}: give a string such as "
                          f'{key} = "ina-100g"')
    # the name labels table rows and plot legends, where a control character would break the line
    if key == "name" and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{source}: name = {_show(value)} holds a control character: give one line of text")
    return value


def _fabric(value: Any, source: str) -> str:
    known = fabrics.names()
    if not isinstance(value, str):
        raise ConfigError(f'{source}: fabric = {_show(value)} is {_kind(value)}: give a fabric\'s name as a '
                          f'string, one of {", ".join(known)} (fabric = "ina")')
    if value not in known:
        near = difflib.get_close_matches(value.lower(), known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{source}: fabric = {_show(value)} is not a fabric{hint}: give one of {', '.join(known)}")
    return value


def _bandwidth(value: Any, source: str, key: str) -> float:
    if not isinstance(value, str):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(f'{source}: {key} = {_show(value)} has no unit: give a string like "100Gbps" '
                              '(b = bits, B = bytes: "12.5GBps")')
        raise ConfigError(f'{source}: {key} = {_show(value)} is {_kind(value)}: give a string like "100Gbps"')
    try:
        return parse_bandwidth(value)
    except ConfigError:
        raise ConfigError(f'{source}: {key} = {_show(value)}: give a rate with a unit from 1kbps to 100Tbps, '
                          'e.g. "100Gbps", "400Gbit", "12.5GBps" (b = bits, B = bytes), or "ideal"') from None


def _duration(value: Any, source: str, key: str) -> float:
    if not isinstance(value, str):
        why = "has no unit" if isinstance(value, (int, float)) and not isinstance(value, bool) else f"is {_kind(value)}"
        raise ConfigError(f'{source}: {key} = {_show(value)} {why}: give a string like "5us" (ns, us, ms or s)')
    try:
        return parse_duration_us(value, key)
    except ConfigError:
        raise ConfigError(f'{source}: {key} = {_show(value)}: give a duration with a unit, at most a day, '
                          'e.g. "5us", "1ms", "0us"') from None


def _schedule(value: Any, source: str, key: str) -> tuple[tuple[float, float], ...]:
    example = '"0s:100Gbps,20ms:10Gbps"'
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {key} = {_show(value)} is {_kind(value)}: give a string of TIME:BANDWIDTH "
                          f"steps such as {example}")
    try:
        steps = parse_schedule(value)
        LinkSpec(bandwidth_bps=steps[0][1], schedule=steps)  # the steps' own rules
    except ConfigError:
        raise ConfigError(f"{source}: {key} = {_show(value)}: give TIME:BANDWIDTH steps from 0s, forward in "
                          f"time, each from 1kbps to 100Tbps, e.g. {example}") from None
    return steps


def _loss(value: Any, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {key} = {_show(value)} is {_kind(value)}: give a number such as 0.01 "
                          "(a probability, not a percentage)")
    if not 0 <= value < 1:  # NaN fails this too
        raise ConfigError(f"{source}: {key} = {_show(value)}: give a probability in [0, 1), such as 0.01")
    return float(value)


def _whole(allowed: str, ok: Callable[[int], bool], example: int) -> Callable[[Any, str, str], int]:
    def check(value: Any, source: str, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} = {_show(value)} is {_kind(value)}: give a whole number such "
                              f"as {example}")
        if not ok(value):
            raise ConfigError(f"{source}: {key} = {_show(value)}: give {allowed}")
        return value
    return check


def _ratio(value: Any, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {key} = {_show(value)} is {_kind(value)}: give a number such as 1 "
                          "(non-blocking) or 2 (2:1)")
    if not (math.isfinite(value) and value >= 1):
        raise ConfigError(f"{source}: {key} = {_show(value)}: give 1 (non-blocking) or more (2 for 2:1)")
    return float(value)


def _placement(value: Any, source: str, key: str) -> tuple[Placement, tuple[int, ...]]:
    """packed, spread, random, or a list of node indices (one per worker)."""
    if isinstance(value, str) and value in (p.value for p in Placement if p != Placement.LIST):
        return Placement(value), ()
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return Placement.LIST, tuple(value)
    raise ConfigError(f'{source}: {key} = {_show(value)}: give "packed", "spread", "random" or a list of node '
                      "indices, one per worker ([0, 0, 1, 1])")


def _choice(kind: type[enum.Enum]) -> Callable[[Any, str, str], Any]:
    names = [str(c.value) for c in kind]  # type: ignore[attr-defined]

    def check(value: Any, source: str, key: str) -> Any:
        if isinstance(value, str) and value in names:
            return kind(value)
        raise ConfigError(f"{source}: {key} = {_show(value)}: give " + " or ".join(f'"{n}"' for n in names))
    return check


def _packet_rate(value: Any, source: str, key: str) -> float:
    """Packets a second: a number, or text with a unit ("1.2Gpps", "500Mpps", "2e9")."""
    try:
        rate = parse_packet_rate(value) if isinstance(value, str) else float(value)
    except (ValueError, TypeError, ConfigError):
        rate = math.nan
    if isinstance(value, bool) or not (math.isfinite(rate) and 1 <= rate <= 1e13):
        raise ConfigError(f'{source}: {key} = {_show(value)}: give packets a second, 1 to 1e13 (1.2e9 or "1.2Gpps")')
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
        raise ConfigError(f'{source}: {key} = {_show(value)} is {_kind(value)}: give the layout as a string of '
                          'NAME=SIZE pairs, outermost first, such as "dp=64,tp=2"')
    try:
        return parse_mesh(value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {key}: {str(exc).removeprefix('--mesh ')}") from None


def _algorithm(value: Any, source: str, key: str) -> Algorithm:
    if isinstance(value, str) and value in (a.value for a in Algorithm):
        return Algorithm(value)
    raise ConfigError(f'{source}: {key} = {_show(value)}: give "flat" or "hierarchical"')


_CHECKS: dict[str, Callable[[Any, str, str], Any]] = {
    "link.bandwidth": _bandwidth, "link.bandwidth_schedule": _schedule, "link.latency": _duration, "link.loss": _loss, "link.jitter": _duration,
    "switch.slots": _whole(f"1..{MAX_SLOTS}", lambda v: 1 <= v <= MAX_SLOTS, 4096),
    "switch.elements": _whole(" or ".join(map(str, ELEMENTS_ALLOWED)), lambda v: v in ELEMENTS_ALLOWED, 64),
    "switch.packet_rate": lambda value, source, key: _packet_rate(value, source, key),
    "topology.workers_per_node": _whole("1..1024", lambda v: 1 <= v <= 1024, 8),
    "topology.nics_per_node": _whole("1..1024", lambda v: 1 <= v <= 1024, 1),
    "topology.intra_node_bandwidth": _bandwidth, "topology.intra_node_latency": _duration,
    "topology.leaf_ports": _whole("1..4096", lambda v: 1 <= v <= 4096, 32),
    "topology.oversubscription": _ratio, "topology.placement": _placement, "topology.algorithm": _algorithm,
    "topology.spine_latency": _duration, "jobs.allocation": _choice(Allocation), "jobs.slot_policy": _choice(SlotPolicy),
    "parallelism.mesh": _mesh,
}


def _kind(value: Any) -> str:
    """The TOML type of a parsed value, with its article."""
    if isinstance(value, bool):
        return "a boolean"
    for types, name in ((str, "a string"), (int, "an integer"), (float, "a float"), (list, "an array"),
                        (dict, "a table")):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"  # datetime, date, time


def _show(value: Any) -> str:
    """A value for a one-line message: short, and safe for integers too long to print."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"(an integer of {value.bit_length()} bits)"
    if isinstance(value, (list, dict)):
        return "[...]" if isinstance(value, list) else "{...}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(key: str) -> str:
    """A key as TOML writes it: bare where it can be, else quoted (shortened for a message)."""
    bare = key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key)
    return key if bare and len(key) <= 60 else _show(key)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def resolved_design(config: ReplayConfig, design: NetworkDesign | None = None) -> dict[str, Any]:
    """The design a run used, defaults filled in, for the report (bandwidth None: an ideal link).
    Without ``design``, the file and name are those the configuration records."""
    link = config.link
    resolved_link: dict[str, Any] = {"bandwidth_bps": None if math.isinf(link.bandwidth_bps) else link.bandwidth_bps}
    if link.schedule:  # only where there is one: designs without keep the keys they always had
        resolved_link["bandwidth_schedule"] = [list(step) for step in link.schedule]
    resolved_link.update(latency_us=link.latency_us, loss=link.loss, jitter_us=link.jitter_us)
    resolved = {"file": design.path if design else config.design_file,
                "name": design.name if design else config.design_name,
                "fabric": config.fabric, "link": resolved_link,
                "switch": {"slots": config.emulated_slots, "elements": config.elements}}
    if config.packet_rate is not None:  # only where there is one: designs without keep their keys
        resolved["switch"]["packet_rate"] = config.packet_rate
    if config.topology is not None:  # only where there is one: reports without keep their keys
        resolved["topology"] = config.topology.to_dict(config.link)
    if config.mesh is not None:  # only where there is one
        resolved["parallelism"] = {"mesh": config.mesh.text()}
    return resolved
