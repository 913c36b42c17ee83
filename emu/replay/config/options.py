"""The configuration of a replay, as one frozen dataclass validated when built."""

from __future__ import annotations

import enum
import functools
import math
import os
from dataclasses import dataclass, field

from emu.emulator import fabric as fabrics
from emu.emulator.compression.compressors import Compressor, parse_compress
from emu.emulator.fabric import Fabric
from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Hierarchy, Layout, Topology
from emu.emulator.mechanisms import Setting
from emu.emulator.protocol.wire import ELEMENTS_ALLOWED, MAX_WORKERS_SOFTWARE, MIN_WIRE_BYTES, agg_wire_bytes
from emu.errors import ConfigError
from emu.traces.mesh import Mesh

# What --payload-scale auto lets the workers really send per iteration. On the synchronized clock
# nothing is paced, so real bytes cost only their handling (about 10 ms per real MB here:
# BENCHMARKS.md) and results do not depend on R (ina exactly, ring and ps segments of 1 MB emulated
# at every R: emu.emulator.algorithms.p2p.SEGMENT_BYTES): 64 MB keeps a
# replay's real traffic near 0.6 s per iteration while every element still crosses and is checked.
REAL_BYTES_PER_ITERATION = 64e6
# The pool never needs to exceed the bandwidth-delay product for the stream to be link-bound,
# but every pass of it costs the emulator one round of messages: a pool of this size (half of
# SwitchML's 8192 slots) keeps the rounds few; its cost in emulated time is the exponent round,
# one pool of header-only packets per collective (docs/physics.md).
MIN_POOL = 4096
# Workers up to which a replay on the synchronized clock runs in one process by default; past it,
# host processes (each holds its part of the workers' state). Measured 2026-12-03 on the 2-core
# build machine (s, one process / two host processes): mlp at 8 workers on ina 0.73 / 1.19, ring at
# 1,024 4.3 / 11.2, ps at 1,024 9.0 / 10.6, the transformer on ina at 1,024 2.2 / 3.0 (BENCHMARKS.md).
# Since cohorts and the batched broadcast (2026-12-04: the transformer on ina, emulator run_s, one /
# two): 8,192 workers 1.5-1.6 / 1.8-2.0, 32,768 2.4 / 3.5-4.2, one process at 160 MB. Rings and
# parameter servers past 4,096 workers were not measured in both layouts (minutes each); at 1,024
# one process was the faster for them too, by more than for ina.
ONE_PROCESS_WORKERS = 32768
MAX_ITERS = 1_000_000


class Clock(str, enum.Enum):
    """How emulated time advances (docs/physics.md, "The clock").

    ``sync``: conservative synchronization; every endpoint handles an event only when no
    message with an earlier stamp can still reach it, so links see their packets in
    emulated-time order by construction and nothing sleeps. ``wall``: events fire when the
    wall clock reaches their emulated time times the dilation (for a fabric that cannot take
    part in the synchronization, such as a switch outside emu).
    """

    SYNC = "sync"
    WALL = "wall"


