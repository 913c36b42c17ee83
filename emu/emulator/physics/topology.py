"""Closed forms of the flat algorithms on a topology (docs/physics.md, "On a topology").

A topology changes two things for a flat algorithm: which links its bytes queue on, and how far
they travel. The forms below fold both into the one-switch formulas of ``emu.emulator.physics.forms``
as an *effective link*: the bandwidth of the busiest link divided among the flows that share it,
and the latency of the longest path (a spine hop each way between leaves).

- **INA** (every worker's stream crosses its NIC): a NIC shared by ``k`` workers carries ``k``
  streams, so each goes at ``B / k``; with several leaves the spine aggregates, a hop further
  each way.
- **Ring** (worker w sends to w + 1): a hop inside a node crosses the node's own ports; a hop
  between nodes crosses the sender's NIC up and the receiver's down. The ring runs at the pace of
  its slowest hop: ``B / k`` where ``k`` is the most inter-node hops that share one NIC (one per
  node when the ranks are packed, ``G`` when they are spread), or, when every hop stays inside a
  node, the intra-node link (its latency once per hop).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Hierarchy, Layout, Topology
from emu.emulator.physics.forms import _Segments, ina_detail_us


def ina_link(link: LinkSpec, topology: Topology, layout: Layout) -> LinkSpec:
    """The link a worker's stream sees: its NIC's bandwidth shared by the NIC's workers; where
    there are several leaves, the spine's hop each way, and its leaf's uplink shared by all the
    leaf's workers (their results come down once a leaf)."""
    k = float(layout.busiest_nic())
    spine = 0.0
    if layout.leaves > 1:  # flat: every stream of the leaf goes up; hierarchical: one partial sum
        spine = topology.spine_latency(link)
        streams = 1.0 if topology.algorithm == Hierarchy.HIERARCHICAL else float(np.bincount(layout.leaf).max())
        k = max(k, streams * link.bandwidth_bps / topology.uplink_bps(link))
    return replace(link, bandwidth_bps=link.bandwidth_bps / k, latency_us=link.latency_us + spine, schedule=())


def topology_ina_us(count: int, link: LinkSpec, topology: Topology, layout: Layout, elements: int = 64,
                    slots: int = 4096) -> float:
    """A flat INA all_reduce of ``count`` float elements on the topology (no loss)."""
    return ina_detail_us(count, ina_link(link, topology, layout), elements, slots)


