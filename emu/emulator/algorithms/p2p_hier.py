"""The hierarchical ring all_reduce on a topology (docs/topology.md), as NCCL's tree and
Horovod's hierarchical mode split it: reduce inside each node to its leader, all-reduce among
the leaders in a ring, broadcast inside each node.

1. Every other worker of a node sends its whole tensor to the node's leader (its lowest rank),
   over the node's own ports; the leader sums them into its own.
2. Once all its node's tensors are in, the leader joins a ring all-reduce of the nodes' sums
   among the leaders (``emu.emulator.algorithms.p2p.Ring`` over the leaders, in node order), across NICs.
3. As each segment's final sum becomes known, the leader keeps it; when the ring is done it
   sends the whole result to every worker of its node, which checks it against the sum over all
   M workers (exactly for generated payload, within the dtype's rounding for recorded).

A leader is done when it hands the result to its port (phase 3's sends), its members later, when
it arrives: the collective's end on the job is its last member's. Only dense all_reduces run
this way (``emu.replay.host.p2p``): a sparse one, and the other collectives, stay flat.

Segment numbers tell the phases apart on the wire: phase 2's are offset by ``RING``, phase 3's
by ``DOWN``. The phases do not overlap within a worker (a leader starts the ring when its node's
tensors are all in): simpler than NCCL's pipelined tree, and an upper bound on its time.
"""

from __future__ import annotations

import numpy as np

from emu.emulator.algorithms.p2p import Algorithm, Chunks, Ring, Seg

RING = 1 << 28
DOWN = 1 << 29


class _LeaderRing(Ring):
    """A Ring among the leaders: virtual ranks, the nodes' sums as its own values, and sums
    checked against all M workers' (the data are M workers')."""

    def __init__(self, *args, workers: int, partial: np.ndarray, **kw) -> None:
        super().__init__(*args, **kw)
        self.summed_over, self.partial = workers, partial

    def own(self, lo: int, hi: int, worker: int | None = None) -> np.ndarray:
        return self.partial[lo:hi]


class HierRing(Algorithm):
    """One worker's side of the hierarchical ring all_reduce (module docstring)."""

    def __init__(self, *args, node: list[int], leaders: list[int], emu_bytes: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.node = node  # the workers of this worker's node, the leader first
        self.leader = node[0]
        self.leaders = leaders  # every node's leader, in node order
        self.emu_bytes = emu_bytes
        self.real = self.layout.real
        self.segs = self.layout.segments(0)  # phases 1 and 3: the whole tensor, segment by segment
        self.got = 0
        self.ring: _LeaderRing | None = None
        self.early: list[tuple[int, int, np.ndarray, float]] = []  # ring segments before its node's sum
        if self.rank == self.leader:
            self.sum = self.own(0, self.real).astype(np.float64)
            self.result = np.zeros(self.real)
            self.known = 0  # elements whose final sum the ring gave
            self.need = (len(node) - 1) * len(self.segs)  # phase-1 segments to sum in

    def start(self, t: float) -> list[Seg]:
        if self.rank != self.leader:
            return [Seg(self.leader, self.seq, seg, self.own(lo, hi), self.layout.seg_emu_bytes(0), t)
                    for seg, lo, hi in self.segs]
        return self._ring(t) if self.need == 0 else []

    def _ring(self, t: float) -> list[Seg]:
        """The node's sum is complete: join the leaders' ring (or, alone, it is the result)."""
        n = len(self.leaders)
        if n == 1:
            self.result[:] = self.sum
            self.check_sum(self.result, 0, self.real)
            return self._down(t)
        v = self.leaders.index(self.rank)
        self.ring = _LeaderRing(rank=v, size=n, seq=self.seq, dtype=self.dtype,
                                layout=Chunks.shared(self.real, n, self.emu_bytes), seed=self.seed, check=self.check,
                                recorded=self.recorded, reduce=True, gather=True, own=v, workers=self.size,
                                partial=self.sum)
        self.ring.on_final = self._final
        self.ring.distinct = self.distinct  # rank 0 counts distinct elements, leader or not
        out = self._up(self.ring.start(t))
        for src, segment, data, at in self.early:
            out += self.on_segment(src, segment, data, max(at, t))
        self.early = []
        return out

    def _up(self, segs: list[Seg]) -> list[Seg]:
        for s in segs:
            s.dst, s.segment = self.leaders[s.dst], s.segment + RING
        return segs

    def _final(self, lo: int, hi: int, values: np.ndarray) -> None:
        self.result[lo:hi] = values
        self.known += hi - lo

    def _down(self, t: float) -> list[Seg]:
        self.finished, self.end_us = True, max(self.end_us, t)
        return [Seg(w, self.seq, seg + DOWN, self.result[lo:hi], self.layout.seg_emu_bytes(0), t)
                for w in self.node[1:] for seg, lo, hi in self.segs]

    def on_segment(self, src: int, segment: int, data: np.ndarray, t: float) -> list[Seg]:
        self._done(t)
        if segment >= DOWN:  # phase 3, at a worker: the result
            _, lo, hi = self._map[segment - DOWN]
            self.check_sum(data, lo, hi)
            self.got += 1
            self.finished = self.got == len(self.segs)
            return []
        if segment >= RING:  # phase 2, at a leader
            if self.ring is None:  # the left leader's node was quicker: keep it until this one's sum is in
                self.early.append((src, segment, data, t))
                return []
            out = self._up(self.ring.on_segment(self.leaders.index(src), segment - RING, data, t))
            if self.ring.finished and self.known >= self.real:
                out += self._down(t)
            return out
        _, lo, hi = self._map[segment]  # phase 1, at the leader: a member's tensor
        self.sum[lo:hi] += data
        self.got += 1
        return self._ring(t) if self.got == self.need else []