@dataclass(frozen=True)
class Straggler:
    """A compute slow-down for some workers (``--straggler``).

    ``workers`` lists them, or ``fraction`` picks that share of all workers with the seed;
    with neither, it applies to every worker. Their compute takes ``factor`` times as long,
    and each compute op is further multiplied by a lognormal draw of ``sigma``
    (mean-preserving: exp(sigma Z - sigma^2 / 2)), also drawn from the seed.
    """

    factor: float = 1.0
    workers: tuple[int, ...] = ()
    fraction: float = 0.0
    sigma: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """'3,7:1.5' (workers 3 and 7, 1.5x), 'random:0.05:2' (5% of workers, 2x),
        'lognormal:0.1' (every worker, per-op noise), 'random:0.1:1.5:0.2' (both)."""
        parts = text.strip().split(":")
        try:
            if parts[0] == "lognormal" and len(parts) == 2:
                return cls(sigma=float(parts[1]))
            if parts[0] == "random" and len(parts) in (3, 4):
                return cls(fraction=float(parts[1]), factor=float(parts[2]),
                           sigma=float(parts[3]) if len(parts) == 4 else 0.0)
            if len(parts) in (2, 3):
                return cls(workers=tuple(int(w) for w in parts[0].split(",")), factor=float(parts[1]),
                           sigma=float(parts[2]) if len(parts) == 3 else 0.0)
        except ValueError:
            pass
        raise ConfigError(f"--straggler {text!r}: give WORKERS:FACTOR (3,7:1.5), random:FRACTION:FACTOR "
                          "(random:0.05:2) or lognormal:SIGMA (lognormal:0.1)")

    @property
    def text(self) -> str:
        """The canonical form ``parse`` reads back (reports and pairing keys record this)."""
        tail = f":{self.sigma!r}" if self.sigma else ""
        if self.workers:
            return f"{','.join(str(w) for w in self.workers)}:{self.factor!r}{tail}"
        if self.fraction:
            return f"random:{self.fraction!r}:{self.factor!r}{tail}"
        if self.factor == 1.0:
            return f"lognormal:{self.sigma!r}"
        return f"random:1.0:{self.factor!r}{tail}"  # every worker

    def check(self, workers: int) -> None:
        if not (0 < self.factor <= 1e6 and 0 <= self.sigma <= 10 and 0 <= self.fraction <= 1):
            raise ConfigError("--straggler: the factor must be in (0, 1e6], sigma in [0, 10], the fraction in [0, 1]")
        bad = [w for w in self.workers if not 0 <= w < workers]
        if bad:
            raise ConfigError(f"--straggler names workers {bad}, not in 0..{workers - 1}")


MAX_SPARSITY_BLOCK = 1 << 20  # elements per sparsity block, as a trace may record (emu.traces.io)
DEFAULT_SPARSITY_BLOCK = 256  # OmniReduce's block


ADAPTIVE = "adaptive"  # --compress adaptive[:FLOOR] (emu.replay.plan.adaptive)
ADAPTIVE_FLOOR = 0.001


@dataclass(frozen=True)
class CompressOption:
    """``--compress NAME[:PARAM]`` or ``--compress adaptive[:FLOOR]``, and ``--compress-speed X``
    (docs/compression.md)."""

    text: str = "none"
    speed: float = 1.0  # the device compresses this many times faster than the build machine
    # adaptive only: per replayed iteration, per compressible bucket, the compressor chosen
    # (emu.replay.plan.adaptive plans it pass by pass; None before the first pass)
    plan: tuple[tuple[str, ...], ...] | None = None

    @property
    def adaptive(self) -> bool:
        return self.text.strip().lower().partition(":")[0] == ADAPTIVE

    @property
    def floor(self) -> float:
        """adaptive: the most aggressive top-k ratio the workers may choose."""
        _, _, value = self.text.strip().partition(":")
        try:
            floor = float(value) if value else ADAPTIVE_FLOOR
        except ValueError:
            raise ConfigError(f"--compress {self.text!r}: {value!r} is not a number") from None
        if not 0 < floor < 1:
            raise ConfigError(f"--compress {self.text!r}: the floor is the most aggressive top-k ratio the workers "
                              f"may choose, in (0, 1), e.g. adaptive:0.001")
        return floor

    @property
    def compressor(self) -> Compressor:
        """The compressor; adaptive: top-k at its floor, which stands for every choice where only
        which collectives compress matters (they are the same for each)."""
        if self.adaptive:
            return parse_compress(f"topk:{self.floor!r}")
        return parse_compress(self.text)

    @property
    def label(self) -> str:
        return f"{ADAPTIVE}:{self.floor:g}" if self.adaptive else self.compressor.label

    @property
    def active(self) -> bool:
        return self.adaptive or self.compressor.name != "none"

    def check(self) -> None:
        self.compressor.check()
        if not 1e-6 <= self.speed <= 1e6:
            raise ConfigError(f"--compress-speed must be in [1e-6, 1e6] (times the build machine's speed), "
                              f"got {self.speed:g}")


