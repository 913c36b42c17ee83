"""One link's FIFO over many rows at once, for ``LinkArray.send_segments`` / ``receive_segments``
(docs/design-notes.md, "Hand-offs in batches"): rows grouped in turns, a link's rows as an exact
running sum, many links' running sums as one padded table. Every sum adds what the scalar
``LinkArray.send_segment`` / ``receive_segment`` add, in the same order, so every stamp is bit for
bit the same."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from emu.emulator.protocol.rows import positions, split_at

# Rows of one link in a batch past which they run as a link's running sum (``fifo``) rather than in
# turns: a turn is a few numpy steps over every link's k-th row, costly where one link has most rows.
DEEP = 8
RESTARTS = 16  # idle gaps a running sum restarts at, before the rest of the link's rows go one by one
# ... and in a table of links side by side (``pipelined_table``), where a round restarts every link
# still going at once: a reply's downlink at a worker of a large parameter server idles between
# most rows (the mlp on ps at 4,096 workers: 44,924 links a run past 16)
TABLE_RESTARTS = 256


def _places(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The rows sorted by ``idx`` (stable), where each value's rows begin in that order, and, unless
    every value is once, each row's value's number and the row's place among that value's rows."""
    n = len(idx)
    order = np.argsort(idx, kind="stable")
    new = firsts_of(idx[order])
    starts = np.flatnonzero(new)
    if len(starts) == n:
        return order, starts, None, None
    link = np.cumsum(new) - 1
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n) - starts[link]
    return order, starts, link, pos


def places(idx: np.ndarray) -> np.ndarray | None:
    """Each row's place among the rows of its value of ``idx``, in their order (0 for the first);
    None where every value is once (every place 0: most often, and then nothing to add)."""
    return _places(idx)[3]