def topology_ring_us(count: int, itemsize: int, link: LinkSpec, topology: Topology, layout: Layout,
                     steps: int | None = None, payload_scale: int = 1) -> float:
    """A flat ring all_reduce (``steps`` 2 (M - 1)) of ``count`` elements on the topology (no loss).

    ``physics.ring_pipelined_us`` with hops of their own kinds: each chunk travels ``K`` hops in a
    chain, so where every step waits for its first segment the time is the longest chain of ``K``
    consecutive hops, each its segment's serialization and its latency ``s_i + h_i``, plus the
    other ``g - 1`` segments at the slowest hop; where the steps pipeline, the slowest hop carries
    all ``K g`` segments. A hop between nodes serializes the segments of all ``k`` hops on its NIC
    (``B / k``); a hop inside a node crosses the node's ports (its latency once)."""
    m = layout.workers
    k_steps = 2 * (m - 1) if steps is None else steps
    if m < 2:
        return 0.0
    src = np.arange(m)
    dst = (src + 1) % m
    inter = layout.node[src] != layout.node[dst]
    out = np.bincount(layout.nic[src[inter]], minlength=int(layout.nic.max()) + 1)
    into = np.bincount(layout.nic[dst[inter]], minlength=int(layout.nic.max()) + 1)
    between = layout.leaf[src] != layout.leaf[dst]  # hops through the spine: their leaves' links
    leaf_out = np.bincount(layout.leaf[src[between]], minlength=layout.leaves)
    leaf_in = np.bincount(layout.leaf[dst[between]], minlength=layout.leaves)
    per_port = link.bandwidth_bps / topology.uplink_bps(link)  # a leaf link's share, in NIC links
    spine = topology.spine_latency(link)
    intra = LinkSpec(bandwidth_bps=topology.intra.bandwidth_bps, latency_us=topology.intra.latency_us / 2)
    s, h = np.empty(m), np.empty(m)
    g = 1
    for w in range(m):
        if inter[w]:
            k = float(max(out[layout.nic[w]], into[layout.nic[dst[w]]]))
            if between[w]:
                k = max(k, max(leaf_out[layout.leaf[w]], leaf_in[layout.leaf[dst[w]]]) * per_port)
            hop = replace(link, bandwidth_bps=link.bandwidth_bps / k, schedule=(),
                          latency_us=link.latency_us + (spine if between[w] else 0.0))
        else:
            hop = intra
        seg = _Segments(count, itemsize, m, hop, 0.0, payload_scale)
        g, s[w], h[w] = seg.g, seg.s, seg.h
    cost = np.tile(s + h, -(-k_steps // m) + 1)
    window = np.cumsum(cost)
    chains = window[k_steps - 1: k_steps - 1 + m] - np.r_[0.0, window[: m - 1]]
    slow = int(np.argmax(s))
    return float(max(chains.max() + (g - 1) * s[slow], k_steps * g * s[slow] + h[slow]))


def topology_hier_ring_us(count: int, itemsize: int, link: LinkSpec, topology: Topology, layout: Layout,
                          payload_scale: int = 1) -> float:
    """The hierarchical ring all_reduce (emu.emulator.algorithms.p2p_hier) on the topology: each node's other
    workers send the whole tensor to the leader, whose node port takes their ``(G-1) g`` segments
    in turn; the leaders' ring (``topology_ring_us`` over the leaders, in node order); the leader
    sends the result to the same ``G - 1`` over its port. The phases follow one another."""
    if layout.workers < 2:
        return 0.0
    nodes, leaders = np.unique(layout.node, return_index=True)
    g_max = int(np.bincount(layout.node).max())
    intra = LinkSpec(bandwidth_bps=topology.intra.bandwidth_bps, latency_us=topology.intra.latency_us / 2)
    seg = _Segments(count, itemsize, 1, intra, 0.0, payload_scale)
    inside = (g_max - 1) * seg.g * seg.s + seg.h if g_max > 1 else 0.0
    across = 0.0
    if len(nodes) > 1:
        sub = Layout(node=layout.node[leaders], nic=layout.nic[leaders], leaf=layout.leaf[leaders],
                     leaves=layout.leaves)
        across = topology_ring_us(count, itemsize, link, topology, sub, payload_scale=payload_scale)
    return 2 * inside + across


def topology_ps_us(count: int, itemsize: int, link: LinkSpec, topology: Topology, layout: Layout, shards: int,
                   payload_scale: int = 1) -> float:
    """A parameter-server all_reduce (p2p.PSClient, PSServer) on the topology: each shard has its own
    link (off the spine where there are several leaves); a worker's pushes cross its NIC, shared by
    the NIC's ``k`` workers, and with several leaves its leaf's uplink, shared by the leaf's ``L``
    workers: each worker pushes at ``B / k_e``, ``k_e = max(k, L B / U)``. Shard ``j`` receives
    chunk ``j`` from ``(P - 1) g k_e s`` for the last, and its downlink takes the ``M`` copies
    (``M g s``), or as long as one worker takes to push a chunk (``k_e g s``) where that is
    longer; then, as on one switch, the last segment's sum goes to the ``M`` workers in turn
    (``M s``), or down the busiest leaf's link to its ``L`` workers (``L B / U s``) where that is
    longer: ``(P-1) g k_e s + max(M, k_e) g s + max(M, L B / U) s + 2 h``, a spine hop each way
    further.
    With ``k_e = 1`` this is ``physics.ps_all_reduce_us``."""
    m = layout.workers
    k = float(layout.busiest_nic())
    spine = 0.0
    tail = float(m)
    if layout.leaves > 1:
        spine = topology.spine_latency(link)
        per_leaf = float(np.bincount(layout.leaf).max()) * link.bandwidth_bps / topology.uplink_bps(link)
        k = max(k, per_leaf)
        tail = max(tail, per_leaf)  # the last sums also cross each leaf's link down, L of them
    seg = _Segments(count, itemsize, shards, link, 0.0, payload_scale)
    g, s, h = seg.g, seg.s, seg.h
    return (shards - 1) * g * k * s + max(m, k) * g * s + tail * s + 2 * h + 2 * spine