@dataclass(frozen=True)
class SparsityOption:
    """What the payload of float all_reduces follows (``--sparsity``, ``--sparsity-block``; docs/sparse.md).

    ``source``: ``trace`` (the default: what the trace recorded, dense where it recorded
    nothing), ``none`` (dense everywhere) or ``option`` (every float all_reduce has a fraction
    ``nonzero`` of non-zero blocks per worker and ``union`` on some worker; without a union, the one
    workers drawing their blocks independently would have: ``1 - (1 - nonzero)**M``). ``block_elements``: the block
    size; None: the trace's, else ``DEFAULT_SPARSITY_BLOCK``.
    """

    source: str = "trace"
    nonzero: float | None = None
    union: float | None = None
    block_elements: int | None = None

    @classmethod
    def parse(cls, text: str, block_elements: int | None = None) -> SparsityOption:
        """'trace', 'none', '0.1' (F) or '0.1:0.3' (F:U); fractions may be percentages ('10%')."""
        word = text.strip().lower()
        if word == "none" and block_elements is not None:
            raise ConfigError("--sparsity-block has nothing to cut with --sparsity none (dense): drop one of them")
        if word in ("trace", "none"):
            return cls(source=word, block_elements=block_elements)
        parts = word.split(":")
        if len(parts) in (1, 2):
            try:
                values = [float(p.strip().rstrip("%")) / (100 if p.strip().endswith("%") else 1) for p in parts]
            except ValueError:
                values = []
            if values and all(math.isfinite(v) for v in values):
                return cls(source="option", nonzero=values[0], union=values[1] if len(values) == 2 else None,
                           block_elements=block_elements)
        raise ConfigError(f"--sparsity {text!r}: give F, the fraction of non-zero blocks per worker (0.1), F:U "
                          "with U the fraction non-zero on some worker (0.1:0.3), none (dense) or trace (the default)")

    @property
    def text(self) -> str:
        """The canonical form ``parse`` reads back (without the block size)."""
        if self.source != "option":
            return self.source
        return f"{self.nonzero!r}" + ("" if self.union is None else f":{self.union!r}")

    @property
    def block(self) -> int:
        return self.block_elements or DEFAULT_SPARSITY_BLOCK

    def union_at(self, workers: int) -> float:
        """U, or the chance that one of M workers drawing their blocks independently holds a block."""
        assert self.nonzero is not None
        return self.union if self.union is not None else 1.0 - (1.0 - self.nonzero) ** workers

    def check(self) -> None:
        if self.source not in ("trace", "none", "option"):
            raise ConfigError(f"--sparsity {self.source!r} is not one of: trace, none, or a fraction F or F:U")
        if self.source == "option":
            f, u = self.nonzero, self.union
            if f is None or not 0 < f <= 1:
                raise ConfigError(f"--sparsity {self.text}: the fraction of non-zero blocks per worker must be in "
                                  "(0, 1] (give none for dense)")
            if u is not None and not f <= u <= 1:
                raise ConfigError(f"--sparsity {self.text}: the union U must be in [F, 1] = [{f:g}, 1]: a worker's "
                                  "non-zero blocks are among those non-zero on some worker")
        if self.block_elements is not None and not 1 <= self.block_elements <= MAX_SPARSITY_BLOCK:
            raise ConfigError(f"--sparsity-block must be in 1..{MAX_SPARSITY_BLOCK} elements (OmniReduce uses 256), "
                              f"got {self.block_elements}")


