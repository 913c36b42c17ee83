"""A host's leaf switches' links to the spine (docs/topology.md): the queues that oversubscription
fills.

On a topology of several leaves a host holds whole leaves, so each leaf's uplink (toward the
spine) and downlink (from it) are FIFO links of this host (``leaf_ports x B / oversubscription``,
the spine hop's latency, lossless). What crosses between leaves passes them:

- up: a point-to-point segment for another leaf (or a parameter-server shard, which hangs off
  the spine) once its NIC has delivered it to the leaf; every INA contribution, which the spine
  aggregates;
- down: such a segment arriving from the spine; every INA result, one copy a leaf (the spine
  multicasts to the leaves, each leaf to its ports).

Items wait in a heap keyed by their arrival at the link, and each window hands the due ones to
the links in arrival order, all at once. An arrival is at least a hop's latency after the event
that caused it, and the clock's lookahead is at most that, so everything due in a window is known
when it starts.

A leaf's link is faster than each NIC that feeds it, and a row (a segment, or a row of payload
scale standing for many packets) arrives spread over ``[first, last]`` at its NIC's pace. Real
packets of rows arriving together interleave; so the link here conserves work: row ``i`` takes
``S_i`` of the link from ``max(first_i, free)``, and leaves as its work is done or as its last
packet is in, whichever is later: ``done_i = max(start_i + S_i, last_i + S_i / n_i)``, its first
packet out as early as its spread allows: ``max(first_i, done_i - (last_i - first_i)) + S_i / n_i``. Rows that
together arrive slower than the link pass at their own pace; rows that together arrive faster
queue, and the link's backlog grows by exactly the excess (``LinkArray.transmit``'s store and
forward of whole rows would instead delay every row behind the last packet of the one before it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emu.emulator.links import LinkSpec
from emu.emulator.transport import AggBatch, Segment

LEAF_BASE = 1 << 21  # leaf links' ids for their streams, apart from endpoints' and NICs'


@dataclass
class _Rows:
    """Rows waiting for a leaf link: each with its leaf (local index), times and size."""

    leaf: np.ndarray
    first: np.ndarray
    last: np.ndarray
    wire_bytes: np.ndarray
    packets: np.ndarray
    item: object  # a Segment (one row) or an AggBatch (its rows)
    tags: np.ndarray | None = None  # per row: what the item's owner needs back (INA: the leaf's id)

    def take(self, rows: np.ndarray) -> _Rows:
        assert isinstance(self.item, AggBatch)
        return _Rows(self.leaf[rows], self.first[rows], self.last[rows], self.wire_bytes[rows], self.packets[rows],
                     self.item.take(rows), None if self.tags is None else self.tags[rows])


class LeafStage:
    """The uplinks and downlinks of the leaves a host holds."""

    def __init__(self, leaves: np.ndarray, link: LinkSpec, seed: int) -> None:
        self.leaves = np.asarray(leaves, np.int64)  # the global ids of the host's leaves
        self.index = {int(leaf): i for i, leaf in enumerate(self.leaves)}
        self.spec = link
        self.free = (np.zeros(len(self.leaves)), np.zeros(len(self.leaves)))  # per direction and leaf
        self.busy_us = (np.zeros(len(self.leaves)), np.zeros(len(self.leaves)))
        self._heaps: tuple[list, list] = ([], [])
        self._count = 0
        self.bytes_sent = 0.0

    def next_us(self) -> float:
        return min((h[0][0] for h in self._heaps if h), default=math.inf)

    def _push(self, direction: int, rows: _Rows) -> None:
        if not len(rows.first):
            return
        self._count += 1
        heapq.heappush(self._heaps[direction], (float(rows.first.min()), self._count, rows))

    def _transmit(self, direction: int, leaf: np.ndarray, first: np.ndarray, last: np.ndarray, wire_bytes: np.ndarray,
                  packets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows sorted by (leaf, first) through the work-conserving links (module docstring): when
        the first and the last packet each row stands for reach the far end."""
        ser = np.asarray(self.spec.serialization_us(wire_bytes), np.float64)
        one = ser / np.maximum(packets, 1.0)
        free = self.free[direction]
        n = len(first)
        new = np.r_[True, leaf[1:] != leaf[:-1]]
        starts = np.flatnonzero(new)
        seg = np.cumsum(new) - 1
        pos = np.arange(n) - starts[seg]
        # d_i = max(first_i, d_{i-1}) + S_i per link: on a (links x rows) grid, as LinkArray.transmit
        grid = np.zeros((len(starts), int(pos.max()) + 1))
        grid[seg, pos] = ser
        cum = np.cumsum(grid, axis=1)[seg, pos]
        grid.fill(-math.inf)
        grid[seg, pos] = np.maximum(first - (cum - ser), np.where(new, free[leaf], -math.inf))
        done = np.maximum.accumulate(grid, axis=1)[seg, pos] + cum
        lasts = np.r_[starts[1:] - 1, n - 1]
        free[leaf[starts]] = done[lasts]
        np.add.at(self.busy_us[direction], leaf, ser)
        lat = self.spec.latency_us
        out_last = np.maximum(done, last + one)
        # the row keeps its own spread where the link keeps up, and is squeezed toward its end where
        # it queued (its first packet is never out before it is in)
        return np.maximum(first + one, out_last - (last - first)) + lat, out_last + lat

    def segment(self, direction: int, leaf: int, seg: Segment, wire_bytes: float, packets: int) -> None:
        """A segment reached ``leaf`` (up: from its NIC; down: from the spine)."""
        one = np.ones(1)
        self._push(direction, _Rows(np.array([self.index[leaf]]), np.array([seg.first_us]), np.array([seg.last_us]),
                                    one * wire_bytes, one * packets, seg))

    def batch(self, direction: int, leaves: np.ndarray, batch: AggBatch, wire_bytes: np.ndarray,
              packets: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Aggregation rows that reached their leaves (``leaves``: global ids, one per row)."""
        local = np.searchsorted(self.leaves, np.asarray(leaves, np.int64))  # self.leaves is sorted
        self._push(direction, _Rows(local, np.asarray(batch.stamps[:, 0], np.float64),
                                    np.asarray(batch.stamps[:, 1], np.float64), np.asarray(wire_bytes, np.float64),
                                    np.asarray(packets, np.float64), batch, tags))

    def advance(self, direction: int, bound: float, inclusive: bool,
                on_segment: Callable[[Segment], None], on_batch: Callable[[AggBatch, np.ndarray | None], None]) -> None:
        """Hand every row due before the bound to its leaf's link, per link in arrival order, and
        pass what comes out, with its new times, on."""
        heap = self._heaps[direction]
        parts: list[_Rows] = []
        while heap and (heap[0][0] <= bound if inclusive else heap[0][0] < bound):
            _, _, rows = heapq.heappop(heap)
            due = rows.first <= bound if inclusive else rows.first < bound
            if not due.all():
                self._push(direction, rows.take(np.flatnonzero(~due)))
                rows = rows.take(np.flatnonzero(due))
            parts.append(rows)
        if not parts:
            return
        leaf = np.concatenate([p.leaf for p in parts])
        first = np.concatenate([p.first for p in parts])
        order = np.lexsort((np.arange(len(first)), first, leaf))  # per link, in arrival order
        wire = np.concatenate([p.wire_bytes for p in parts])[order]
        f_out, l_out = self._transmit(direction, leaf[order], first[order],
                                      np.concatenate([p.last for p in parts])[order], wire,
                                      np.concatenate([p.packets for p in parts])[order])
        self.bytes_sent += float(np.rint(wire).sum())
        out_first, out_last = np.empty(len(first)), np.empty(len(first))
        out_first[order], out_last[order] = f_out, l_out
        at = 0
        for p in parts:
            n = len(p.first)
            f, la = out_first[at:at + n], out_last[at:at + n]
            at += n
            if isinstance(p.item, Segment):
                seg = p.item
                on_segment(Segment(seg.header, seg.emu_bytes, float(f[0]), float(la[0]), seg.values))
            else:
                assert isinstance(p.item, AggBatch)
                b = p.item
                on_batch(AggBatch(b.headers, b.payload, np.stack([f, la], axis=1), b.sparse), p.tags)
