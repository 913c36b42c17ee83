"""A host's leaf switches' links to the spine (docs/topology.md): the queues that oversubscription
fills.

On a topology of several leaves a host holds whole leaves, so each leaf's uplink (toward the
spine) and downlink (from it) are FIFO links of this host (``leaf_ports x B / oversubscription``,
the spine hop's latency, lossless). What crosses between leaves passes them:

- up: a point-to-point segment for another leaf (or a parameter-server shard, which hangs off
  the spine) once its NIC has delivered it to the leaf; every INA contribution, which the spine
  aggregates (flat), or, hierarchical, one partial sum a chunk a leaf: the leaf holds its
  workers' contributions to a chunk until all are in, and one row of their sum crosses its link
  (``_gather``);
- down: such a segment arriving from the spine; every INA result, one copy a leaf (the spine
  multicasts to the leaves, each leaf to its ports).

Items wait in a heap keyed by their arrival at the link, and each window hands the due ones to
the links in arrival order, all at once. An arrival is at least a hop's latency after the event
that caused it, and the clock's lookahead is at most that, so everything due in a window is known
when it starts. Up, a window also hands over the rows before the leaf's horizon, however far
past its bound: the earliest a row not yet here can arrive (``Host.leaf_horizon``), so nothing
can come before them on the link (docs/physics.md, "The clock").

A leaf's link is faster than each NIC that feeds it, and a row (a segment, or a row of payload
scale standing for many packets) arrives spread over ``[first, last]`` at its NIC's pace. Real
packets of rows arriving together interleave; so the link here conserves work: row ``i`` takes
``S_i`` of the link from ``max(first_i, free)``, and leaves as its work is done or as its last
packet is in, whichever is later: ``done_i = max(start_i + S_i, last_i + S_i / n_i)``; its first
packet is out when the link gets to it, or as early as its spread allows where it interleaves:
``min(start_i, max(first_i, done_i - (last_i - first_i))) + S_i / n_i``. Rows that
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

from emu.emulator.links.array import uniform
from emu.emulator.links.fifo import firsts_of, lasts_of
from emu.emulator.links.spec import Capacity, LinkSpec
from emu.emulator.links.topology import Hierarchy, Layout
from emu.emulator.protocol.transport import AggBatch, Segment
from emu.errors import RunFailed
from emu.replay.config.options import ReplayConfig


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
    merged: bool = False  # one row on the link for all the item's rows: a leaf's partial sum

    def take(self, rows: np.ndarray) -> _Rows:
        assert isinstance(self.item, AggBatch)
        return _Rows(self.leaf[rows], self.first[rows], self.last[rows], self.wire_bytes[rows], self.packets[rows],
                     self.item.take(rows), None if self.tags is None else self.tags[rows])

    def order_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row, what orders rows that reach a link at the same time, from their content alone
        (the order hosts' messages reached the switch varies from run to run): segments before
        aggregation rows; a segment by (collective and destination, source and segment number); a
        row by (chunk, worker)."""
        if isinstance(self.item, Segment):  # one row
            return segment_keys([self.item])
        assert isinstance(self.item, AggBatch)
        chunks = self.item.headers["chunk"].astype(np.int64)
        workers = self.item.headers["worker"].astype(np.int64)
        jobs = self.item.headers["job"].astype(np.int64)
        if self.merged:  # one row: the partial's chunk and its lowest worker
            chunks, workers, jobs = chunks[:1], workers.min()[None], jobs[:1]
        return (jobs << 1) | 1, chunks, workers

    def job(self) -> int:
        """The job whose rows these are (a host's endpoints hand over one job's rows at a time)."""
        if isinstance(self.item, Segment):
            return self.item.job
        assert isinstance(self.item, AggBatch)
        return int(self.item.headers["job"][0])


