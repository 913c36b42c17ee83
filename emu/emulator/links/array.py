"""The link model: per endpoint an uplink and a downlink to the switch (``LinkArray``), as
``emu.emulator.links.spec.LinkSpec`` describes them.

A link serializes packets one after another at its bandwidth (FIFO, store and
forward per packet) and then delays each by its propagation latency, plus a
uniform jitter in [0, jitter]; a packet is lost with probability ``loss``.
Everything is in emulated microseconds and computed from stamps, never from the
wall clock. Serialization uses wire bytes (``emu.emulator.protocol.wire``).

``LinkArray.transmit`` solves the FIFO recurrence ``d_i = max(r_i, d_{i-1}) + s_i``
for a whole batch with numpy: with ``S_i = s_0 + ... + s_i``,
``d_i = S_i + max(free, max_{j<=i}(r_j - S_{j-1}))``, link by link on a grid so that a
link's times never depend on which other links share the batch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from emu.emulator.links.fifo import (
    DEEP,
    DeepTable,
    fifo,
    fifo_pipelined,
    firsts_of,
    lasts_of,
    lead,
    pipelined_table,
    side_by_side,
    turns,
)
from emu.emulator.links.spec import Capacity, LinkSpec

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def uniform(seed: int, stream: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Counter-based uniform draws in [0, 1): the same for a packet whatever the process layout."""
    with np.errstate(over="ignore"):
        x = (stream.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             ^ counter.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# A packet resent this many times in a row means a replay that cannot finish (loss alone does it
# with probability loss ** 48: 4e-15 at 50%, 0.6 at 99%): the host stops it, saying so
# (emu.replay.host.runtime), and a segment's rounds are not drawn past it.
GIVE_UP_ROUNDS = 48

class Transmitted(NamedTuple):
    """What a batch of rows met on a link, per row in the order given."""

    first_us: np.ndarray  # the first packet the row stands for is at the far end
    last_us: np.ndarray  # and the last
    lost: np.ndarray  # bool: the row (some packet of it) was lost
    lost_packets: np.ndarray  # of the packets a lost row stands for, how many were lost (>= 1)


class _Grid:
    """Rows of links (sorted by link: ``seg``, each row's link; ``pos``, its place on it) on a
    (links x rows) grid, for a running sum or maximum along each link's rows: every value depends
    on its own link's rows alone, so the result is bit for bit the same whichever other links
    share the batch (a flat cumulative sum over all links would round each link's times by what
    came before it). ``single``: one row a link (a worker's one slot on ``ina``, most often): no
    grid, each row its own sum and maximum (what a grid of one column gives, without its scatter
    and gather)."""

    def __init__(self, seg: np.ndarray, pos: np.ndarray, single: bool) -> None:
        self.seg, self.pos, self.single = seg, pos, single
        self.shape = (int(seg[-1]) + 1, int(pos.max()) + 1)

    def cumsum(self, v: np.ndarray) -> np.ndarray:
        if self.single:
            return v
        grid = np.zeros(self.shape)
        grid[self.seg, self.pos] = v
        return np.cumsum(grid, axis=1)[self.seg, self.pos]

    def running_max(self, v: np.ndarray) -> np.ndarray:
        if self.single:
            return v
        grid = np.full(self.shape, -math.inf)
        grid[self.seg, self.pos] = v
        return np.maximum.accumulate(grid, axis=1)[self.seg, self.pos]


class LinkArray:
    """The FIFO state of one direction of the links of many endpoints, vectorized.

    Loss and jitter are drawn from (seed, endpoint, direction, packet counter), so a
    packet's fate does not depend on which process hosts its endpoint.
    """

    def __init__(self, spec: LinkSpec, endpoints: np.ndarray, seed: int, direction: int,
                 rto_us: float = 1000.0) -> None:
        self.spec = spec
        self.rto_us = rto_us
        self.resent_packets = 0
        self.resend_rounds = 0  # point-to-point resend rounds (each a timeout)
        # the most rounds one segment needed (some packet of it lost that many times in a row), and
        # on which endpoint's link (what a replay that cannot finish shows: Host._check_progress)
        self.most_rounds = (0, -1)
        self.endpoints = np.asarray(endpoints, dtype=np.int64)
        n = len(self.endpoints)
        self.free_us = np.zeros(n)
        self.busy_us = np.zeros(n)  # serialization each link carried (its utilisation's numerator)
        self.last_ready = np.full(n, -math.inf)
        self.counter = np.zeros(n, dtype=np.int64)
        # per endpoint: the most the reordered hand-overs may have shifted its packets' times
        self.reorder_error_us = np.zeros(n)
        self.stream = self.endpoints * 2 + direction
        self.seed = seed
        self.reordered = 0
        self.capacity = Capacity(spec)

    def _fate(self, idx: np.ndarray, lossy: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Jitter and loss for packets of endpoints idx (in FIFO order per endpoint)."""
        n = len(idx)
        loss = self.spec.loss if lossy else 0.0
        if not (self.spec.jitter_us or loss):
            self.counter += np.bincount(idx, minlength=len(self.counter))
            return np.zeros(n), np.zeros(n, dtype=bool)
        # each packet's number on its endpoint's link
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        first = np.searchsorted(sorted_idx, sorted_idx)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - first
        counter = self.counter[idx] + rank
        self.counter += np.bincount(idx, minlength=len(self.counter))
        jitter = (uniform(self.seed, self.stream[idx] * 2, counter) * self.spec.jitter_us
                  if self.spec.jitter_us else np.zeros(n))
        lost = (uniform(self.seed, self.stream[idx] * 2 + 1, counter) < loss
                if loss else np.zeros(n, dtype=bool))
        return jitter, lost

    def transmit(self, idx: np.ndarray, ready_us: np.ndarray, wire_bytes: np.ndarray,
                 packets: np.ndarray | None = None,
                 ready_last_us: np.ndarray | None = None, lossy: bool = True) -> Transmitted:
        """Rows of endpoints ``idx`` (FIFO order within each) -> (first and last arrival at the far
        end, lost).

        A row may stand for ``packets`` packets sent back to back (payload scale): its first
        packet is ready at ``ready_us``, its last at ``ready_last_us`` (default: the same), so
        a group that arrives pipelined leaves pipelined. Per endpoint it solves
        ``d_i = max(r_i, d_{i-1}) + S_i`` with ``r_i = max(first_i, last_i + s_i - S_i)``
        (``S_i`` the row's serialization, ``s_i`` one packet's) for the whole batch at once.
        A row is lost if any of its packets is: probability ``1 - (1 - loss) ** packets``;
        ``lossy=False``: never (with payload scale, ``emu.emulator.links.scaled_loss`` draws the
        emulated packets' fate instead, and the real row always crosses).
        """
        idx = np.asarray(idx, dtype=np.int64)
        n = len(idx)
        if n == 0:
            return Transmitted(np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0))
        cap = self.capacity  # with a bandwidth schedule: solved in work coordinates (Capacity)
        first_ready = cap.to(np.asarray(ready_us, dtype=np.float64))
        count = np.ones(n) if packets is None else np.maximum(np.asarray(packets, dtype=np.float64), 1.0)
        ser = np.broadcast_to(np.asarray(self.spec.serialization_us(np.asarray(wire_bytes, np.float64)),
                                         dtype=np.float64), (n,))
        one = ser / count
        ready = first_ready
        if ready_last_us is not None:
            ready = np.maximum(first_ready, cap.to(np.asarray(ready_last_us, dtype=np.float64)) + one - ser)
        order = np.argsort(idx, kind="stable")
        e, r, sv = idx[order], ready[order], ser[order]
        new = firsts_of(e)
        starts = np.flatnonzero(new)
        seg = np.cumsum(new) - 1
        pos = np.arange(n) - starts[seg]  # each row's place on its link in this batch
        grid = _Grid(seg, pos, len(starts) == n)
        cum = grid.cumsum(sv)  # serialization up to and including each row
        firsts = e[starts]
        # Out of order: handed over earlier than a previous row of the same link, by more than
        # its own serialization (a row standing for many packets interleaves with its
        # neighbours on the real wire; only a packet-level inversion is a reordering).
        slack = sv + 1e-6
        reference = np.where(new, cap.to(self.last_ready[e]), lead(-math.inf, r[:-1]))
        early = r < reference - slack
        if early.any():
            # it waited at most for what was handed over before it but was due after it
            np.add.at(self.reorder_error_us, e[early], reference[early] - r[early] + sv[early])
            self.reordered += int(early.sum())
        start = grid.running_max(np.maximum(r - (cum - sv), cap.to(self.free_us[e])))
        done = cum + start
        last = lasts_of(starts, n)
        self.free_us[firsts] = cap.back(done[last])
        np.add.at(self.busy_us, e, cap.back(done) - cap.back(done - sv))  # in time: a schedule changes the pace
        self.last_ready[firsts] = np.maximum(self.last_ready[firsts], cap.back(np.maximum.reduceat(r, starts)))
        counter0 = self.counter[e] + pos  # each row's number on its link
        jitter, lost = self._fate(e, lossy)
        lost_n = np.zeros(n)
        if self.spec.loss and lossy:
            extra = uniform(self.seed + 7, self.stream[e], counter0)
            lost |= extra < 1 - (1 - self.spec.loss) ** np.maximum(count[order] - 1, 0)
            for i in np.flatnonzero(lost):
                lost_n[i] = self._lost_packets(int(e[i]), int(counter0[i]), float(count[order][i]))
        first_out, last_out = np.empty(n), np.empty(n)
        lost_out = np.empty(n, dtype=bool)
        lost_packets = np.empty(n)
        lat = self.spec.latency_us + jitter
        last_out[order] = cap.back(done) + lat
        first_out[order] = cap.back(done - sv + one[order]) + lat
        lost_out[order] = lost
        lost_packets[order] = lost_n
        return Transmitted(first_out, last_out, lost_out, lost_packets)

    def _lost_packets(self, i: int, counter: int, count: float) -> float:
        """Of the ``count`` packets a lost row stands for, how many were lost (at least one): a
        draw keyed by (seed, link, the row's number on it), so the same whatever the process layout."""
        n = max(1, int(round(count)))
        if n == 1:
            return 1.0
        key = int(uniform(self.seed + 17, self.stream[i:i + 1], np.array([counter]))[0] * 2**62)
        return float(max(1, np.random.default_rng(key).binomial(n, self.spec.loss)))

    def _segment_loss(self, i: int, packets: int, wire_bytes: float) -> tuple[float, float]:
        """Point-to-point transports recover lost packets themselves (selective repeat after a
        timeout): the delay and the extra bytes of the rounds a segment needs."""
        if not self.spec.loss:
            return 0.0, 0.0
        key = int(uniform(self.seed + 11, self.stream[i:i + 1], self.counter[i:i + 1])[0] * 2**63)
        rng = np.random.default_rng(key)
        lost = int(rng.binomial(packets, self.spec.loss))
        delay = extra = 0.0
        rounds = 0
        while lost and rounds < GIVE_UP_ROUNDS:  # past it the replay stops (Host._check_progress)
            rounds += 1
            self.resend_rounds += 1
            self.resent_packets += lost
            delay += self.rto_us
            extra += wire_bytes / packets * lost
            lost = int(rng.binomial(lost, self.spec.loss))
        if rounds > self.most_rounds[0]:
            self.most_rounds = (rounds, int(self.endpoints[i]))
        return delay, extra

    def _check_order(self, i: int, ready_us: float, ser: float) -> None:
        last = float(self.last_ready[i])
        if ready_us < last - ser - 1e-6:
            self.reordered += 1
            self.reorder_error_us[i] += last - ready_us + ser
        if ready_us > last:
            self.last_ready[i] = ready_us

    def send_segment(self, i: int, ready_us: float, wire_bytes: float,
                     packets: int) -> tuple[float, float, float]:
        """A point-to-point segment of many packets leaves endpoint i.

        Returns when its first and last packets are at the switch, and the bytes resent.
        """
        delay, extra = self._segment_loss(i, packets, wire_bytes)
        ser = float(self.spec.serialization_us(wire_bytes + extra))
        self._check_order(i, ready_us, ser)
        lat = self.spec.latency_us + self._segment_jitter(i)
        cap = self.capacity
        if not cap.active:  # the same arithmetic without the maps (identities), for the common case
            start = max(ready_us, float(self.free_us[i]))
            end = start + ser
            self.free_us[i] = end
            self.busy_us[i] += end - start
            self.counter[i] += packets
            return start + ser / packets + lat, end + delay + lat, extra
        start = float(cap.to(max(ready_us, self.free_us[i])))
        # the resent packets take their share of the link, but while their timers run the link
        # carries whatever comes next: only the segment's last packet waits for them
        end = float(cap.back(start + ser))
        self.free_us[i] = end
        self.busy_us[i] += end - float(cap.back(start))
        self.counter[i] += packets
        return float(cap.back(start + ser / packets)) + lat, end + delay + lat, extra

    def send_segments(self, idx: np.ndarray, ready_us: np.ndarray, wire_bytes: np.ndarray,
                      packets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``send_segment`` for many segments at once (rows of one link in their FIFO order): the
        same arithmetic, a link's rows one after another (``_deep``: a link with many rows as a
        running sum; else every link's k-th row in one numpy step), so that a window's hand-offs
        cost a few numpy steps, not a Python call each. Returns, per row, when its first and last
        packets are at the switch, and the bytes resent."""
        first, last = np.empty(len(idx)), np.empty(len(idx))
        extra_out = np.zeros(len(idx))
        cap = self.capacity
        turns, deep = self._grouped(idx)
        left = side_by_side(deep, lambda part: self._deep_sent(idx, part, ready_us, wire_bytes, packets, first, last))
        for rows in left:
            i = int(idx[rows[0]])
            ser = self.spec.serialization_us(wire_bytes[rows] + 0.0)
            ready, pk = ready_us[rows], packets[rows]
            self._check_chain(i, ready, ser)
            free = float(self.free_us[i])
            end = fifo(ready, ser, free)
            start = np.maximum(ready, lead(free, end[:-1]))
            self._took(i, end[-1], end - start, pk)
            first[rows] = start + ser / pk + self.spec.latency_us
            last[rows] = end + self.spec.latency_us
        for rows in turns:
            i, ready = idx[rows], ready_us[rows]
            pk = packets[rows]
            delay, extra = self._segments_loss(i, pk, wire_bytes[rows])
            ser = self.spec.serialization_us(wire_bytes[rows] + extra)
            self._check_orders(i, ready, ser)
            lat = self.spec.latency_us + self._segments_jitter(i)
            if not cap.active:
                start = np.maximum(ready, self.free_us[i])
                end = start + ser
                self.busy_us[i] += end - start
                first[rows] = start + ser / pk + lat
            else:
                start = cap.to(np.maximum(ready, self.free_us[i]))
                end = cap.back(start + ser)
                self.busy_us[i] += end - cap.back(start)
                first[rows] = cap.back(start + ser / pk) + lat
            self.free_us[i] = end
            self.counter[i] += pk
            last[rows] = end + delay + lat
            extra_out[rows] = extra
        return first, last, extra_out

    def receive_segments(self, idx: np.ndarray, first_us: np.ndarray, last_us: np.ndarray, wire_bytes: np.ndarray,
                         packets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``receive_segment`` for many segments at once (rows of one link in their FIFO order), as
        ``send_segments``. Returns, per row, its arrival and the bytes resent."""
        arrive = np.empty(len(idx))
        extra_out = np.zeros(len(idx))
        cap = self.capacity
        turns, deep = self._grouped(idx)
        left = side_by_side(deep, lambda part: self._deep_received(idx, part, first_us, last_us, wire_bytes, packets,
                                                                   arrive))
        for rows in left:
            i = int(idx[rows[0]])
            ser = self.spec.serialization_us(wire_bytes[rows] + 0.0)
            first, pk = first_us[rows], packets[rows]
            self._check_chain(i, first, ser)
            done = fifo_pipelined(first, last_us[rows] + ser / pk, ser, float(self.free_us[i]))
            self._took(i, done[-1], done - (done - ser), pk)
            arrive[rows] = done + self.spec.latency_us
        for rows in turns:
            i, first, last = idx[rows], first_us[rows], last_us[rows]
            pk = packets[rows]
            delay, extra = self._segments_loss(i, pk, wire_bytes[rows])
            ser = self.spec.serialization_us(wire_bytes[rows] + extra)
            self._check_orders(i, first, ser)
            if cap.active:
                done = cap.back(np.maximum(cap.to(np.maximum(first, self.free_us[i])) + ser,
                                           cap.to(last) + ser / pk))
                busy = done - cap.back(cap.to(done) - ser)
            else:
                done = np.maximum(np.maximum(first, self.free_us[i]) + ser, last + ser / pk)
                busy = done - (done - ser)
            self.free_us[i] = done
            self.busy_us[i] += busy
            jitter = self._segments_jitter(i)
            self.counter[i] += pk
            arrive[rows] = done + delay + self.spec.latency_us + jitter
            extra_out[rows] = extra
        return arrive, extra_out

    def _deep_sent(self, idx: np.ndarray, deep: list[np.ndarray], ready_us: np.ndarray, wire_bytes: np.ndarray,
                   packets: np.ndarray, first: np.ndarray, last: np.ndarray) -> list[np.ndarray]:
        """Deep links of ``send_segments`` side by side (``DeepTable``, at least two): each link's FIFO
        as one running sum where no row finds it idle; returns the links left for one by one."""
        d = DeepTable(idx, deep)
        ser_flat = self.spec.serialization_us(wire_bytes[d.rows] + 0.0)
        ready, ser = d.table(ready_us[d.rows], -math.inf), d.table(ser_flat, 0.0)
        free = self.free_us[d.links]
        early, ready_last = d.chain(self.last_ready[d.links], ready, ser)
        head = np.maximum(ready[:, 0], free) + ser[:, 0]
        end = np.add.accumulate(np.concatenate([head[:, None], ser[:, 1:]], axis=1), axis=1)
        gap = (ready[:, 1:] > end[:, :-1]) & d.valid[:, 1:]
        ok = ~(early | gap.any(axis=1))
        start = np.maximum(ready, np.concatenate([free[:, None], end[:, :-1]], axis=1))
        end_flat, start_flat = d.flat(end), d.flat(start)
        pk = packets[d.rows]
        self._deep_took(d, ok, end, end - start, ready_last, pk)
        mine = ok[d.link]
        rows = d.rows[mine]
        first[rows] = start_flat[mine] + ser_flat[mine] / pk[mine] + self.spec.latency_us
        last[rows] = end_flat[mine] + self.spec.latency_us
        return [deep[j] for j in np.flatnonzero(~ok)]

    def _deep_received(self, idx: np.ndarray, deep: list[np.ndarray], first_us: np.ndarray, last_us: np.ndarray,
                       wire_bytes: np.ndarray, packets: np.ndarray, arrive: np.ndarray) -> list[np.ndarray]:
        """The deep links of ``receive_segments`` side by side, as ``_deep_sent``."""
        d = DeepTable(idx, deep)
        ser_flat = self.spec.serialization_us(wire_bytes[d.rows] + 0.0)
        pk = packets[d.rows]
        first, ser = d.table(first_us[d.rows], -math.inf), d.table(ser_flat, 0.0)
        tail = d.table(last_us[d.rows] + ser_flat / pk, -math.inf)
        early, ready_last = d.chain(self.last_ready[d.links], first, ser)
        done, runs = pipelined_table(first, ser, tail, d.valid, self.free_us[d.links])
        ok = ~early & runs
        self._deep_took(d, ok, done, done - (done - ser), ready_last, pk)
        mine = ok[d.link]
        arrive[d.rows[mine]] = d.flat(done)[mine] + self.spec.latency_us
        return [deep[j] for j in np.flatnonzero(~ok)]

    def _deep_took(self, d: DeepTable, ok: np.ndarray, end: np.ndarray, busy: np.ndarray, ready_last: np.ndarray,
                   packets: np.ndarray) -> None:
        """``_took`` and ``_check_chain``'s last ready time of the deep links ``ok`` (their busy time
        added row by row: the table's pads add 0.0, which changes no sum)."""
        links = d.links[ok]
        rows = np.arange(len(d.links))[ok]
        self.free_us[links] = end[rows, d.counts[ok] - 1]
        busy = np.where(d.valid, busy, 0.0)[ok]
        self.busy_us[links] = np.add.accumulate(np.concatenate([self.busy_us[links][:, None], busy], axis=1),
                                                axis=1)[:, -1]
        self.counter[links] += np.add.reduceat(packets.astype(np.int64), d.starts)[ok]
        self.last_ready[links] = ready_last[ok]

    def _grouped(self, idx: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The rows in turns (``turns``), the rows of links with many of them apart, each link's in
        order, where the plain FIFO lets them run as sums (no loss, jitter or bandwidth schedule)."""
        plain = not (self.spec.loss or self.spec.jitter_us or self.capacity.active)
        return turns(idx, DEEP if plain else None)

    def _took(self, i: int, free: float, busy: np.ndarray, packets: np.ndarray) -> None:
        """Link i carried rows one after another: its free time, busy time (added row by row) and count."""
        self.free_us[i] = free
        self.busy_us[i] = np.add.accumulate(lead(self.busy_us[i], busy))[-1]
        self.counter[i] += int(packets.sum())

    def _check_chain(self, i: int, ready_us: np.ndarray, ser: np.ndarray) -> None:
        """``_check_order`` of one link's rows, in order."""
        last = np.maximum.accumulate(lead(self.last_ready[i], ready_us))
        early = ready_us < last[:-1] - ser - 1e-6
        if early.any():
            self.reordered += int(early.sum())
            self.reorder_error_us[i] = np.add.accumulate(lead(self.reorder_error_us[i],
                                                                  (last[:-1] - ready_us + ser)[early]))[-1]
        self.last_ready[i] = last[-1]

    def _segments_loss(self, i: np.ndarray, packets: np.ndarray, wire_bytes: np.ndarray
                       ) -> tuple[np.ndarray | float, np.ndarray | float]:
        """``_segment_loss`` of rows on distinct links (drawn one by one: a rare case's cost)."""
        if not self.spec.loss:
            return 0.0, 0.0
        got = [self._segment_loss(int(a), int(p), float(b)) for a, p, b in zip(i, packets, wire_bytes, strict=True)]
        return np.array([g[0] for g in got]), np.array([g[1] for g in got])

    def _segments_jitter(self, i: np.ndarray) -> np.ndarray | float:
        if not self.spec.jitter_us:
            return 0.0
        return uniform(self.seed, self.stream[i] * 2, self.counter[i]) * self.spec.jitter_us

    def _check_orders(self, i: np.ndarray, ready_us: np.ndarray, ser: np.ndarray) -> None:
        """``_check_order`` of rows on distinct links."""
        last = self.last_ready[i]
        early = ready_us < last - ser - 1e-6
        if early.any():
            self.reordered += int(early.sum())
            self.reorder_error_us[i[early]] += (last - ready_us + ser)[early]
        self.last_ready[i] = np.maximum(last, ready_us)

    def _segment_jitter(self, i: int) -> float:
        """A segment's jitter on this link (drawn as a packet's: keyed by the link and its count)."""
        if not self.spec.jitter_us:
            return 0.0
        return float(uniform(self.seed, self.stream[i:i + 1] * 2, self.counter[i:i + 1])[0]) * self.spec.jitter_us

    def receive_segment(self, i: int, first_us: float, last_us: float, wire_bytes: float,
                        packets: int) -> tuple[float, float]:
        """A segment reaches endpoint i: the downlink starts on its first packet and ends after its
        last. Returns its arrival and the bytes resent."""
        delay, extra = self._segment_loss(i, packets, wire_bytes)
        ser = float(self.spec.serialization_us(wire_bytes + extra))
        self._check_order(i, first_us, ser)
        cap = self.capacity
        if cap.active:
            done = float(cap.back(max(float(cap.to(max(first_us, self.free_us[i]))) + ser,
                                      float(cap.to(last_us)) + ser / packets)))
            busy = done - float(cap.back(float(cap.to(done)) - ser))
        else:  # the same arithmetic without the maps (identities)
            done = max(max(first_us, float(self.free_us[i])) + ser, last_us + ser / packets)
            busy = done - (done - ser)
        self.free_us[i] = done  # the link is free while the resent packets' timers run
        self.busy_us[i] += busy
        done += delay
        jitter = self._segment_jitter(i)
        self.counter[i] += packets
        return done + self.spec.latency_us + jitter, extra
