"""A parameter server's shards as one kernel (``ServerSums``): a window's pushes summed where they
go, in their order, each complete sum sent to every worker of its collective as ``Answers`` that
share its elements (docs/design-notes.md, "A parameter server's answers share their sum's
elements"). The workers' side is ``emu.emulator.algorithms.batched.ClientKernel``; the per-segment
algorithm is ``emu.emulator.algorithms.p2p.PSServer``, step for step the same sums
(tests/replay/test_batched.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emu.emulator.protocol.rows import gather_at, positions, row_bounds, row_lengths


@dataclass(frozen=True)
class Answers:
    """A parameter server's sums, each sent to every worker of its collective: per send the shard
    (``src``), the worker, the segment, the emulated bytes, the time, and where its sum's elements
    are in ``values`` (``values[lo[r]:lo[r] + n[r]]``). Every send of one sum points at the same
    elements, gathered once (a copy a worker took a parameter server's answers through every stage
    they waited in: at 512 workers, 12.6M elements a collective where 24,673 are distinct)."""

    src: np.ndarray
    dst: np.ndarray
    segment: np.ndarray
    emu_bytes: np.ndarray
    t: np.ndarray
    lo: np.ndarray
    n: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.dst)


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique`` of the rows of these non-negative int columns (axis 0: rows in lexicographic
    order, each's first index, each row's unique row), on one int64 key where the columns' ranges
    fit in one (a row-wise unique sorts a structured view, about 10 times slower)."""
    dims = tuple(int(c.max(initial=0)) + 1 for c in cols)
    if math.prod(dims) < 1 << 62:
        key = np.ravel_multi_index(cols, dims)
        _, first, which = np.unique(key, return_index=True, return_inverse=True)
        return np.stack([c[first] for c in cols], axis=1), first, which.reshape(-1)
    uniq, first, which = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    return uniq, first, which.reshape(-1)


class ServerSums:
    """``emu.emulator.algorithms.p2p.PSServer`` for every shard a host holds: each segment summed over
    the workers (of the job, or of a sub-group's collective) in the order the pushes arrived, then
    sent to each of them at the latest push's time. A sum waits as a row of columns (``_SumRows``),
    its elements in one flat array: a window's pushes are added where they go in one step."""

    def __init__(self, workers: int, groups: tuple[tuple[int, ...] | None, ...] = ()) -> None:
        self.workers, self.groups = workers, groups
        self.rows = _SumRows()
        self._everyone = np.arange(workers, dtype=np.int64)
        self._everyone.flags.writeable = False

    def _members(self, seq: int) -> np.ndarray:
        group = self.groups[seq % len(self.groups)] if self.groups else None
        if group is None:
            return self._everyone
        return np.asarray(group, np.int64)

    def arrive(self, shard: np.ndarray, seq: np.ndarray, segment: np.ndarray, emu_bytes: np.ndarray, t: np.ndarray,
               bounds: np.ndarray, values: np.ndarray) -> tuple[Answers, np.ndarray]:
        """Pushes, in their order: the sums they completed, sent to each worker (``Answers.src``: the
        shard), and for each send the push (its row) that completed its sum."""
        uniq, first, which = _unique_rows(shard, seq, segment)
        n = row_lengths(bounds)
        rows = self.rows
        at = rows.find(uniq, n[first], emu_bytes[first])
        # in arrival order, element by element: the same sums as one by one
        np.add.at(rows.sums, positions(rows.lo[at][which], n), values)
        rows.pushes[at] += np.bincount(which, minlength=len(uniq))
        latest = np.full(len(uniq), -np.inf)
        np.maximum.at(latest, which, t)
        rows.latest[at] = np.maximum(rows.latest[at], latest)
        seqs = uniq[:, 1]
        if self.groups:
            need = np.array([len(self._members(s)) for s in seqs.tolist()], np.int64)
        else:
            need = np.full(len(uniq), self.workers, np.int64)
        done = np.flatnonzero(rows.pushes[at] >= need)
        if not len(done):
            return _NO_ANSWERS, np.zeros(0, np.int64)
        last_row = np.zeros(len(uniq), np.int64)
        np.maximum.at(last_row, which, np.arange(len(which)))
        to = [self._members(s) for s in seqs[done].tolist()]
        c = np.array([len(m) for m in to], np.int64)
        r = at[done]
        out = row_bounds(rows.n[r])
        sums = gather_at(rows.sums, rows.lo[r], rows.n[r])  # each sum once, shared by its sends
        sends = Answers(np.repeat(uniq[done, 0], c), np.concatenate(to), np.repeat(uniq[done, 2], c),
                        np.repeat(rows.emu_bytes[r], c), np.repeat(rows.latest[r], c), np.repeat(out[:-1], c),
                        np.repeat(rows.n[r], c), sums)
        rows.free(uniq[done])
        return sends, np.repeat(last_row[done], c)


