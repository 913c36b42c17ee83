"""The grid of a what-if study: axes of options, and the points they span.

``emu sweep`` and ``emu predict`` take the same options. A comma list of ``--workers``,
``--fabric``, ``--bandwidth``, ``--latency`` or ``--loss`` is an axis; several ``--network``
files are an axis; a repeated ``--straggler`` (whose values hold commas) is an axis; several
traces are swept one after another. Every other option (``--sparsity`` too) holds one value for
the whole grid.

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
from typing import TypeVar

from emu.emulator.links.spec import format_bandwidth, parse_bandwidth, parse_duration_us
from emu.errors import ConfigError
from emu.replay import CompressOption, NetworkDesign, ReplayConfig, SparsityOption, Straggler, load_design
from emu.traces.io import load_trace, trace_digest
from emu.traces.model import Trace

T = TypeVar("T")
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
    label: str  # the trace's short name in tables and file names (unique in the study)
    trace_sha256: str  # its content (trace_digest): a changed file is a new point
    config: ReplayConfig
    design: str | None  # the design's label (its name, else its file's), unique in the study

    @property
    def slug(self) -> str:
        """A file name for the point: readable, and unique by a hash of what changes results."""
        c = self.config
        parts = [self.label, *([_safe(self.design)] if self.design else []), c.fabric, f"w{c.workers}",
                 format_bandwidth(c.link.bandwidth_bps), f"{c.link.latency_us:g}us", f"loss{c.link.loss:g}"]
        return "-".join(parts) + "-" + self._hash(exclude=())[:8]

    @property
    def peers(self) -> str:
        """The same for points that differ only in fabric, design identity and workers: speedup and
        scaling efficiency compare such points (a design's other values stay in)."""
        return self._hash(exclude=("fabric", "workers", "design"))[:16]

    def _hash(self, exclude: tuple[str, ...]) -> str:
        c = self.config
        doc = {"trace": self.trace_sha256, "workers": c.workers, "fabric": c.fabric, "link": repr(c.link),
               "iters": c.iters, "seed": c.seed, "slots": c.slots, "elements": c.elements,
               "payload_scale": c.payload_scale, "ps_shards": c.ps_shards, "rto_us": c.rto_us,
               "clock": None if c.clock is None else c.clock.value, "tdf": c.tdf,
               "stragglers": [s.text for s in c.stragglers], "design": c.design_file}
        if c.sparsity != SparsityOption():  # only where given: the slugs of dense studies stay as they were
            doc["sparsity"] = [c.sparsity.text, c.sparsity.block_elements]
        if c.compress != CompressOption():
            doc["compress"] = [c.compress.label, c.compress.speed]
        for key in exclude:
            doc.pop(key)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class TraceCache:
    """Each trace file read once per study, with its content hash."""

    def __init__(self) -> None:
        self._traces: dict[str, Trace] = {}
        self._digests: dict[str, str] = {}

    def get(self, path: str) -> Trace:
        if path not in self._traces:
            self._traces[path] = load_trace(path)
        return self._traces[path]

    def digest(self, path: str) -> str:
        if path not in self._digests:
            self._digests[path] = trace_digest(self.get(path))
        return self._digests[path]


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
    return unique(values)


def float_axis(text: str, option: str) -> tuple[float, ...]:
    values = []
    for item in split_list(text, option):
        try:
            values.append(float(item.rstrip("%")) / (100 if item.endswith("%") else 1))
        except ValueError:
            raise ConfigError(f"{option} {text!r}: {item!r} is not a number (0.001 or 0.1%)") from None
    return unique(values)


def text_axis(text: str, option: str) -> tuple[str, ...]:
    return unique(list(split_list(text, option)))


def unique(values: list[T]) -> tuple[T, ...]:
    """The values in their order, each once (an axis given twice is one axis)."""
    return tuple(dict.fromkeys(values))


def points(grid: Grid, traces: TraceCache | None = None) -> list[Point]:
    """Every point of the grid, checked: a missing trace or an impossible configuration is an
    error before anything runs.

    Traces vary slowest, then designs, fabrics, bandwidths, latencies, losses, stragglers, and
    workers fastest (so a plot's line fills in as the sweep goes).
    """
    if grid.size > MAX_POINTS:
        raise ConfigError(f"the grid has {grid.size:,} points (more than {MAX_POINTS:,}): shorten an axis")
    traces = traces or TraceCache()
    digests = {t: traces.digest(t) for t in grid.traces}  # reads (and checks) every trace first
    labels = unique_labels({t: _stem(t) for t in grid.traces})
    designs: dict[str, NetworkDesign] = {n: load_design(n) for n in grid.networks if n is not None}
    design_labels = unique_labels({n: d.name or _stem(n) for n, d in designs.items()})
    result = []
    for trace, network, fabric, bw, lat, loss, straggler, workers in itertools.product(
            grid.traces, grid.networks, grid.fabrics, grid.bandwidths, grid.latencies, grid.losses,
            grid.stragglers, grid.workers):
        config = grid.base
        if network is not None:
            d = designs[network]
            if d.value("parallelism.mesh") is not None:  # a grid's workers grow a trace's data-parallel dimension
                raise ConfigError(f"{network}: parallelism.mesh lays out one replay, and a study's --workers give "
                                  "each point its size (a sharded trace's data-parallel dimension grows to fit): "
                                  "drop [parallelism] from the design (emu predict takes --mesh)")
            config = replace(d.overlay(config, grid.given), design_file=network, design_name=d.name)
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
        result.append(Point(trace=trace, label=labels[trace], trace_sha256=digests[trace], config=config,
                            design=None if network is None else design_labels[network]))
    return result


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in (".gz", ".json", ".toml"):
        name = name.removesuffix(suffix)
    return name


def unique_labels(wanted: dict[str, str]) -> dict[str, str]:
    """Short labels for paths, made unique by prefixing folder names where two would be equal
    (a/x/mlp.json.gz and b/x/mlp.json.gz become a_x_mlp and b_x_mlp)."""
    labels = {}
    for path, label in wanted.items():
        parents = Path(path).resolve().parent.parts[::-1]
        depth = 0
        while depth < len(parents) and any(
                other != path and _prefixed(other, wanted[other], depth) == _prefixed(path, label, depth)
                for other in wanted):
            depth += 1
        labels[path] = _safe(_prefixed(path, label, depth))
    return labels


def _prefixed(path: str, label: str, depth: int) -> str:
    parents = Path(path).resolve().parent.parts[::-1][:depth]
    return "-".join([*reversed(parents), label])


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)[-60:] or "x"
