"""NCCL's double binary tree all_reduce, as ``--fabric tree`` (docs/physics.md, "Double binary tree").

NCCL picks the tree at scale for small and medium messages: two complementary binary trees
(``btree``: the first, rooted at 0; the second its mirror for an even count, shifted by one for an
odd one, so that a rank is interior in at most one of them, rank 0 excepted for an odd count)
each carry half of the tensor, reduced
up to the root and broadcast back down, segment by segment: about ``2 log2 N`` dependent steps
where a ring takes ``2 (N - 1)``. On a topology the trees join nodes, as NCCL builds them: inside a
node its workers form a chain (in rank order, the lowest at its head), and the trees span the
nodes' heads (``plan``).

Every other collective runs as on ``ring`` (the fabric's mechanisms: a sparse ring where a sparse
all_reduce is cheaper that way, the tree for dense all_reduces of any dtype, rings for
reduce_scatters and all_gathers, and the common point-to-point algorithms). This module holds the
whole mechanism: its trees, the worker's algorithm, its closed form, and the fabric.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass

import numpy as np

from emu.emulator import fabric as fabrics
from emu.emulator import mechanisms as mech
from emu.emulator.algorithms.p2p import Algorithm, Chunks, Seg, segment_elements
from emu.emulator.links.spec import LinkSpec
from emu.emulator.mechanisms import Sent, Setting, Start
from emu.emulator.mechanisms.p2p import PointToPoint
from emu.emulator.physics.forms import expected_rounds
from emu.emulator.protocol.wire import FRAME_OVERHEAD, P2P_HEADER, p2p_packets
from emu.traces.model import Coll, CollKind

# Emulated payload bytes a segment carries (NCCL's Simple protocol moves a 4 MiB buffer in 8
# steps): the pipeline's grain is the same at every payload scale, so the tree's time is too.
SEGMENT_BYTES = 512 * 1024
DOWN = 1 << 29  # segment numbers of the broadcast down (the reduction up has the layout's own)


def btree(n: int, rank: int) -> tuple[int, tuple[int, ...]]:
    """NCCL's binary tree over ``n`` ranks rooted at 0 (``ncclGetBtree``): a rank's parent (-1 for
    the root) and children. Leaves and interior ranks alternate: ``xx1`` is a leaf, ``xx10...0`` has
    children ``xx01...`` and ``xx11...`` where they exist."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ((bit >> 1,) if n > 1 else ())
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    if low == 0:
        return up, ()
    left, right = rank - low, rank + low
    while right >= n:  # the right child within bounds, or none
        right = rank + low if low else -1
        low >>= 1
    return up, (left, right) if right >= 0 else (left,)


def dtree(n: int, rank: int) -> tuple[tuple[int, tuple[int, ...]], tuple[int, tuple[int, ...]]]:
    """Both trees of NCCL's double binary tree (``ncclGetDtree``): the second is the first mirrored
    (``n - 1 - r``) for an even ``n``, shifted by one rank for an odd one."""
    first = btree(n, rank)
    if n % 2:
        up, kids = btree(n, (rank - 1) % n)
        second = (-1 if up < 0 else (up + 1) % n, tuple((k + 1) % n for k in kids))
    else:
        up, kids = btree(n, n - 1 - rank)
        second = (-1 if up < 0 else n - 1 - up, tuple(n - 1 - k for k in kids))
    return first, second


@dataclass(frozen=True)
class Trees:
    """Each member's parent (-1: the root) and children in the two trees, in member numbers."""

    parent: tuple[tuple[int, ...], tuple[int, ...]]
    children: tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


@functools.lru_cache(maxsize=64)
def plan(nodes: tuple[int, ...]) -> Trees:
    """The trees of members whose nodes are ``nodes`` (one per member, in member order; every
    member a node of its own without a topology): a chain inside each node, head first (its
    lowest member), and the double binary tree across the nodes' heads, nodes in order of their
    first member. Both trees use the same chains, as NCCL's do."""
    n = len(nodes)
    heads: dict[int, int] = {}
    chain_parent = [-1] * n
    chain_child: list[list[int]] = [[] for _ in range(n)]
    last: dict[int, int] = {}
    for m, node in enumerate(nodes):
        if node in last:
            chain_parent[m] = last[node]
            chain_child[last[node]].append(m)
        else:
            heads[node] = m
        last[node] = m
    order = list(heads.values())  # heads in order of their first member
    parents, children = [], []
    for t in range(2):
        par = list(chain_parent)
        kids = [list(c) for c in chain_child]
        for i, head in enumerate(order):
            up, down = dtree(len(order), i)[t]
            par[head] = order[up] if up >= 0 else -1
            kids[head] = [order[d] for d in down] + kids[head]
        parents.append(tuple(par))
        children.append(tuple(tuple(k) for k in kids))
    return Trees(parent=(parents[0], parents[1]), children=(children[0], children[1]))