def segment_keys(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_Rows.order_keys`` of segments: (job, before aggregation rows), (collective, destination),
    (source, segment number)."""
    return (np.array([g.job << 1 for g in segs], np.int64), np.array([(g.seq << 16) | g.dst for g in segs], np.int64),
            np.array([(g.src << 32) | g.segment for g in segs], np.int64))


@dataclass(slots=True)
class _Seg:
    """One segment waiting for a leaf link: ``_Rows``' fields as numbers (most of what waits at a
    leaf is single segments, whose one-row arrays cost more than the hand-off around them)."""

    leaf: int
    first: float
    last: float
    wire_bytes: float
    packets: float
    seg: Segment

    def rows(self) -> _Rows:
        return _Rows(np.array([self.leaf]), np.array([self.first]), np.array([self.last]), np.array([self.wire_bytes]),
                     np.array([self.packets]), self.seg)


def conserve(link: np.ndarray, first: np.ndarray, last: np.ndarray, ser: np.ndarray, packets: np.ndarray,
             free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by (link, first) through work-conserving servers (module docstring): row ``i``
    takes ``ser_i`` of its link from ``max(first_i, free)``; returns when its first and last
    packet are out, and moves ``free`` (per link) on. A switch's pipeline is one such server
    (emu.replay.switch.daemon)."""
    one = ser / np.maximum(packets, 1.0)
    n = len(first)
    new = firsts_of(link)
    starts = np.flatnonzero(new)
    seg = np.cumsum(new) - 1
    pos = np.arange(n) - starts[seg]
    # d_i = max(first_i, d_{i-1}) + S_i per link: on a (links x rows) grid, as LinkArray.transmit
    grid = np.zeros((len(starts), int(pos.max()) + 1))
    grid[seg, pos] = ser
    cum = np.cumsum(grid, axis=1)[seg, pos]
    grid.fill(-math.inf)
    grid[seg, pos] = np.maximum(first - (cum - ser), np.where(new, free[link], -math.inf))
    done = np.maximum.accumulate(grid, axis=1)[seg, pos] + cum
    lasts = lasts_of(starts, n)
    free[link[starts]] = done[lasts]
    out_last = np.maximum(done, last + one)
    # its first packet: out when the link gets to it (a slower link sends it at once, at its own
    # pace), or, where rows that arrived together interleave, as early as the row's spread
    # allows (a row that queued is squeezed toward its end); never before it is in
    start = done - ser
    return np.minimum(start + one, np.maximum(first + one, out_last - (last - first))), out_last


LEAF_STREAMS = 1 << 40  # the leaves' links draw jitter on streams of their own, far above any NIC's


