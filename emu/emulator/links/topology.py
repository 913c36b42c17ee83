"""The network's shape: nodes of several workers, their NICs, leaf switches and a spine
(docs/topology.md).

A ``Topology`` says what the cluster is made of; ``Topology.layout(M)`` places M workers on it:

- **Nodes** of ``workers_per_node`` workers (GPUs), joined inside the node by their own links of
  ``intra`` bandwidth and latency (NVLink-class): each worker has a port into the node's fabric,
  one direction each way, and traffic between two workers of a node never leaves it.
- **NICs**: ``nics_per_node`` per node, each a link of the job's ``[link]`` kind (bandwidth,
  latency, loss, jitter) to a leaf switch. A node's workers share its NICs, worker ``i`` of the
  node taking NIC ``i mod nics_per_node``: everything a worker sends to or receives from another
  node crosses its NIC, queued behind what the NIC's other workers send.
- **Leaves** of ``leaf_ports`` NIC ports each, filled node by node (a node's NICs share a leaf).
  With more than one leaf a non-blocking spine joins them: each leaf has a link to it each way of
  ``leaf_ports x B / oversubscription`` and ``spine_latency_us``. Traffic between leaves, and
  every contribution of an in-network aggregation (which the spine aggregates once there are
  several leaves), queues on its leaf's link up and the far leaf's link down.
- **Placement**: which node each worker (rank) sits on: ``packed`` (ranks 0..G-1 on node 0, the
  next G on node 1, ...), ``spread`` (rank r on node r mod N, as many nodes as packed needs),
  ``random`` (a seeded shuffle of packed), or an explicit list of node indices, one per worker.

``algorithm = "hierarchical"`` makes INA's leaves aggregate before the spine, and the ring reduce
inside nodes first (``emu.emulator.algorithms.p2p_hier``); the replay's configuration refuses it on a
parameter server. Jitter is on every link, NICs and leaves' links to the spine, both ways;
loss on the NIC links alone.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import numpy as np

from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError

DEFAULT_WORKERS_PER_NODE = 8
DEFAULT_LEAF_PORTS = 32  # the P4 program's port limit (docs/p4.md)
DEFAULT_INTRA = LinkSpec(bandwidth_bps=900e9 * 8, latency_us=1.0)  # NVLink-class: 900 GB/s a GPU, 1 us
MAX_NODES = 1 << 16


class Placement(enum.Enum):
    PACKED = "packed"
    SPREAD = "spread"
    RANDOM = "random"
    LIST = "list"


class Hierarchy(enum.Enum):
    """Which algorithm a fabric runs where it has both: flat (today's) or hierarchical."""

    FLAT = "flat"
    HIERARCHICAL = "hierarchical"


class Allocation(str, enum.Enum):
    """How the fabric's nodes are handed out to jobs sharing it (emu.replay.jobs)."""

    CONTIGUOUS = "contiguous"  # job 0's nodes first, then job 1's: jobs meet only at the spine
    INTERLEAVED = "interleaved"  # node by node in turn: jobs share every leaf they span


class SlotPolicy(str, enum.Enum):
    """How jobs sharing a switch share its slot pool."""

    STATIC = "static"  # each of J jobs gets slots // J, as SwitchML partitions its pool


@dataclass(frozen=True)
class Topology:
    workers_per_node: int = DEFAULT_WORKERS_PER_NODE
    nics_per_node: int = 1
    intra: LinkSpec = field(default_factory=lambda: DEFAULT_INTRA)
    leaf_ports: int = DEFAULT_LEAF_PORTS
    oversubscription: float = 1.0
    """A leaf's NIC ports' capacity over its uplinks' (1: non-blocking)."""
    placement: Placement = Placement.PACKED
    nodes: tuple[int, ...] = ()
    """The node of each worker, for ``Placement.LIST``."""
    algorithm: Hierarchy = Hierarchy.FLAT
    spine_latency_us: float | None = None
    """One leaf-spine hop; None: the NIC link's latency."""
    fabric_nodes: int | None = None
    """The nodes of the whole fabric where it holds more than these workers use (jobs sharing it,
    docs/topology.md): they decide how many leaves there are; None: the nodes the workers use."""

    def check(self, workers: int) -> None:
        """Refuse, naming the key and the fix, what cannot be built or is not modelled yet."""
        g, n = self.workers_per_node, self.nics_per_node
        if not 1 <= g <= 1024:
            raise ConfigError(f"topology.workers_per_node = {g}: give 1 to 1024 workers (GPUs) per node")
        if not 1 <= n <= g:
            raise ConfigError(f"topology.nics_per_node = {n}: give 1 to workers_per_node ({g}) NICs per node")
        if not n <= self.leaf_ports <= 4096:
            raise ConfigError(f"topology.leaf_ports = {self.leaf_ports}: give at least nics_per_node ({n}) and at "
                              "most 4096 ports per leaf (a node's NICs share a leaf)")
        if not (math.isfinite(self.oversubscription) and self.oversubscription >= 1):
            raise ConfigError(f"topology.oversubscription = {self.oversubscription:g}: give 1 (non-blocking) or "
                              "more (2 for 2:1)")
        if self.intra.loss or self.intra.jitter_us or self.intra.schedule:
            raise ConfigError("the intra-node link takes a bandwidth and a latency only")
        if self.spine_latency_us is not None and not 0 <= self.spine_latency_us <= 86400e6:
            raise ConfigError(f"topology.spine_latency = {self.spine_latency_us:g} us: give 0 to a day")
        if self.placement == Placement.LIST:
            if len(self.nodes) != workers:
                raise ConfigError(f"topology.placement lists {len(self.nodes)} nodes for {workers} workers: give "
                                  "one node index per worker")
            if min(self.nodes, default=0) < 0 or max(self.nodes, default=0) >= MAX_NODES:
                raise ConfigError(f"topology.placement: node indices go from 0 to {MAX_NODES - 1}")
            full = np.bincount(np.asarray(self.nodes, np.int64))
            if full.max(initial=0) > g:
                node = int(full.argmax())
                raise ConfigError(f"topology.placement puts {int(full.max())} workers on node {node}, which has "
                                  f"{g} (workers_per_node): move some, or raise workers_per_node")
        elif -(-workers // g) > MAX_NODES:
            raise ConfigError(f"{workers} workers at {g} a node are more than {MAX_NODES} nodes")
        if self.fabric_nodes is not None and not (
                1 <= self.fabric_nodes <= MAX_NODES and (self.placement != Placement.LIST
                                                         or max(self.nodes, default=0) < self.fabric_nodes)):
            raise ConfigError(f"topology.fabric_nodes = {self.fabric_nodes}: give at least the nodes the "
                              f"placement uses, at most {MAX_NODES}")

    def layout(self, workers: int, seed: int = 0) -> Layout:
        """Where each of ``workers`` workers sits (``check`` first)."""
        g, n = self.workers_per_node, self.nics_per_node
        w = np.arange(workers, dtype=np.int64)
        nodes = -(-workers // g)
        if self.placement == Placement.PACKED:
            node = w // g
        elif self.placement == Placement.SPREAD:
            node = w % nodes
        elif self.placement == Placement.RANDOM:
            slots = np.random.default_rng(seed + 0x70F0).permutation(nodes * g)[:workers]
            node = slots // g
        else:
            node = np.asarray(self.nodes, np.int64)
        # a worker's place in its node (by rank), which picks its NIC
        order = np.lexsort((w, node))
        place = np.empty(workers, np.int64)
        starts = np.r_[0, np.flatnonzero(np.diff(node[order])) + 1]
        counts = np.diff(np.r_[starts, workers])
        place[order] = np.arange(workers) - np.repeat(starts, counts)
        nic = node * n + place % n
        per_leaf = max(1, self.leaf_ports // n)  # nodes a leaf holds
        leaf = node // per_leaf
        leaves = int(leaf.max(initial=0)) + 1
        if self.fabric_nodes is not None:
            leaves = max(leaves, -(-self.fabric_nodes // per_leaf))
        return Layout(node=node, nic=nic, leaf=leaf, leaves=leaves)

    def warning(self, workers: int) -> str | None:
        """What the design sets that cannot act at this size, or None: an oversubscription where every
        NIC sits in one leaf (no traffic crosses the spine it slows), or a placement that leaves nodes
        empty below its last (they count in the leaves, their NICs idle: a typo as often as a wish)."""
        said = []
        empty = sorted(set(range(max(self.nodes, default=0) + 1)) - set(self.nodes))
        if self.placement == Placement.LIST and empty:
            shown = ", ".join(map(str, empty[:5])) + (" ..." if len(empty) > 5 else "")
            said.append(f"topology.placement leaves node{'s' if len(empty) > 1 else ''} {shown} empty below node "
                        f"{max(self.nodes)}: they count in the leaves, their NICs idle; number the nodes 0 to "
                        f"{len(set(self.nodes)) - 1} for none empty (docs/topology.md)")
        lay = self.layout(workers)
        if self.oversubscription > 1 and lay.leaves == 1:
            ports = len(set(lay.nic.tolist()))  # the NICs the workers use
            fix = (f"give --leaf-ports {max(1, ports // 2)} to split them over two leaves" if ports > 1 else
                   "give more workers or NICs (one NIC is one leaf)")
            said.append(f"oversubscription {self.oversubscription:g}:1 slows the links from leaves to the spine, but "
                        f"the {workers} workers' {ports} NIC{'s' if ports != 1 else ''} all sit in one leaf of "
                        f"{self.leaf_ports} ports: it changes nothing; {fix} (docs/topology.md)")
        return "; and ".join(said) or None

    def to_dict(self, link: LinkSpec) -> dict:
        """As the report records it (docs/design.md, ``config.design.topology``)."""
        return {"workers_per_node": self.workers_per_node, "nics_per_node": self.nics_per_node,
                "intra_node_bandwidth_bps": self.intra.bandwidth_bps, "intra_node_latency_us": self.intra.latency_us,
                "leaf_ports": self.leaf_ports, "oversubscription": self.oversubscription,
                "placement": list(self.nodes) if self.placement == Placement.LIST else self.placement.value,
                "algorithm": self.algorithm.value, "spine_latency_us": self.spine_latency(link)}

    def uplink_bps(self, link: LinkSpec) -> float:
        """A leaf's links to the spine, each way: its NIC ports' capacity over the oversubscription."""
        return self.leaf_ports * link.bandwidth_bps / self.oversubscription

    def spine_link(self, link: LinkSpec) -> LinkSpec:
        """A leaf's link to the spine: ``uplink_bps``, the NICs' bandwidth schedule scaled as their
        rate is (a network whose bandwidth changes changes it on every hop), and their jitter, each
        way. Loss is the NICs' alone: the fabric's core is lossless, as a datacenter's spine with
        priority flow control is."""
        scale = self.leaf_ports / self.oversubscription
        return LinkSpec(bandwidth_bps=self.uplink_bps(link), latency_us=self.spine_latency(link),
                        jitter_us=link.jitter_us, schedule=tuple((t, b * scale) for t, b in link.schedule))

    def spine_latency(self, link: LinkSpec) -> float:
        return link.latency_us if self.spine_latency_us is None else self.spine_latency_us


@dataclass(frozen=True)
class Layout:
    """Per worker: its node, its NIC (a global number, ``node * nics_per_node + i``) and its leaf."""

    node: np.ndarray
    nic: np.ndarray
    leaf: np.ndarray
    leaves: int

    @property
    def workers(self) -> int:
        return len(self.node)

    def busiest_nic(self) -> int:
        """The most workers that share one NIC."""
        return int(np.bincount(self.nic).max(initial=0))
