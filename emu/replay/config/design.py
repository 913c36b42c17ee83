"""Network design files: the TOML a user passes as ``--network design.toml``.

This module owns the design file's keys and their meaning (docs/design.md, "Network design
files"): reading and checking a file (``load_design``, ``parse_design``), laying a design over a
replay's configuration with the flags a user typed winning (``NetworkDesign.overlay``), and the
design as a run resolved it for the report (``resolved_design``). Every refusal is one ConfigError
line naming the file, the dotted key and the fix. ``[topology]`` describes nodes, NICs, leaves and
the placement (``emu.emulator.links.topology``, docs/topology.md); ``[parallelism]`` the layout a sharded
or split trace replays at (``mesh``, docs/parallelism.md), which sets the number of workers.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from emu.emulator.links.topology import Topology
from emu.errors import ConfigError
from emu.replay.config.keys import BY_KEY, TABLES, check_label, flag_value, key_text, kind_of, one_line, show
from emu.replay.config.keys import KEYS as DESIGN_KEYS
from emu.replay.config.options import ReplayConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, packaged before it joined the standard library
    import tomli as tomllib

# A design is a few lines; anything this large is the wrong file, and reading it whole would be
# the only cost a mistyped path could impose.
MAX_DESIGN_BYTES = 1 << 20

# The dotted keys a design may set that map to the configuration, and the flags that set them.
TOPOLOGY_KEYS: tuple[str, ...] = tuple(k.key for k in DESIGN_KEYS if k.table == "topology")
KEYS: tuple[str, ...] = tuple(k.key for k in DESIGN_KEYS if k.lands)
FLAG_KEYS: dict[str, str] = {k.param: k.key for k in DESIGN_KEYS if k.param is not None}
_LABELS = ("name", "description")
_TABLES = TABLES
_ALLOWED = (*_LABELS, "fabric", *_TABLES)
_EXAMPLE = "examples/designs/ina-100g.toml"


@dataclass(frozen=True)
class NetworkDesign:
    """A parsed design: the values of the keys it sets (``emu.replay.config.keys``), checked."""

    path: str | None = None
    """The file it came from (or the source name given to parse_design)."""
    name: str | None = None
    """A label for tables and plots."""
    description: str | None = None
    values: tuple[tuple[str, Any], ...] = ()
    """(dotted key, checked value) of every key the file sets, in the table's order."""

    @classmethod
    def of(cls, path: str | None = None, name: str | None = None, description: str | None = None,
           values: dict[str, Any] | None = None) -> NetworkDesign:
        """A design of checked ``values`` by dotted key (in the table's order, as a file's)."""
        given = values or {}
        unknown = sorted(set(given) - set(BY_KEY))
        if unknown:
            raise ValueError(f"{unknown} are not design keys")
        return cls(path=path, name=name, description=description,
                   values=tuple((k.key, given[k.key]) for k in DESIGN_KEYS if k.key in given))

    def value(self, key: str) -> Any:
        """The value the design gives dotted ``key`` (one of the table's), None where unset."""
        if key not in BY_KEY:
            raise ValueError(f"{key!r} is not a design key")
        return dict(self.values).get(key)

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
        take = {key: v for key, v in self.values if key in KEYS and key not in given}
        if "link.bandwidth_schedule" in take and "link.bandwidth" in given:
            raise ConfigError(f"{self.path}: link.bandwidth_schedule sets the bandwidth over time, and --bandwidth "
                              "was given too: drop --bandwidth, or the design's schedule")
        if "link.bandwidth_schedule" in given:  # the typed schedule's first step is the bandwidth
            take.pop("link.bandwidth", None)
        return apply(config, take)


def apply(config: ReplayConfig, values: dict[str, Any]) -> ReplayConfig:
    """``config`` with the checked values of dotted keys set where each key lands (its table row)."""
    top: dict[str, Any] = {}
    link: dict[str, Any] = {}
    shape: dict[str, Any] = {}
    for key, value in values.items():
        lands = BY_KEY[key].lands
        if lands.startswith("link."):
            link[lands.removeprefix("link.")] = value
        elif lands.startswith("topology."):
            shape[key] = value
        elif lands:
            top[lands] = value
    if "schedule" in link:
        link["bandwidth_bps"] = link["schedule"][0][1]
    if "mesh" in top:  # the workers follow it (the CLI checks a typed --workers)
        top["workers"] = top["mesh"].size
    if link:
        top["link"] = dataclasses.replace(config.link, **link)
    if shape:
        top["topology"] = topology_with(config.topology or Topology(), shape)
    return dataclasses.replace(config, **top) if top else config


