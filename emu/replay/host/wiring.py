"""How a host's endpoints reach the network: the links their traffic queues on (docs/topology.md).

Without a topology every endpoint has its own link to the one switch, each direction a FIFO
(``emu.emulator.links.array.LinkArray``). On a topology (``emu.emulator.links.topology``) a host holds whole
nodes: its workers share their node's NICs (the links to the leaf), traffic between two workers
of a node crosses their node-internal ports instead (up with the intra-node latency, down without
it, so that a hop costs one latency), and with several leaves the host holds whole leaves, whose
links to the spine (``emu.replay.host.leaves``) carry what crosses between leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from emu.emulator.links.array import LinkArray
from emu.emulator.links.topology import Layout
from emu.replay.config.options import ReplayConfig
from emu.replay.host.leaves import LeafStage

NIC_BASE = 1 << 20  # NIC links' ids for loss and jitter streams, apart from the endpoints'


@dataclass
class Wiring:
    up: LinkArray  # the NIC (or endpoint) links, toward the switch
    down: LinkArray
    link: dict[int, int]  # endpoint -> its link's index in up and down
    local_link: np.ndarray  # local worker index -> its link's index
    intra_up: LinkArray | None = None  # per local worker: its port into the node, and out of it
    intra_down: LinkArray | None = None
    layout: Layout | None = None
    leaves: LeafStage | None = None  # the host's leaves' links to the spine (several leaves)
    _nic_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the NICs' global numbers
    _nics: int = 1  # NICs a node
    _workers: int = 0  # M (a shard's endpoint is M + its index)
    _node_of: list[int] | None = None  # per worker, its node (``same_node``: asked twice a hand-off)

    @classmethod
    def build(cls, cfg: ReplayConfig, endpoints: np.ndarray, workers: bool, leaves: LeafStage | None = None) -> Wiring:
        """The links of a host holding ``endpoints`` (workers, or parameter-server shards); ``leaves``:
        the leaves' links, where jobs sharing the fabric share them (``emu.replay.host.jobs``)."""
        topo = cfg.topology
        if topo is None or not workers:
            index = {int(e): i for i, e in enumerate(endpoints)}
            return cls(up=LinkArray(cfg.link, endpoints, cfg.seed, 0, cfg.timeout_rto_us),
                       down=LinkArray(cfg.link, endpoints, cfg.seed, 1, cfg.timeout_rto_us),
                       link=index, local_link=np.arange(len(endpoints), dtype=np.int64),
                       layout=cfg.layout() if topo is not None else None, _workers=cfg.workers)
        layout = cfg.layout()
        assert layout is not None
        nics = layout.nic[endpoints]
        uniq, local_link = np.unique(nics, return_inverse=True)
        ids = uniq + NIC_BASE
        intra_down = replace(topo.intra, latency_us=0.0)
        if leaves is None and layout.leaves > 1:
            held = np.unique(layout.leaf[endpoints])
            leaves = LeafStage.of(held, cfg, layout)
        return cls(up=LinkArray(cfg.link, ids, cfg.seed, 0, cfg.timeout_rto_us),
                   down=LinkArray(cfg.link, ids, cfg.seed, 1, cfg.timeout_rto_us),
                   link={int(e): int(i) for e, i in zip(endpoints, local_link, strict=True)},
                   local_link=local_link.astype(np.int64),
                   intra_up=LinkArray(topo.intra, endpoints, cfg.seed, 0, cfg.timeout_rto_us),
                   intra_down=LinkArray(intra_down, endpoints, cfg.seed, 1, cfg.timeout_rto_us),
                   layout=layout, leaves=leaves, _nic_ids=uniq, _nics=topo.nics_per_node, _workers=cfg.workers)

    def same_node(self, src: int, dst: int) -> bool:
        """Whether a segment from ``src`` to ``dst`` stays inside a node (both are workers)."""
        node = self._node_of
        if node is None:
            if self.layout is None:
                return False
            node = self._node_of = self.layout.node.tolist()
        return src < len(node) and dst < len(node) and node[src] == node[dst]

    def crosses(self, src: int, dst: int) -> bool:
        """Whether a segment between two endpoints crosses the spine: between leaves, or to or from
        a parameter-server shard (which hangs off the spine once there are several leaves)."""
        lay = self.layout
        if lay is None or lay.leaves == 1:
            return False
        m = lay.workers
        return src >= m or dst >= m or bool(lay.leaf[src] != lay.leaf[dst])

    def usage(self, endpoints: np.ndarray, workers: bool, leaves: bool = True) -> dict[str, list]:
        """Per kind of link: [links, busy ns summed (an integer: sums of them do not depend on how
        links are spread over hosts), busy us of the busiest, its name, its number (which breaks
        ties the same whichever host holds the link)] (the report's utilisation); ``leaves``: with
        the leaves' links (jobs sharing them count them once)."""
        Named = Callable[[int], str]
        kinds: list[tuple[str, np.ndarray, np.ndarray, Named]] = []
        if not workers:
            shard: Named = lambda e: f"shard {e - self._workers} (endpoint {e})"  # noqa: E731
            kinds += [("shard uplink", self.up.busy_us, endpoints, shard),
                      ("shard downlink", self.down.busy_us, endpoints, shard)]
        elif self.layout is None:
            kinds += [("uplink", self.up.busy_us, endpoints, "worker {}".format),
                      ("downlink", self.down.busy_us, endpoints, "worker {}".format)]
        else:
            nic: Named = lambda n: f"NIC {n} (node {n // self._nics})"  # noqa: E731
            port = "worker {}'s node port".format
            kinds += [("NIC up", self.up.busy_us, self._nic_ids, nic), ("NIC down", self.down.busy_us, self._nic_ids, nic)]
            if self.intra_up is not None and self.intra_down is not None:
                kinds += [("node port up", self.intra_up.busy_us, endpoints, port),
                          ("node port down", self.intra_down.busy_us, endpoints, port)]

        out = {}
        for kind, busy, ids, name in kinds:
            if len(busy):
                top = int(np.argmax(busy))  # the first of equals: ids ascend
                number = int(ids[top])
                out[kind] = [len(busy), int(np.rint(busy * 1e3).astype(np.int64).sum()), float(busy[top]),
                             name(number), number]
        if self.leaves is not None and leaves:  # a worker host's on a topology of several leaves
            out.update(self.leaves.usage())
        return out

    def all_links(self) -> list[LinkArray]:
        links = [a for a in (self.up, self.down, self.intra_up, self.intra_down) if a is not None]
        return links