class LeafStage:
    """The uplinks and downlinks of the leaves a host holds."""

    def __init__(self, leaves: np.ndarray, link: LinkSpec, seed: int, partial_of: np.ndarray | None = None,
                 window: int = 1, hop_us: float = 0.0) -> None:
        """``partial_of``: per job and leaf held, the workers whose contributions make one partial
        sum (hierarchical aggregation; None: flat); ``window``: the stream's real slots (how far back
        a retransmission can reach)."""
        self.leaves = np.asarray(leaves, np.int64)  # the global ids of the host's leaves
        self.partial_of = None if partial_of is None else np.atleast_2d(partial_of)
        self.window = window
        self.hop_us = hop_us  # the least time from a row's arrival down to an endpoint acting on it (``down_wakes_us``)
        self._held: dict[tuple[int, int, int], tuple[set[int], list[AggBatch], float, float, float, float]] = {}
        self._done: dict[tuple[int, int, int], None] = {}  # partial sums sent, recent ones (duplicates pass)
        self.index = {int(leaf): i for i, leaf in enumerate(self.leaves)}
        self.spec = link
        self.capacity = Capacity(link)  # the NICs' bandwidth schedule, scaled (Topology.spine_link)
        self.free = (np.zeros(len(self.leaves)), np.zeros(len(self.leaves)))  # per direction and leaf
        self.busy_us = (np.zeros(len(self.leaves)), np.zeros(len(self.leaves)))
        self._heaps: tuple[list, list] = ([], [])
        self._count = 0
        self.bytes_sent = 0.0
        self.bytes_by_job: dict[int, float] = {}  # of bytes_sent, per job (jobs sharing the fabric)
        self.seed = seed
        self.sent = (np.zeros(len(self.leaves), np.int64), np.zeros(len(self.leaves), np.int64))  # rows, per link
        # per leaf, the furthest horizon its link up sent rows before: a row arriving earlier would
        # have had to go before them (``advance``), a clock error, caught in ``_push``
        self.passed = np.full(len(self.leaves), -math.inf)

    @classmethod
    def of(cls, held: np.ndarray, cfg: ReplayConfig, *layouts: Layout) -> LeafStage:
        """The links of the leaves ``held`` (global ids, ascending) on ``cfg``'s topology; with
        hierarchical aggregation, each job's (``layouts``, in job order) partial sums."""
        topo = cfg.topology
        assert topo is not None
        spine = topo.spine_link(cfg.link)
        partial_of = (np.stack([np.bincount(lay.leaf, minlength=lay.leaves)[held] for lay in layouts])
                      if topo.algorithm == Hierarchy.HIERARCHICAL else None)
        return cls(held, spine, cfg.seed, partial_of, cfg.real_slots, cfg.nic_hop_us())

    def next_us(self, direction: int | None = None) -> float:
        """The earliest row waiting for a leaf's link (``direction``: 0 up, 1 down, None either)."""
        heaps = self._heaps if direction is None else self._heaps[direction:direction + 1]
        return min((h[0][0] for h in heaps if h), default=math.inf)

    def down_wakes_us(self, free_by_leaf: np.ndarray) -> float:
        """The earliest a row waiting for a leaf's link down can wake a NIC that sends: no earlier
        than the least free time of the NICs on its leaf (``free_by_leaf``, per leaf held), nor
        than it reaches an endpoint, ``hop_us`` at least after it arrives (a NIC's hop: it crosses
        the link down and then its NIC's downlink; never under the clock's lookahead, which the
        switch adds to a segment it just forwarded, ``emu.replay.switch.daemon.Windows._queued``,
        so that the bound is the same whether the segment reached its host yet or not)."""
        hop = self.hop_us
        return min((max(rows.first + hop, float(free_by_leaf[rows.leaf])) if isinstance(rows, _Seg) else
                    float(np.maximum(rows.first + hop, free_by_leaf[rows.leaf]).min())
                    for _, _, rows in self._heaps[1]), default=math.inf)

    def _push_seg(self, direction: int, item: _Seg) -> None:
        """``_push`` of one segment."""
        if direction == 0:
            passed = float(self.passed[item.leaf])
            if item.first < passed - 1e-12 * abs(passed):
                self._push(0, item.rows())  # which refuses it, saying why
                return
        self._count += 1
        heapq.heappush(self._heaps[direction], (item.first, self._count, item))

    def _push(self, direction: int, rows: _Rows) -> None:
        if not len(rows.first):
            return
        if direction == 0:  # to float rounding: a row stamped at a horizon is one the leaf left for later
            passed = self.passed[rows.leaf]
            early = rows.first < passed - 1e-12 * np.abs(passed)
            if early.any():
                at = int(np.argmax(early))
                leaf = int(rows.leaf[at])
                raise RunFailed(f"a row reached leaf {int(self.leaves[leaf])}'s link to the spine at "
                                f"{float(rows.first[at]):.6f} us, before the horizon {float(passed[at]):.6f} us "
                                "it already sent rows up to (a clock error: please report it)")
        self._count += 1
        heapq.heappush(self._heaps[direction], (float(rows.first.min()), self._count, rows))

    def _transmit(self, direction: int, leaf: np.ndarray, first: np.ndarray, last: np.ndarray, wire_bytes: np.ndarray,
                  packets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows sorted by (leaf, first) through the work-conserving links (module docstring): when
        the first and the last packet each row stands for reach the far end."""
        ser = np.asarray(self.spec.serialization_us(wire_bytes), np.float64)
        cap = self.capacity
        if not cap.active:
            np.add.at(self.busy_us[direction], leaf, ser)
            out_first, out_last = conserve(leaf, first, last, ser, packets, self.free[direction])
        else:  # a bandwidth schedule: the same servers in work coordinates (Capacity), mapped back
            free = cap.to(self.free[direction])
            out_first, out_last = conserve(leaf, cap.to(first), cap.to(last), ser, packets, free)
            out_first, out_last = cap.back(out_first), cap.back(out_last)
            # each row's share of its link, in time: what its serialization took at the rate then
            np.add.at(self.busy_us[direction], leaf, out_last - cap.back(cap.to(out_last) - ser))
            self.free[direction][:] = cap.back(free)
        lat = self.spec.latency_us + self._jitter(direction, leaf)
        return out_first + lat, out_last + lat

    def _jitter(self, direction: int, leaf: np.ndarray) -> np.ndarray | float:
        """Each row's jitter on its link (``leaf``: sorted), drawn as a NIC's segment's is: keyed by
        the link and the row's number on it, so the same whatever the process layout."""
        if not self.spec.jitter_us:  # the run's constant: no draw, nothing to number
            return 0.0
        count = self.sent[direction]
        rank = np.arange(len(leaf)) - np.searchsorted(leaf, leaf)  # the row's place among its leaf's
        number = count[leaf] + rank
        count += np.bincount(leaf, minlength=len(count))
        stream = LEAF_STREAMS + self.leaves[leaf] * 2 + direction
        return uniform(self.seed, stream, number) * self.spec.jitter_us

    def usage(self) -> dict[str, list]:
        """The leaves' links as ``Wiring.usage`` reports each kind of link."""
        out = {}
        for kind, direction in (("leaf to spine", 0), ("spine to leaf", 1)):
            busy = self.busy_us[direction]
            if len(busy):
                top = int(np.argmax(busy))  # the first of equals: leaves ascend
                out[kind] = [len(busy), int(np.rint(busy * 1e3).astype(np.int64).sum()), float(busy[top]),
                             f"leaf {int(self.leaves[top])}", int(self.leaves[top])]
        return out

    def segment(self, direction: int, leaf: int, seg: Segment, wire_bytes: float, packets: int) -> None:
        """A segment reached ``leaf`` (up: from its NIC; down: from the spine)."""
        self._push_seg(direction, _Seg(self.index[leaf], float(seg.first_us), float(seg.last_us), float(wire_bytes),
                                       float(packets), seg))

    def batch(self, direction: int, leaves: np.ndarray, batch: AggBatch, wire_bytes: np.ndarray,
              packets: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Aggregation rows that reached their leaves (``leaves``: global ids, one per row)."""
        local = np.searchsorted(self.leaves, np.asarray(leaves, np.int64))  # self.leaves is sorted
        rows = _Rows(local, np.asarray(batch.stamps[:, 0], np.float64), np.asarray(batch.stamps[:, 1], np.float64),
                     np.asarray(wire_bytes, np.float64), np.asarray(packets, np.float64), batch, tags)
        if direction == 0 and self.partial_of is not None:
            self._gather(rows)
        else:
            self._push(direction, rows)

    def _gather(self, rows: _Rows) -> None:
        """Hierarchical: hold each leaf's contributions to a chunk until all its workers' are in,
        then send one row, their sum, at the pace of the last (its packets are each the sum of the
        workers' packets of the same place: ``first`` and ``last`` are the latest of theirs). A
        contribution to a chunk whose partial already left (a retransmission) passes alone, as the
        spine answers it; a second one while the chunk is held is dropped, as a switch drops a
        duplicate for an unfinished slot. The spine's data plane forms the sum from the rows the
        partial carries: int32 sums are the same in any grouping."""
        assert self.partial_of is not None and isinstance(rows.item, AggBatch)
        batch = rows.item
        chunks = batch.headers["chunk"].astype(np.int64)
        workers = batch.headers["worker"].astype(np.int64)
        jobs = batch.headers["job"].astype(np.int64)
        alone = []
        for i in range(len(chunks)):
            key = (int(jobs[i]), int(rows.leaf[i]), int(chunks[i]))
            if key in self._done:
                alone.append(i)
                continue
            seen, held, first, last, wire, packets = self._held.get(key, (set(), [], -math.inf, -math.inf,
                                                                         float(rows.wire_bytes[i]),
                                                                         float(rows.packets[i])))
            if int(workers[i]) in seen:
                continue
            seen.add(int(workers[i]))
            held.append(batch.take(slice(i, i + 1)))
            first, last = max(first, float(rows.first[i])), max(last, float(rows.last[i]))
            # the partial's packets: a row's without its NIC's resends (with payload scale, a row counts
            # the packets its own NIC lost and resent, which do not cross the leaf's link)
            wire, packets = min(wire, float(rows.wire_bytes[i])), min(packets, float(rows.packets[i]))
            if len(seen) < self.partial_of[key[0], key[1]]:
                self._held[key] = (seen, held, first, last, wire, packets)
                continue
            self._held.pop(key, None)
            self._done[key] = None
            self._push(0, _Rows(np.array([key[1]]), np.array([first]), np.array([last]), np.array([wire]),
                                np.array([packets]), AggBatch.concat(held), merged=True))
        if alone:
            self._push(0, rows.take(np.asarray(alone, np.int64)))
        if len(self._done) > 64 * self.window * self.partial_of.size:  # a retransmission reaches a window back
            for key in list(self._done)[: len(self._done) // 2]:
                del self._done[key]

    def advance(self, direction: int, bound: float, inclusive: bool,
                on_segment: Callable[[Segment], None], on_batch: Callable[[AggBatch, np.ndarray | None], None],
                horizon: np.ndarray | None = None) -> None:
        """Hand every row due before the bound to its leaf's link, per link in arrival order, and
        pass what comes out, with its new times, on. ``horizon`` (per leaf held, up only): the
        earliest a row not yet here can reach the leaf's link (``Host.leaf_horizon``); rows
        before it go now, however far past the bound: no later row can come before them on
        their link, and what reaches the switch early waits for its window (a contribution at the
        switch, a forwarded segment at the host it is for)."""
        parts = self._due(direction, bound, inclusive, horizon)
        if not parts:
            return
        if all(isinstance(p, _Seg) for p in parts):  # segments alone: their columns from their numbers
            leaf = np.array([p.leaf for p in parts], np.int64)
            first = np.array([p.first for p in parts])
            last = np.array([p.last for p in parts])
            wire_bytes = np.array([p.wire_bytes for p in parts])
            packets = np.array([p.packets for p in parts])
            kind, k1, k2 = segment_keys([p.seg for p in parts])
        else:
            rows = [p.rows() if isinstance(p, _Seg) else p for p in parts]
            leaf, first, last, wire_bytes, packets = (np.concatenate([getattr(p, f) for p in rows]) for f in (
                "leaf", "first", "last", "wire_bytes", "packets"))
            kind, k1, k2 = (np.concatenate(k) for k in zip(*(p.order_keys() for p in rows), strict=True))
        order = np.lexsort((k2, k1, kind, first, leaf))  # per link, in arrival order, ties by content
        wire = wire_bytes[order]
        f_out, l_out = self._transmit(direction, leaf[order], first[order], last[order], wire, packets[order])
        self.bytes_sent += float(np.rint(wire).sum())
        out_first, out_last = np.empty(len(first)), np.empty(len(first))
        out_first[order], out_last[order] = f_out, l_out
        self._pass_on(parts, wire_bytes, out_first, out_last, on_segment, on_batch)

    def _due(self, direction: int, bound: float, inclusive: bool, horizon: np.ndarray | None) -> list[_Rows | _Seg]:
        """What ``advance`` hands to the links now, in the heap's order; the rest waits on."""
        heap = self._heaps[direction]
        reach = bound if horizon is None else max(bound, float(horizon.max(initial=-math.inf)))
        if horizon is not None:
            np.maximum(self.passed, horizon, out=self.passed)
        parts: list[_Rows | _Seg] = []
        later: list[_Rows | _Seg] = []
        while heap and (heap[0][0] <= reach if inclusive else heap[0][0] < reach):
            _, _, rows = heapq.heappop(heap)
            if isinstance(rows, _Seg):
                now = rows.first <= bound if inclusive else rows.first < bound
                (parts if now or (horizon is not None and rows.first < horizon[rows.leaf]) else later).append(rows)
                continue
            due = rows.first <= bound if inclusive else rows.first < bound
            if horizon is not None:
                due |= rows.first < horizon[rows.leaf]
            if not due.any():
                later.append(rows)
                continue
            if not due.all():
                later.append(rows.take(np.flatnonzero(~due)))
                rows = rows.take(np.flatnonzero(due))
            parts.append(rows)
        for rows in later:
            if isinstance(rows, _Seg):
                self._push_seg(direction, rows)
            else:
                self._push(direction, rows)
        return parts

    def _pass_on(self, parts: list[_Rows | _Seg], wire_bytes: np.ndarray, out_first: np.ndarray,
                 out_last: np.ndarray, on_segment: Callable[[Segment], None],
                 on_batch: Callable[[AggBatch, np.ndarray | None], None]) -> None:
        """Each part's bytes to its job, and the part on with its rows' new times (in ``parts``' order)."""
        at = 0
        for p in parts:
            if isinstance(p, _Seg):
                job = p.seg.job
                self.bytes_by_job[job] = self.bytes_by_job.get(job, 0.0) + float(np.rint(wire_bytes[at]))
                on_segment(p.seg.at(float(out_first[at]), float(out_last[at])))
                at += 1
                continue
            n = len(p.first)
            job = p.job()
            self.bytes_by_job[job] = self.bytes_by_job.get(job, 0.0) + float(np.rint(wire_bytes[at:at + n]).sum())
            f, la = out_first[at:at + n], out_last[at:at + n]
            at += n
            if isinstance(p.item, Segment):
                on_segment(p.item.at(float(f[0]), float(la[0])))
            else:
                assert isinstance(p.item, AggBatch)
                b = p.item
                stamps = np.stack([f, la], axis=1)
                packets = b.packets
                if p.merged:  # every contribution the partial sum carries arrives with it, as one row's packets
                    stamps = np.repeat(stamps, len(b.headers), axis=0)
                    packets = np.r_[p.packets[:1], np.zeros(len(b.headers) - 1)]
                on_batch(AggBatch(b.headers, b.payload, stamps, b.sparse, packets), p.tags)
