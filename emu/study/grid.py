"""The grid of a what-if study: axes of options, and the points they span.

``emu sweep`` and ``emu predict`` take the same options. A comma list of ``--workers``,
``--fabric``, ``--bandwidth``, ``--latency`` or ``--loss`` is an axis; several ``--network``
files are an axis; a repeated ``--straggler`` (whose values hold commas) is an axis; several
traces are swept one after another. Every other option holds one value for the whole grid.

A point's configuration is resolved in one order: the defaults, then the point's design file
(``--network``), then what the user typed, which wins (docs/design.md, "Network design files").
An axis the user did not give holds one unset value, so a design file's fabric or bandwidth is
kept there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path

from emu.emulator.links import parse_bandwidth, parse_duration_us
from emu.errors import ConfigError
from emu.replay.config import ReplayConfig, Straggler
from emu.replay.design import NetworkDesign, load_design

MAX_POINTS = 100_000  # a grid past this is a typo (a comma list pasted twice), not a study


@dataclass(frozen=True)
class Grid:
    """The axes of a study; ``None`` in an axis means "not given: the design's or the default"."""

    traces: tuple[str, ...]
    workers: tuple[int, ...]
    fabrics: tuple[str | None, ...] = (None,)
    bandwidths: tuple[str | None, ...] = (None,)
    latencies: tuple[str | None, ...] = (None,)
    losses: tuple[float | None, ...] = (None,)
    networks: tuple[str | None, ...] = (None,)
    stragglers: tuple[str | None, ...] = (None,)
    base: ReplayConfig = ReplayConfig()
    """The single-valued options (defaults where not typed)."""
    given: frozenset[str] = frozenset()
    """The design keys (``fabric``, ``link.jitter``, ``switch.slots``...) typed as single-valued
    flags: they win over every design file."""

    @property
    def size(self) -> int:
        return (len(self.traces) * len(self.workers) * len(self.fabrics) * len(self.bandwidths)
                * len(self.latencies) * len(self.losses) * len(self.networks) * len(self.stragglers))


@dataclass(frozen=True)
class Point:
    """One replay of a study: a trace and a resolved configuration."""

    trace: str
    label: str  # the trace's short name in tables and file names
    config: ReplayConfig
    design: str | None  # the design's name (or file stem), if the point has one

    @property
    def slug(self) -> str:
        """A file name for the point: readable, and unique by a hash of what changes results."""
        c = self.config
        parts = [self.label, *([_safe(self.design)] if self.design else []), c.fabric, f"w{c.workers}",
                 bandwidth_label(c.link.bandwidth_bps), f"{c.link.latency_us:g}us", f"loss{c.link.loss:g}"]
        return "-".join(parts) + "-" + self.digest[:8]

    @property
    def digest(self) -> str:
        c = self.config
        doc = {"trace": self.trace, "workers": c.workers, "fabric": c.fabric, "link": repr(c.link),
               "iters": c.iters, "seed": c.seed, "slots": c.slots, "elements": c.elements,
               "payload_scale": c.payload_scale, "ps_shards": c.ps_shards, "rto_us": c.rto_us,
               "clock": None if c.clock is None else c.clock.value, "tdf": c.tdf,
               "stragglers": [s.text for s in c.stragglers], "design": c.design_file}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def split_list(text: str, option: str) -> tuple[str, ...]:
    """'8,64, 512' -> ('8', '64', '512'); an empty item is an error naming the option."""
    items = tuple(t.strip() for t in text.split(","))
    if not items or any(not t for t in items):
        raise ConfigError(f"{option} {text!r}: give values separated by commas, such as 8,64,512")
    return items


def int_axis(text: str, option: str) -> tuple[int, ...]:
    values = []
    for item in split_list(text, option):
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"{option} {text!r}: {item!r} is not a whole number") from None
    return _unique(values)


def float_axis(text: str, option: str) -> tuple[float, ...]:
    values = []
    for item in split_list(text, option):
        try:
            values.append(float(item.rstrip("%")) / (100 if item.endswith("%") else 1))
        except ValueError:
            raise ConfigError(f"{option} {text!r}: {item!r} is not a number (0.001 or 0.1%)") from None
    return _unique(values)


def text_axis(text: str, option: str) -> tuple[str, ...]:
    return _unique(list(split_list(text, option)))


def _unique(values: list) -> tuple:
    return tuple(dict.fromkeys(values))


def points(grid: Grid, labels: dict[str, str] | None = None) -> list[Point]:
    """Every point of the grid, checked: an impossible one is a ConfigError before anything runs.

    Traces vary slowest, then designs, fabrics, bandwidths, latencies, losses, stragglers, and
    workers fastest (so a plot's line fills in as the sweep goes).
    """
    if grid.size > MAX_POINTS:
        raise ConfigError(f"the grid has {grid.size:,} points (more than {MAX_POINTS:,}): shorten an axis")
    labels = labels or trace_labels(grid.traces)
    designs: dict[str, NetworkDesign] = {n: load_design(n) for n in grid.networks if n is not None}
    result = []
    for trace, network, fabric, bw, lat, loss, straggler, workers in itertools.product(
            grid.traces, grid.networks, grid.fabrics, grid.bandwidths, grid.latencies, grid.losses,
            grid.stragglers, grid.workers):
        config = grid.base
        design = None
        if network is not None:
            d = designs[network]
            config = d.overlay(config, grid.given)
            config = replace(config, design_file=network, design_name=d.name)
            design = d.name or Path(network).stem
        link = config.link
        if bw is not None:
            link = replace(link, bandwidth_bps=parse_bandwidth(bw))
        if lat is not None:
            link = replace(link, latency_us=parse_duration_us(lat))
        if loss is not None:
            link = replace(link, loss=loss)
        config = replace(config, link=link, workers=workers)
        if fabric is not None:
            config = replace(config, fabric=fabric)
        if straggler is not None:
            config = replace(config, stragglers=(*config.stragglers, Straggler.parse(straggler)))
        config.check()
        result.append(Point(trace=trace, label=labels[trace], config=config, design=design))
    return result


def trace_labels(traces: tuple[str, ...]) -> dict[str, str]:
    """Short names: the file's stem without .json(.gz), made unique by their folder where needed."""
    def stem(path: str) -> str:
        name = Path(path).name
        for suffix in (".gz", ".json"):
            name = name.removesuffix(suffix)
        return _safe(name)

    labels = {t: stem(t) for t in traces}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    for t in traces:
        if counts[labels[t]] > 1:
            labels[t] = _safe(f"{Path(t).parent.name}-{labels[t]}")
    return labels


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in text)[:40] or "x"


def bandwidth_label(bps: float) -> str:
    if bps == float("inf"):
        return "ideal"
    for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bps"