def _no_answers() -> Answers:
    ints, floats = np.zeros(0, np.int64), np.zeros(0)
    for a in (ints, floats):
        a.flags.writeable = False
    return Answers(ints, ints, ints, floats, floats, ints, ints, floats)


_NO_ANSWERS = _no_answers()


class _SumRows:
    """The sums that wait for pushes: per (shard, collective, segment) a row (``at``) of columns
    (where its elements are in ``sums``, how many, the pushes so far, the latest push's time, the
    emulated bytes of a push), its elements in ``sums``. Rows and elements are appended; when
    room runs out, the live ones move to the start and the arrays double as needed."""

    def __init__(self) -> None:
        self.at: dict[tuple[int, int, int], int] = {}
        self.lo, self.n, self.pushes = (np.zeros(64, np.int64) for _ in range(3))
        self.latest, self.emu_bytes = np.zeros(64), np.zeros(64)
        self.sums = np.zeros(1024)
        self.made = self.used = 0  # rows and elements made (live and freed)

    def find(self, keys: np.ndarray, n: np.ndarray, emu_bytes: np.ndarray) -> np.ndarray:
        """Each key's row (a new one, its sums 0, for a key not seen: ``n`` elements, ``emu_bytes``)."""
        tuples = list(map(tuple, keys.tolist()))
        at = np.array([self.at.get(k, -1) for k in tuples], np.int64)
        new = np.flatnonzero(at < 0)
        if len(new):
            self._add(keys[new], n[new], emu_bytes[new])  # which may move the rows there were
            at = np.array([self.at[k] for k in tuples], np.int64)
        return at

    def _add(self, keys: np.ndarray, n: np.ndarray, emu_bytes: np.ndarray) -> None:
        k, total = len(keys), int(n.sum())
        if self.used + total > len(self.sums) or self.made + k > len(self.lo):
            self._make_room(k, total)
        at = np.arange(self.made, self.made + k)
        self.lo[at] = self.used + np.cumsum(n) - n
        self.n[at], self.pushes[at], self.latest[at], self.emu_bytes[at] = n, 0, 0.0, emu_bytes
        self.sums[self.used:self.used + total] = 0.0
        self.made += k
        self.used += total
        for key, a in zip(map(tuple, keys.tolist()), at.tolist(), strict=True):
            self.at[key] = a

    def free(self, keys: np.ndarray) -> None:
        """The rows of these keys, done."""
        for key in map(tuple, keys.tolist()):
            del self.at[key]

    def _make_room(self, k: int, total: int) -> None:
        """Room for ``k`` more rows of ``total`` elements: the live rows moved to the start (their
        order kept), the arrays doubled where that is not enough."""
        live = np.array(sorted(self.at.values()), np.int64)
        n = self.n[live]
        keep = int(n.sum())
        size = max(len(self.lo), 2 * (len(live) + k), 64)
        cols = [np.zeros(size, c.dtype) for c in (self.lo, self.n, self.pushes, self.latest, self.emu_bytes)]
        for new, old in zip(cols, (self.lo, self.n, self.pushes, self.latest, self.emu_bytes), strict=True):
            new[:len(live)] = old[live]
        sums = np.zeros(max(len(self.sums), 2 * (keep + total), 1024))
        lo = np.cumsum(n) - n
        sums[:keep] = self.sums[positions(self.lo[live], n)]
        cols[0][:len(live)] = lo
        self.lo, self.n, self.pushes, self.latest, self.emu_bytes = cols
        self.sums = sums
        renumber = dict(zip(live.tolist(), range(len(live)), strict=True))
        self.at = {key: renumber[a] for key, a in self.at.items()}
        self.made, self.used = len(live), keep