def topology_from_flags(flags: dict[str, Any]) -> Topology | None:
    """The topology the typed flags give (click's parameter names: FLAG_KEYS), the rest defaults;
    None where no topology flag was given. Each value is checked as the design key it sets."""
    values = {key: flag_value(BY_KEY[key], flags[BY_KEY[key].param]) for key in TOPOLOGY_KEYS
              if flags.get(BY_KEY[key].param) is not None}
    return topology_with(Topology(), values) if values else None


def topology_with(base: Topology, values: dict[str, Any]) -> Topology:
    """``base`` with the dotted topology keys in ``values`` (checked values, as the design holds them)."""
    change: dict[str, Any] = {}
    intra = base.intra
    for key, value in values.items():
        lands = BY_KEY[key].lands.removeprefix("topology.")
        if lands.startswith("intra."):
            intra = dataclasses.replace(intra, **{lands.removeprefix("intra."): value})
        elif lands == "placement":
            change["placement"], change["nodes"] = value
        else:
            change[lands] = value
    return dataclasses.replace(base, intra=intra, **change)


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
        text = one_line(str(exc))
        fix = ("a key or table is given twice: keep one" if text.startswith(("Cannot overwrite", "Cannot declare"))
               else 'fix the syntax there (values that are text need quotes: bandwidth = "100Gbps")')
        raise ConfigError(f"{source}: not valid TOML: {text}: {fix}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nests arrays or tables too deeply: a design is a few keys in [link] and "
                          "[switch]") from None
    except ValueError:  # an integer past Python's limit on digits (4300): no design value is near it
        raise ConfigError(f"{source}: holds an integer of thousands of digits: give values of ordinary size "
                          "(switch.slots = 4096)") from None
    return _design(doc, source)


def _design(doc: dict[str, Any], source: str) -> NetworkDesign:
    _refuse_unknown(doc, source)
    labels = {label: check_label(doc[label], source, label) for label in _LABELS if label in doc}
    values = []
    for k in DESIGN_KEYS:
        table = doc if k.table is None else doc.get(k.table, {})
        if k.name in table:
            values.append((k.key, k.check(table[k.name], source, k.key)))
    found = dict(values)
    if not found and not doc.get("jobs"):  # empty, comments, empty tables or a name alone: a mistake
        raise ConfigError(f"{source}: sets nothing: a design sets at least one key (fabric = \"ina\", [link] "
                          "bandwidth = \"100Gbps\", ...); for the defaults, give no --network")
    if found.get("link.bandwidth_schedule") is not None and found.get("link.bandwidth") is not None:
        raise ConfigError(f"{source}: link.bandwidth and link.bandwidth_schedule both set the bandwidth: keep "
                          "one (the schedule's first step is the bandwidth from 0s)")
    return NetworkDesign(path=source, values=tuple(values), **labels)


def _refuse_unknown(doc: dict[str, Any], source: str) -> None:
    for key in doc:
        if key not in _ALLOWED:
            raise ConfigError(f"{source}: unknown key {key_text(key)}{_closest(key, None)}: a design takes "
                              "name, description, fabric, [link], [switch], [topology], [jobs] and [parallelism]")
    for table, keys in _TABLES.items():
        if table not in doc:
            continue
        sub = doc[table]
        if not isinstance(sub, dict):
            raise ConfigError(f"{source}: {table} = {show(sub)} is {kind_of(sub)}: write a [{table}] table "
                              f"with its keys ({', '.join(keys)})")
        for key in sub:
            if key not in keys:
                dotted = f"{table}.{key_text(key)}"
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
    if config.moe_imbalance is not None:
        resolved.setdefault("parallelism", {})["moe_imbalance"] = config.moe_imbalance
    return resolved