def turns(idx: np.ndarray, deep: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows grouped by their place among their link's rows: the first row of every link, then the
    second of every link, ... (each group's rows on distinct links, in the order given); with
    ``deep``, the rows of each link with more than that many apart (each link's in order)."""
    n = len(idx)
    if n == 0:
        return [], []
    order, starts, link, pos = _places(idx)
    if link is None or pos is None:  # one row a link: one step
        return [np.arange(n)], []
    counts = lasts_of(starts, n) - starts + 1
    deep_rows: list[np.ndarray] = []
    if deep is not None and counts.max() > deep:
        many = counts > deep
        deep_rows = [order[a:a + c] for a, c in zip(starts[many].tolist(), counts[many].tolist(), strict=True)]
        keep = np.empty(n, bool)
        keep[order] = ~many[link]
        rest = np.flatnonzero(keep)
        if not len(rest):
            return [], deep_rows
        by_pos = rest[np.argsort(pos[rest], kind="stable")]
    else:
        by_pos = np.argsort(pos, kind="stable")
    ranked = pos[by_pos]
    return split_at(by_pos, np.flatnonzero(ranked[1:] != ranked[:-1]) + 1), deep_rows


DEEP_CELLS = 1 << 20  # cells of one table of deep links at most (``parts``): its memory bounded
# a table's links hold at most LIKE times the rows of its shortest: every link pads to the longest,
# and a table costs its cells at each of its restarts (``pipelined_table``), so one link of a
# parameter-server shard's many pushes made its table's short links pay its length (2026-12-06:
# the mlp on ps at 1,024 workers in one process, 4.7 to 4.2 s a run, with its shards on one host)
LIKE = 2


def side_by_side(deep: list[np.ndarray], table: Callable[[list[np.ndarray]], list[np.ndarray]]) -> list[np.ndarray]:
    """The deep links through ``table`` (their running sums side by side, ``DeepTable``) in groups of
    bounded memory (``parts``); returns the links left for one by one (a group of one link is)."""
    return [r for part in parts(deep) for r in (part if len(part) < 2 else table(part))]


def parts(deep: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Deep links in groups whose table (links by the longest link's rows) holds at most
    ``DEEP_CELLS`` cells, links of like length together (at most ``LIKE`` times the shortest's
    rows); a link longer than that alone."""
    parts: list[list[np.ndarray]] = [[]]
    for rows in sorted(deep, key=len):
        if parts[-1] and ((len(parts[-1]) + 1) * len(rows) > DEEP_CELLS or len(rows) > LIKE * len(parts[-1][0])):
            parts.append([])
        parts[-1].append(rows)
    return parts


class DeepTable:
    """The rows of deep links (each link's in its FIFO order) as a table padded on the right, a link
    a row: ``np.add.accumulate`` along a table row adds as along that link's 1-D array, so a link's
    running sum is the one ``fifo`` makes, for many links in one step."""

    def __init__(self, idx: np.ndarray, deep: list[np.ndarray]) -> None:
        self.counts = np.array([len(r) for r in deep], np.int64)
        self.rows = np.concatenate(deep)
        self.starts = np.zeros(len(deep), np.int64)
        np.cumsum(self.counts[:-1], out=self.starts[1:])
        self.link = np.repeat(np.arange(len(deep)), self.counts)  # each row's table row
        self.col = positions(np.zeros(len(deep), np.int64), self.counts)  # each row's place in its link's
        self.links = idx[self.rows[self.starts]]
        self.valid = np.zeros((len(deep), int(self.counts.max())), bool)
        self.valid[self.link, self.col] = True

    def table(self, flat: np.ndarray, fill: float) -> np.ndarray:
        out = np.full(self.valid.shape, fill)
        out[self.link, self.col] = flat
        return out

    def flat(self, table: np.ndarray) -> np.ndarray:
        return table[self.link, self.col]

    def chain(self, last_ready: np.ndarray, ready: np.ndarray, ser: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``LinkArray._check_chain`` per link: whether some row came early (that link goes one by
        one, which counts it), and the link's latest ready time."""
        last = np.maximum.accumulate(np.concatenate([last_ready[:, None], ready], axis=1), axis=1)
        early = ((ready < last[:, :-1] - ser - 1e-6) & self.valid).any(axis=1)
        return early, last[:, -1]


def pipelined_table(first: np.ndarray, ser: np.ndarray, tail: np.ndarray, valid: np.ndarray,
                    free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``fifo_pipelined`` for the links of a ``DeepTable`` side by side (a link a row): each link's
    running sum restarts where a row finds the link idle, all links' restarts in one step, the same
    additions in the same order as ``fifo_pipelined``'s. Returns the ends and, per link, whether it
    took at most ``TABLE_RESTARTS`` restarts (the others are left for ``fifo_pipelined``)."""
    links, width = ser.shape
    done = np.empty_like(ser)
    start = np.zeros(links, np.int64)  # per link, the column its current running sum starts at
    prev = np.asarray(free, np.float64).copy()
    col = np.arange(width)
    active = np.arange(links)
    for _ in range(TABLE_RESTARTS + 1):
        s, a = start[active], np.arange(len(active))
        head = np.maximum(np.maximum(first[active, s], prev[active]) + ser[active, s], tail[active, s])
        inc = np.where(col >= s[:, None], ser[active], 0.0)  # zeros before the start add nothing
        inc[a, s] = head
        acc = np.add.accumulate(inc, axis=1)
        bad = (((first[active, 1:] > acc[:, :-1]) | (tail[active, 1:] > acc[:, 1:])) & valid[active, 1:]
               & (col[1:] > s[:, None]))
        stop = np.where(bad.any(axis=1), bad.argmax(axis=1) + 1, width) if width > 1 else np.full(len(a), width)
        take = (col >= s[:, None]) & (col < stop[:, None])
        done[active] = np.where(take, acc, done[active])
        again = stop < width
        prev[active[again]] = acc[again, stop[again] - 1]
        start[active[again]] = stop[again]
        active = active[again]
        if not len(active):
            break
    ok = np.ones(links, bool)
    ok[active] = False
    return done, ok


def firsts_of(e: np.ndarray) -> np.ndarray:
    """Per row of ``e`` (grouped by link), whether it is its link's first: ``np.r_[True, e[1:] !=
    e[:-1]]`` without ``np.r_``'s indexing cost (a window's batches paid it many times)."""
    new = np.empty(len(e), bool)
    if len(e):
        new[0] = True
        np.not_equal(e[1:], e[:-1], out=new[1:])
    return new


def lasts_of(starts: np.ndarray, n: int) -> np.ndarray:
    """Each run's last row, the runs starting at ``starts`` of ``n`` rows: ``np.r_[starts[1:] - 1,
    n - 1]``."""
    out = np.empty(len(starts), np.int64)
    if len(starts):
        out[:-1] = starts[1:] - 1
        out[-1] = n - 1
    return out


def lead(first: float, rest: np.ndarray) -> np.ndarray:
    """``first`` then ``rest`` as one float64 array (``np.r_[first, rest]`` without its indexing cost,
    which a link's every batch paid several times)."""
    out = np.empty(len(rest) + 1)
    out[0] = first
    out[1:] = rest
    return out


def fifo(ready: np.ndarray, ser: np.ndarray, free: float) -> np.ndarray:
    """One link's FIFO, ``end_i = max(ready_i, end_(i-1)) + ser_i`` from ``end_(-1) = free``, with the
    same additions as row by row: a running sum (``np.add.accumulate``, left to right) from each
    row that found the link idle."""
    n = len(ready)
    end = np.empty(n)
    p, prev, restarts = 0, free, 0
    while p < n:
        if restarts == RESTARTS:
            for j in range(p, n):
                prev = end[j] = max(float(ready[j]), prev) + float(ser[j])
            return end
        acc = np.add.accumulate(lead(max(float(ready[p]), prev), ser[p:]))[1:]
        gap = np.flatnonzero(ready[p + 1:] > acc[:-1])
        stop = n if not len(gap) else p + 1 + int(gap[0])
        end[p:stop] = acc[:stop - p]
        prev, p = float(end[stop - 1]), stop
        restarts += 1
    return end


def fifo_pipelined(first: np.ndarray, tail: np.ndarray, ser: np.ndarray, free: float) -> np.ndarray:
    """A downlink's FIFO, ``done_i = max(max(first_i, done_(i-1)) + ser_i, tail_i)`` (``tail``: the last
    packet's arrival plus its own serialization), row by row's additions, as ``fifo``."""
    n = len(first)
    done = np.empty(n)
    p, prev, restarts = 0, free, 0
    while p < n:
        if restarts == RESTARTS:
            for j in range(p, n):
                prev = done[j] = max(max(float(first[j]), prev) + float(ser[j]), float(tail[j]))
            return done
        acc = np.add.accumulate(lead(max(max(float(first[p]), prev) + float(ser[p]), float(tail[p])), ser[p + 1:]))
        bad = np.flatnonzero((first[p + 1:] > acc[:-1]) | (tail[p + 1:] > acc[1:]))
        stop = n if not len(bad) else p + 1 + int(bad[0])
        done[p:stop] = acc[:stop - p]
        prev, p = float(done[stop - 1]), stop
        restarts += 1
    return done
