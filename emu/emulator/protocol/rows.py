"""Rows of arrays as a window's stages take them: gathered, checked and bounded.

A window's packets, segments and sums travel as columns (``emu.emulator.protocol.transport``'s
``AggBatch`` and ``SegmentRows``), a segment's values in one flat array with its rows' bounds.
These are the few operations every stage applies to such rows, in one place.
"""

from __future__ import annotations

import numpy as np


def indices(rows: np.ndarray) -> np.ndarray:
    """``rows`` as indices: a boolean mask's true places, or the indices as given."""
    rows = np.asarray(rows)
    return np.flatnonzero(rows) if rows.dtype == bool else rows


def rows_of(a: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
    """``a[rows]`` along the first axis (indices, a boolean mask or a slice), gathered by
    ``np.take``: measured on 6,576 rows, 2 times faster than indexing for rows of 64 int32, 12
    times for rows of two uint32 (indexing walks a row's columns one by one)."""
    return a[rows] if isinstance(rows, slice) else np.take(a, indices(rows), axis=0)


def one_value(a: np.ndarray) -> bool:
    """Whether every element of ``a`` (not empty) is its first (a window's rows of one collective,
    for one host: most often)."""
    return bool(a[0] == a[-1]) and bool((a == a[0]).all())


def distinct(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)``, without its sort where every element is the first (``one_value``): a
    window's rows of one collective, most often (a sort of 32,768 rows costs about 1 ms)."""
    return a[:1] if len(a) and one_value(a) else np.unique(a)


def every_row(rows: np.ndarray, n: int) -> bool:
    """Whether ``rows`` are all ``n`` rows in order (taking them is taking nothing new)."""
    return len(rows) == n and (n == 0 or bool((rows == np.arange(n)).all()))


def split_at(a: np.ndarray, cuts: np.ndarray) -> list[np.ndarray]:
    """``np.split(a, cuts)``: views of ``a`` between increasing ``cuts`` (5 times faster than
    ``np.split`` at 3 cuts, 4 times at 100: it goes through ``np.array_split``'s general path)."""
    edges = [0, *cuts.tolist(), len(a)]
    return [a[lo:hi] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def row_lengths(bounds: np.ndarray) -> np.ndarray:
    """Each row's elements from its bounds: ``np.diff(bounds)`` without its general path (about 4
    us a call; a ring's window asked it some ten times)."""
    return bounds[1:] - bounds[:-1]


def row_bounds(n: np.ndarray) -> np.ndarray:
    """Where each of rows of ``n`` elements begins in a flat array, and the end: int64, from 0."""
    out = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=out[1:])
    return out


def spans(bounds: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The positions ``bounds[r]`` to ``bounds[r + 1]`` of each of ``rows``, one after another (the
    elements of those rows of a flat array)."""
    lo = bounds[rows]
    return positions(lo, bounds[np.asarray(rows) + 1] - lo)


def positions(lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The positions ``lo[i]`` to ``lo[i] + n[i]`` of each i, one after another: a running sum of
    steps of 1, each row's first a jump from the last row's end to its ``lo`` (``np.repeat`` of a
    row's offset over its elements took 8 to 10 times as long at thousands of rows of a few
    elements, a parameter server's segments: 345 against 40 us at 5,000 rows of 6)."""
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    if not n.all():  # rows without elements have no position, and no jump of their own
        keep = n > 0
        lo, n = lo[keep], n[keep]
    step = np.ones(total, np.int64)
    step[0] = lo[0]
    step[np.cumsum(n[:-1])] = lo[1:] - (lo[:-1] + n[:-1]) + 1
    return np.cumsum(step, out=step)


_RUN_ELEMENTS = 1024  # elements a run of rows must average to be copied as a slice (a slice's Python costs about so many)


def gather(values: np.ndarray, bounds: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[spans(bounds, rows)]``, a new array (``gather_at``)."""
    rows = np.asarray(rows, np.int64)
    lo = bounds[rows]
    return gather_at(values, lo, bounds[rows + 1] - lo)


def gather_at(values: np.ndarray, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``values[positions(lo, n)]``, a new array: runs of rows that follow one another in ``values``
    as one slice each where they are long (a parameter server's answers of thousands of elements a
    row: an index a value cost 5 to 10 times a copy), by index where they are many and short."""
    if len(lo) == 0:
        return values[:0].copy()
    hi = lo + n
    breaks = np.flatnonzero(lo[1:] != hi[:-1]) + 1
    if not len(breaks):  # one run: one slice (never dearer than by index)
        return values[int(lo[0]):int(hi[-1])].copy()
    firsts = np.empty(len(breaks) + 1, np.int64)  # each run's first and last row (no np.r_: its cost)
    firsts[0] = 0
    firsts[1:] = breaks
    lasts = np.empty_like(firsts)
    lasts[:-1] = breaks - 1
    lasts[-1] = len(lo) - 1
    run_lo, run_hi = lo[firsts], hi[lasts]
    if int((run_hi - run_lo).sum()) < _RUN_ELEMENTS * len(run_lo):
        return values[positions(lo, n)]
    return np.concatenate([values[a:b] for a, b in zip(run_lo.tolist(), run_hi.tolist(), strict=True)])


_PACK_ROWS = 512  # rows from which lexsort packs its keys (measured: even at about 450)


def lexsort(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """``np.lexsort(keys)`` (the last key first), faster where the keys before the last are
    integers from 0 that fit in 63 bits together: packed into one (the first key lowest), two keys
    sorted instead of many (1.6 times faster at 1,000 rows of four such keys and a time, 3 times
    at 3,000; under ``_PACK_ROWS`` rows, packing costs more than it saves). A key's bits are those
    of the OR of its values: one pass that also finds a negative one."""
    *ints, last = keys
    if len(ints) < 2 or len(last) < _PACK_ROWS:
        return np.lexsort(keys)
    packed, shift = None, 0
    for k in ints:
        if k.dtype.kind not in "iu":
            return np.lexsort(keys)
        ored = int(np.bitwise_or.reduce(k))
        if ored < 0 or shift + ored.bit_length() > 63:
            return np.lexsort(keys)
        part = k.astype(np.int64) << shift
        packed = part if packed is None else np.bitwise_or(packed, part, out=packed)
        shift += ored.bit_length()
    return np.lexsort((packed, last))
