"""Downlinks side by side: ``pipelined_table`` restarts every link's running sum where a row finds
the link idle, with the same additions as ``fifo_pipelined`` one link at a time, bit for bit."""

from __future__ import annotations

import numpy as np

from emu.emulator.links.fifo import DEEP_CELLS, LIKE, TABLE_RESTARTS, fifo_pipelined, parts, pipelined_table


def _table(rng: np.random.Generator, links: int, width: int, gaps: float):
    counts = rng.integers(1, width + 1, links)
    first = np.full((links, width), -np.inf)
    ser = np.zeros((links, width))
    tail = np.full((links, width), -np.inf)
    valid = np.zeros((links, width), bool)
    for k, n in enumerate(counts.tolist()):
        f = np.maximum.accumulate(np.sort(rng.uniform(0, gaps, n)) * rng.integers(0, 2, n))
        s = rng.choice([0.1, 1.3, 7.7, 30.0], n)
        first[k, :n], ser[k, :n], tail[k, :n], valid[k, :n] = f, s, f + s * rng.uniform(0, 2, n), True
    return counts, first, ser, tail, valid, rng.uniform(0, 50, links)


def test_a_table_of_links_ends_each_row_as_one_link_alone() -> None:
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(200):
        counts, first, ser, tail, valid, free = _table(rng, int(rng.integers(1, 12)), int(rng.integers(1, 60)),
                                                       float(rng.choice([40.0, 400.0, 4000.0])))
        done, ok = pipelined_table(first, ser, tail, valid, free)
        for k, n in enumerate(counts.tolist()):
            if ok[k]:
                checked += 1
                want = fifo_pipelined(first[k, :n], tail[k, :n], ser[k, :n], float(free[k]))
                assert np.array_equal(done[k, :n], want)
    assert checked > 1000


def test_a_link_past_the_restarts_is_left_for_one_by_one() -> None:
    """A link idle before each of its rows restarts once a row: past ``TABLE_RESTARTS`` it is left."""
    n = TABLE_RESTARTS + 3
    first = np.arange(n, dtype=float)[None, :] * 100.0
    ser = np.ones((1, n))
    done, ok = pipelined_table(first, ser, first + 1.0, np.ones((1, n), bool), np.zeros(1))
    assert not ok[0]
    short = pipelined_table(first[:, :8], ser[:, :8], first[:, :8] + 1.0, np.ones((1, 8), bool), np.zeros(1))
    assert short[1][0] and np.array_equal(short[0][0], first[0, :8] + 1.0)


def test_links_of_like_length_share_a_table() -> None:
    """Every link once, in tables of links at most ``LIKE`` times their shortest's rows (each pads
    to its longest) and at most ``DEEP_CELLS`` cells, but for a link longer than that alone: a
    parameter-server shard's link of many pushes no longer pads a thousand short ones."""
    rng = np.random.default_rng(5)
    deep = [np.arange(int(n)) for n in rng.integers(17, 3000, 1000)] + [np.arange(DEEP_CELLS + 1)]
    groups = parts(deep)
    assert sorted(len(r) for g in groups for r in g) == sorted(len(r) for r in deep)
    for g in groups:
        lengths = [len(r) for r in g]
        assert max(lengths) <= LIKE * min(lengths)
        assert len(g) * max(lengths) <= DEEP_CELLS or len(g) == 1
    assert 1 < len(groups) < 20