@dataclass(frozen=True)
class ReplayConfig:
    """What ``emu replay`` runs. Every field has a docstring; ``check`` says what is impossible."""

    workers: int = 8
    """Fake workers (M); the trace's rank programs are reused round-robin."""
    fabric: str = "ina"
    """A registered fabric's name (emu/emulator/fabric.py): ina (in-network aggregation switch), ring
    (ring all-reduce), ps (parameter server), bmv2 (the P4 program on BMv2) or a plugin's."""
    link: LinkSpec = field(default_factory=LinkSpec)
    """Every endpoint's uplink and downlink to the switch."""
    iters: int | None = None
    """Iterations to replay (the trace's are reused cyclically); default: the trace's count."""
    tdf: float | None = None
    """Time dilation: wall microseconds per emulated microsecond; None: chosen by calibration."""
    payload_scale: int | None = None
    """R: each packet really sent stands for R packets on the emulated wire; None: chosen so that
    the workers really send about REAL_BYTES_PER_ITERATION per iteration."""
    seed: int = 0
    """Seeds the payload, loss and jitter."""
    slots: int | None = None
    """INA pool (= window of packets in flight per worker) on the emulated wire; default: twice the
    bandwidth-delay product, at least MIN_POOL."""
    elements: int = 64
    """int32 elements per aggregation packet: 64 or 256."""
    processes: int | None = None
    """Worker host processes; 0: the switch and every host in the orchestrator's own process, the
    clock's windows as calls (``emu.replay.control.inprocess``, the synchronized clock only).
    Default: one process up to ``ONE_PROCESS_WORKERS`` workers on the synchronized clock (the
    switch and the hosts take turns window by window, so messages between them only add cost),
    else max(2, cores) host processes (the wall clock: 1 up to 16 workers)."""
    ps_shards: int | None = None
    """Parameter-server shards (each its own endpoint with its own link); default: workers."""
    rto_us: float | None = None
    """INA retransmission timeout (emulated); default 10 x the round trip of one packet, at least 100 us."""
    timeout_s: float = 1800.0
    """Bound on the whole replay (wall clock)."""
    stragglers: tuple[Straggler, ...] = ()
    """Compute slow-downs of chosen or random workers."""
    clock: Clock | None = None
    """sync or wall; default: sync, or wall where the fabric cannot be synchronized (bmv2) or a
    dilation was given."""
    design_file: str | None = None
    """The network design file (``--network``) the fabric, link and switch came from, if any; a label
    for the report (the values themselves are the fields above)."""
    design_name: str | None = None
    """The design's ``name`` (tables and plots), if it gave one."""
    sparsity: SparsityOption = field(default_factory=SparsityOption)
    """What the payload of float all_reduces follows: the trace's sparsity (default), none, or a
    what-if fraction (docs/sparse.md); every software fabric skips the zero blocks."""
    compress: CompressOption = field(default_factory=CompressOption)
    """The gradient compressor of float all_reduces and its cost model's speed (docs/compression.md)."""
    topology: Topology | None = None
    """Nodes, NICs, leaves and the placement of the workers (docs/topology.md); None: one switch with
    one port per worker."""
    packet_rate: float | None = None
    """The switch's aggregation pipeline: contributions it processes a second, all jobs together
    (the spine's, on a topology of several leaves); None: as fast as they come (docs/topology.md)."""
    mesh: Mesh | None = None
    """The layout a sharded or split trace replays at (``--mesh dp=64,tp=2``: the trace's mesh with
    new sizes for its data-parallel dimensions; docs/parallelism.md); its size is ``workers``. None:
    the trace's mesh grown to ``workers`` along its one data-parallel dimension."""
    moe_imbalance: float | None = None
    """A mixture of experts at a new expert-parallel size: the largest split over the mean each step
    (``--moe-imbalance 1.5``; 1: balanced routing). None: the trace's measured routing, resampled
    (``emu.replay.plan.experts``, docs/moe.md)."""

    def _check_topology(self, net: Fabric) -> None:
        """The topology's own check, named after where it came from, and the fabric's support for it."""
        if not isinstance(self.topology, Topology):
            raise ConfigError(f"topology must be a Topology, got {self.topology!r}")
        try:
            self.topology.check(self.workers)
        except ConfigError as exc:  # name where the topology came from
            where = (f"{self.design_file} (with any topology flag typed beside it)" if self.design_file
                     else "the topology flags")
            raise ConfigError(f"{where}: {exc}") from None
        if self.topology.algorithm == Hierarchy.HIERARCHICAL and not net.hierarchical:
            have = ", ".join(n for n in fabrics.names() if fabrics.get(n).hierarchical)
            raise ConfigError(f'{self.design_file + ": " if self.design_file else ""}topology.algorithm = '
                              f'"hierarchical" on the fabric {self.fabric}: it has no hierarchical variant '
                              f'({have} do; docs/topology.md); give "flat", or one of those fabrics')
        if not net.topologies:
            have = ", ".join(n for n in fabrics.names() if fabrics.get(n).topologies)
            raise ConfigError(f"--fabric {self.fabric}: a topology runs on the software fabrics ({have}); "
                              "an external switch is one switch with one port per worker")

    def check(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS_SOFTWARE:
            raise ConfigError(f"--workers must be in 1..{MAX_WORKERS_SOFTWARE}, got {self.workers}")
        net = self.network  # refuses an unknown name
        net.check(self.workers, self.elements)
        if self.iters is not None and not 1 <= self.iters <= MAX_ITERS:
            raise ConfigError(f"--iters must be in 1..{MAX_ITERS}, got {self.iters}")
        if self.tdf is not None and not 0 < self.tdf <= 1e6:
            raise ConfigError(f"--tdf must be in (0, 1e6] or auto, got {self.tdf}")
        if self.payload_scale is not None and not 1 <= self.payload_scale <= 1 << 32:
            raise ConfigError(f"--payload-scale must be in 1..2^32 or auto, got {self.payload_scale}")
        if not 0 <= self.seed < 1 << 63:
            raise ConfigError(f"--seed must be in 0..2^63-1, got {self.seed}")
        if self.elements not in ELEMENTS_ALLOWED:
            raise ConfigError(f"--elements must be one of {ELEMENTS_ALLOWED}, got {self.elements}")
        if self.slots is not None and not 1 <= self.slots <= 1 << 24:
            raise ConfigError(f"--slots must be in 1..16777216, got {self.slots}")
        if self.processes is not None and self.processes < 0:
            raise ConfigError(f"--processes must be 0 (one process) or more, got {self.processes}")
        if self.processes == 0 and self.resolved_clock != Clock.SYNC:
            raise ConfigError("--processes 0 runs the replay in one process on the synchronized clock: drop --clock "
                              "wall and --tdf, or give host processes")
        if self.ps_shards is not None and not 1 <= self.ps_shards <= MAX_WORKERS_SOFTWARE - self.workers:
            raise ConfigError("--ps-shards must be at least 1 (and workers + shards <= 65535)")
        if not 0 < self.timeout_s <= 30 * 86400:
            raise ConfigError(f"--timeout must be positive and at most 30 days, got {self.timeout_s}")
        if self.rto_us is not None and not 0 < self.rto_us <= 1e9:
            raise ConfigError(f"the retransmission timeout must be in (0, 1e9] us, got {self.rto_us}")
        for straggler in self.stragglers:
            straggler.check(self.workers)
        if not isinstance(self.sparsity, SparsityOption):
            raise ConfigError(f"sparsity must be a SparsityOption (SparsityOption.parse('0.1')), got {self.sparsity!r}")
        self.sparsity.check()
        if not isinstance(self.compress, CompressOption):
            raise ConfigError(f"compress must be a CompressOption (CompressOption('topk:0.01')), got {self.compress!r}")
        self.compress.check()
        if self.clock is not None and not isinstance(self.clock, Clock):
            raise ConfigError(f"--clock {self.clock!r} is not one of: sync, wall")
        if self.clock == Clock.SYNC and self.tdf is not None:
            raise ConfigError("--tdf paces the wall clock: give --clock wall with it, or drop --tdf")
        if self.clock == Clock.SYNC and not net.synchronizable:
            raise ConfigError(f"--fabric {self.fabric} cannot take part in the synchronized clock (it keeps no "
                              "emulated time): use --clock wall")
        if self.compress.adaptive and self.resolved_clock != Clock.SYNC:
            raise ConfigError("--compress adaptive replays in passes that must repeat each other exactly, which "
                              "only the synchronized clock does: drop --clock wall and --tdf, or use a fabric "
                              "that takes part in it")
        if self.topology is not None:
            self._check_topology(net)
        if self.mesh is not None:
            if not isinstance(self.mesh, Mesh):
                raise ConfigError(f"mesh must be a Mesh (emu.replay.plan.layout.parse_mesh('dp=64,tp=2')), got {self.mesh!r}")
            if self.mesh.size != self.workers:
                raise ConfigError(f"the mesh {self.mesh.text()} (--mesh, or a design's parallelism.mesh) is "
                                  f"{self.mesh.size} workers but --workers is {self.workers}: give one, or the same count")
        if self.packet_rate is not None:
            if not (math.isfinite(self.packet_rate) and 1.0 <= self.packet_rate <= 1e13):
                raise ConfigError(f"--packet-rate {self.packet_rate:g}: give 1 to 1e13 packets a second (a Tofino "
                                  "pipeline does about 1.2e9 of emu's 64-element packets)")
            if self.resolved_clock != Clock.SYNC:
                raise ConfigError("--packet-rate queues contributions at the switch in emulated-time order, which the "
                                  "synchronized clock gives: drop --clock wall and --tdf, and use ina")
        if self.resolved_clock == Clock.SYNC and self.timeout_rto_us < self.lookahead_us():
            raise ConfigError(f"the retransmission timeout ({self.timeout_rto_us:g} us) is shorter than one "
                              f"link's latency plus a packet ({self.lookahead_us():g} us): raise it")

    @property
    def resolved_clock(self) -> Clock:
        if self.clock is not None:
            return self.clock
        return Clock.WALL if not self.network.synchronizable or self.tdf is not None else Clock.SYNC

    @property
    def network(self) -> Fabric:
        """The fabric object ``fabric`` names (ConfigError for an unknown name)."""
        return fabrics.get(self.fabric)

    @property
    def switch_sums(self) -> bool:
        """Whether the fabric sums collectives in a switch (INA's stream)."""
        return self.network.aggregates

    @functools.cached_property
    def setting(self) -> Setting:
        """Where the collectives run, as the mechanisms see it (emu.emulator.mechanisms)."""
        return Setting(fabric=self.network, workers=self.workers, link=self.link, elements=self.elements,
                       slots=self.emulated_slots, real_slots=self.real_slots, rto_us=self.timeout_rto_us,
                       shards=self.shards, payload_scale=self.scale, seed=self.seed, topology=self.topology,
                       layout=self.layout(), packet_rate=self.packet_rate)

    def lookahead_us(self, inside_nodes: bool = True) -> float:
        """The least emulated time between an endpoint's event and its earliest effect on another
        endpoint: one link's latency plus the serialization of the smallest packet (every path
        crosses at least one link; the switch is instantaneous), at the link's highest bandwidth.
        ``inside_nodes``: whether traffic may cross a node's own links (a topology's, where the
        replay has point-to-point traffic and nodes of several workers)."""
        least = self._network_hop_us()
        topo = self.topology
        if topo is not None and topo.workers_per_node > 1 and inside_nodes and not self.node_passes:
            least = min(least, self.node_lookahead_us())
        return least

    def nic_hop_us(self) -> float:
        """The least emulated time from a NIC's (or an endpoint's link's) start of sending to the
        first packet at the far end: its latency plus the smallest packet's serialization at the
        link's highest bandwidth (jitter only adds)."""
        peak = self.link.peak_bps
        return self.link.latency_us + (0.0 if math.isinf(peak) else MIN_WIRE_BYTES * 8e6 / peak)

    def _network_hop_us(self) -> float:
        """The least hop between a node and the switch: a link's, or a leaf's up to the spine."""
        least = self.nic_hop_us()
        topo = self.topology
        layout = self.layout()
        if topo is not None and layout is not None and layout.leaves > 1:  # a leaf's hop to the spine
            up = topo.spine_link(self.link).peak_bps  # scheduled as the NICs are
            least = min(least, topo.spine_latency(self.link) + (0.0 if math.isinf(up) else MIN_WIRE_BYTES * 8e6 / up))
        return least

    def node_lookahead_us(self) -> float:
        """The least emulated time a hop inside a node takes: its links' latency plus the smallest
        packet's serialization (0 without a topology)."""
        if self.topology is None:
            return 0.0
        intra = self.topology.intra
        return intra.latency_us + (0.0 if math.isinf(intra.bandwidth_bps) else MIN_WIRE_BYTES * 8e6 / intra.bandwidth_bps)

    @property
    def node_passes(self) -> bool:
        """Whether each host runs the traffic inside its nodes in passes of its own, a hop inside a
        node apart (``emu.replay.host.runtime.Host.advance``), so that the node's links never bound
        the clock's lookahead: a topology of several workers a node whose hops inside take time."""
        topo = self.topology
        return (topo is not None and topo.workers_per_node > 1 and self.node_lookahead_us() > 0
                and self.resolved_clock == Clock.SYNC and self._network_hop_us() > 0)

    @property
    def batched_p2p(self) -> bool:
        """Whether hosts hand point-to-point segments over a window's at once
        (``emu.replay.host.p2p_batched``): the synchronized clock and every endpoint on a link of
        its own (no topology). Where the switch sums, the segments go between the stream's rows
        in runs, in time order (``emu.replay.host.runtime.Host``)."""
        return self.resolved_clock == Clock.SYNC and self.topology is None

    def queues_bound_windows(self, inside_nodes: bool = True) -> bool:
        """Whether the synchronized clock's windows may reach past the hosts' uplink queues
        (``emu.replay.switch.daemon.Windows``): only where nothing a host does in a window can fall
        due at that same host inside the window, after its pass went by: no retransmission timers
        (real rows lost: loss without payload scale), no traffic inside a node (``inside_nodes``
        on a topology) and a lookahead above 0. Leaves' links to the spine may be there: what
        they queue counts (``emu.replay.host.runtime.Host.departures``)."""
        inside = (self.topology is not None and self.topology.workers_per_node > 1 and inside_nodes
                  and not self.node_passes)
        return (self.lookahead_us(inside_nodes) > 0 and not (self.link.loss > 0 and self.scale == 1)
                and not inside)

    def layout(self) -> Layout | None:
        """Where the workers sit on the topology (None without one)."""
        return None if self.topology is None else _layout(self.topology, self.workers, self.seed)

    def spine_rtt_us(self) -> float:
        """What the spine adds to an aggregation packet's round trip (several leaves: the spine
        aggregates, a hop up and one down)."""
        layout = self.layout()
        if layout is None or layout.leaves == 1:
            return 0.0
        assert self.topology is not None
        return 2 * self.topology.spine_latency(self.link)

    @property
    def one_process(self) -> bool:
        """Whether the switch and every host run in the orchestrator's process (``processes``; by
        default up to ``ONE_PROCESS_WORKERS`` workers on the synchronized clock)."""
        if self.processes is None:
            return self.workers <= ONE_PROCESS_WORKERS and self.resolved_clock == Clock.SYNC
        return self.processes == 0

    @property
    def host_processes(self) -> int:
        if self.processes:
            return min(self.workers, self.processes)
        if self.one_process:
            return 1
        return 1 if self.workers <= 16 else min(self.workers, max(2, os.cpu_count() or 2))

    @property
    def shard_hosts(self) -> int:
        """A job's parameter-server shards take two hosts beside the workers' (their sums side by
        side, in two processes) beside three or more workers' hosts, else one: in one process
        nothing runs side by side, and beside one or two workers' hosts (two cores' worth) the
        processes take turns, so a second shard host only costs each clock window its fixed cost
        (docs/design-notes.md, "In one process a job's shards share one host"). From the options
        alone, never this machine's cores: every machine of a run plans the same layout."""
        return 2 if not self.one_process and self.host_processes >= 3 else 1

    @property
    def shards(self) -> int:
        return self.ps_shards or self.workers

    def rtt_us(self) -> float:
        """One aggregation packet's round trip: the worker's uplink, then its downlink."""
        ser = float(self.link.serialization_us(agg_wire_bytes(self.elements)))
        return 2 * (ser + self.link.latency_us) + self.spine_rtt_us()

    @property
    def emulated_slots(self) -> int:
        if self.slots is not None:
            return self.slots
        # the pool covers the largest bandwidth-delay product (a schedule's fastest step)
        peak = self.link.peak_bps
        ser = 0.0 if math.isinf(peak) else agg_wire_bytes(self.elements) * 8e6 / peak
        if ser == 0:
            return MIN_POOL
        bdp_packets = (2 * (ser + self.link.latency_us) + self.spine_rtt_us()) / ser
        return int(min(65535, max(MIN_POOL, 2 ** math.ceil(math.log2(2 * bdp_packets)))))

    @property
    def scale(self) -> int:
        """The payload scale in force (1 until calibration chose one)."""
        return self.payload_scale or 1

    @property
    def dilation(self) -> float:
        return self.tdf or 1.0

    @property
    def real_slots(self) -> int:
        return max(1, -(-self.emulated_slots // self.scale))

    @property
    def timeout_rto_us(self) -> float:
        return self.rto_us if self.rto_us is not None else max(100.0, 10 * self.rtt_us())


@functools.lru_cache(maxsize=8)
def _layout(topology: Topology, workers: int, seed: int) -> Layout:
    return topology.layout(workers, seed)