class DoubleBinaryTree(Algorithm):
    """One member's side: chunk 0 of the tensor goes up and down tree 0, chunk 1 tree 1. A segment
    goes up once its children's partial sums are in (a leaf's at once), the root's sum is the
    result, and each member passes the result down to its children as it arrives."""

    def __init__(self, *args, trees: Trees, **kw) -> None:
        super().__init__(*args, **kw)
        self.trees = trees
        self.acc: dict[int, np.ndarray] = {}
        self.heard: dict[int, int] = {}
        self.need = sum(len(self.layout.segments(j)) for j in range(2))
        self.got = 0

    def _up(self, chunk: int) -> int:
        return self.trees.parent[chunk][self.rank]

    def _kids(self, chunk: int) -> tuple[int, ...]:
        return self.trees.children[chunk][self.rank]

    def start(self, t: float) -> list[Seg]:
        if self.size == 1:
            self.finished, self.end_us = True, t
            return []
        out: list[Seg] = []
        for chunk in range(2):
            if not self._kids(chunk):  # a leaf: its own values go up at once
                out += self._sends(self._up(chunk), chunk, t, lambda lo, hi: self.own(lo, hi))
        return out

    def _result(self, chunk: int, segment: int, lo: int, hi: int, total: np.ndarray, t: float) -> list[Seg]:
        self.check_sum(total, lo, hi)
        self.got += 1
        self._done(t)
        self.finished = self.got == self.need
        size = self.layout.seg_emu_bytes(chunk)
        return [Seg(k, self.seq, segment | DOWN, total, size, t) for k in self._kids(chunk)]

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        base = segment & ~DOWN
        chunk, lo, hi = self._map[base]
        if segment & DOWN:
            return self._result(chunk, base, lo, hi, data, t)
        acc = self.acc.get(base)
        acc = self.own(lo, hi).astype(np.float64) + data if acc is None else acc + data
        heard = self.heard.get(base, 0) + 1
        if heard < len(self._kids(chunk)):
            self.acc[base], self.heard[base] = acc, heard
            return []
        self.acc.pop(base, None)
        self.heard.pop(base, None)
        up = self._up(chunk)
        if up < 0:  # the root: the sum is the result
            return self._result(chunk, base, lo, hi, acc, t)
        self._done(t)
        return [Seg(up, self.seq, base, acc, self.layout.seg_emu_bytes(chunk), t)]


class DoubleBinaryTreeMechanism(PointToPoint):
    """Dense all_reduces of any dtype on the double binary tree (module docstring)."""

    name = "double binary tree"
    kinds = frozenset({CollKind.ALL_REDUCE})

    def algorithm(self, a: Start) -> Algorithm:
        layout = Chunks.shared(a.real, 2, a.emu_bytes, segment_elements(a.real, a.emu_bytes, SEGMENT_BYTES))
        return DoubleBinaryTree(**a.common(), layout=layout, trees=plan(a.member_nodes()))

    def alone_us(self, op: Coll, s: Setting) -> float:
        return tree_all_reduce_us(op.count, op.dtype.itemsize, s.group_size(op), s.link, s.rto_us, s.payload_scale)

    def sent(self, op: Coll, s: Setting, seq: int, sparsity) -> Sent:
        # every member but the root sends its chunk up each tree and gets it back: 2 (M-1) halves a tree
        per_element = op.dtype.itemsize * 2 * (s.workers - 1)
        return Sent(-(-op.count // s.payload_scale) * per_element, op.count * per_element, False)


@functools.lru_cache(maxsize=256)
def tree_all_reduce_us(count: int, itemsize: int, workers: int, link: LinkSpec, rto_us: float = 0.0,
                       payload_scale: int = 1) -> float:
    """The double binary tree all_reduce alone on one switch (docs/physics.md, "Double binary tree"):
    from its start on every member to the last member's completion.

    Both trees' segments share every member's uplink and downlink, and which one a link takes first
    depends on when each became ready, so the time is solved from the algorithm's send order and
    the links' FIFOs segment by segment (``_Schedule``), as the emulated links run them: the
    reduction's segments go up as soon as a member's children's are in (a leaf's at once), the
    root's sums come down, each member passing them on. Loss: each segment's bytes take
    ``1 / (1 - p)`` of its link and its last packet one chain's expected timeouts a hop."""
    if workers < 2 or count == 0:
        return 0.0
    real = -(-count // payload_scale)
    per = segment_elements(real, count * itemsize, SEGMENT_BYTES)
    g = [max(1, -(-(hi - lo) // per)) for lo, hi in ((0, real // 2), (real // 2, real))]
    return _Schedule(plan(tuple(range(workers))), g, count * itemsize / 2, link, rto_us).run()


class _Schedule:
    """The tree's segments on FIFO links: an uplink takes them in (ready, segment, destination)
    order and a downlink in (first packet's arrival, source, segment) order, as a host does."""

    def __init__(self, trees: Trees, segments: list[int], half_bytes: float, link: LinkSpec, rto_us: float) -> None:
        self.trees, self.g = trees, segments
        self.up_free = [0.0] * len(trees.parent[0])
        self.down_free = [0.0] * len(trees.parent[0])
        self.times = [_hop(half_bytes / g, link, rto_us) for g in segments]  # per tree: (s, packet, latency, extra)
        self.heap: list[tuple] = []
        self.heard: dict[tuple[int, int, int], int] = {}
        self.done = [0.0] * len(trees.parent[0])  # each member's last result

    def run(self) -> float:
        n = len(self.up_free)
        for tree in range(2):
            for v in range(n):
                if not self.trees.children[tree][v]:
                    for i in range(self.g[tree]):
                        self._send(0.0, tree, i, v, self.trees.parent[tree][v], False)
        while self.heap:
            item = heapq.heappop(self.heap)
            getattr(self, item[1])(*item[0:1], *item[2:])
        return max(self.done)

    def _send(self, ready: float, tree: int, i: int, src: int, dst: int, down: bool) -> None:
        heapq.heappush(self.heap, (ready, "_up", down, tree, i, src, dst))

    def _up(self, ready: float, down: bool, tree: int, i: int, src: int, dst: int) -> None:
        s, pkt, lat, _ = self.times[tree]
        start = max(ready, self.up_free[src])
        self.up_free[src] = start + s
        heapq.heappush(self.heap, (start + pkt + lat, "_down", src, down, tree, i, dst, start + s + lat))

    def _down(self, first: float, src: int, down: bool, tree: int, i: int, dst: int, last: float) -> None:
        s, pkt, lat, extra = self.times[tree]
        done = max(max(first, self.down_free[dst]) + s, last + pkt)
        self.down_free[dst] = done
        heapq.heappush(self.heap, (done + lat + extra, "_arrive", down, tree, i, dst))

    def _arrive(self, t: float, down: bool, tree: int, i: int, v: int) -> None:
        kids, up = self.trees.children[tree][v], self.trees.parent[tree][v]
        if not down:
            key = (tree, i, v)
            self.heard[key] = self.heard.get(key, 0) + 1
            if self.heard[key] < len(kids):
                return
            if up >= 0:
                self._send(t, tree, i, v, up, False)
                return
        self.done[v] = max(self.done[v], t)  # the sum reached v (the root's own, or from its parent)
        for k in kids:
            self._send(t, tree, i, v, k, True)


def _hop(payload: float, link: LinkSpec, rto_us: float) -> tuple[float, float, float, float]:
    """A segment of ``payload`` bytes on a link: its serialization (loss: resent bytes included), a
    packet's, the latency, and one chain's expected timeouts at the end of each link."""
    packets = p2p_packets(int(math.ceil(payload)))
    wire = payload + packets * (FRAME_OVERHEAD + P2P_HEADER.itemsize)
    ser = float(link.serialization_us(wire))
    return ser / (1 - link.loss), ser / packets, link.latency_us, 2 * rto_us * expected_rounds(packets, link.loss)


DOUBLE_BINARY_TREE = mech.register(DoubleBinaryTreeMechanism())


@fabrics.register
class TreeFabric(fabrics.Fabric):
    name = "tree"
    description = "NCCL's double binary tree all-reduce between the workers, the switch forwarding"
    mechanisms = (mech.SPARSE_RING, DOUBLE_BINARY_TREE, mech.RING, *mech.COMMON)
