"""The workers' INA state machine against the switch, without processes: exactness, loss, units."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.protocol import fixedpoint
from emu.emulator.protocol.ina import InaGroup, InaParams
from emu.traces.model import Sparsity


def run(workers: int, slots: int, k: int, sizes: list[int], dtype: str = "float32", loss: float = 0.0,
        seed: int = 0):
    """Dense collectives of ``sizes`` through the group and the switch (tests/emulator/test_sparse_ina.py)."""
    from tests.emulator.test_sparse_ina import run as stream

    g, check, stats, _ = stream(workers, slots, k, [(n, None) for n in sizes], dtype, loss, seed, sparse_stream=False)
    return g.colls, check, stats


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_exact_sums_across_collectives(dtype: str) -> None:
    colls, check, stats = run(5, 8, 64, [1000, 64, 5, 3000], dtype)
    assert all(c.finished.all() for c in colls)
    assert check.mismatches == 0 and check.elements == 5 * (1000 + 64 + 5 + 3000)  # every worker's copy
    assert stats.duplicates == 0


def test_exact_under_ten_percent_loss() -> None:
    colls, check, stats = run(4, 4, 256, [5000], loss=0.10, seed=3)
    assert colls[0].finished.all()
    assert check.mismatches == 0 and check.elements >= 5000
    assert stats.duplicates > 0 and stats.answered > 0


def test_unit_path_equals_float_fixed_point() -> None:
    """The integer shortcut the workers take is fixedpoint.quantize of the float values, exactly."""
    p = InaParams(slots=4, elements=64, workers=7, job=0, seed=1)
    g = InaGroup(np.arange(7), p)
    c = g.collective(0, "float32", 1000, 16)
    c.agreed[:] = 3
    li, blocks = np.repeat(np.arange(7), 3), np.tile(np.array([0, 5, 15]), 7)
    values = g.values(c, li, blocks)
    assert np.array_equal(g.exponents(c, li, blocks), fixedpoint.block_exponents(values))
    c.agreed[blocks] = g.exponents(c, li, blocks).reshape(7, 3).max(axis=0)[np.tile(np.arange(3), 7)]
    assert np.array_equal(g.quantized(c, li, blocks), fixedpoint.quantize(values, c.agreed[blocks], 7))


@pytest.mark.parametrize("lookup", [True, False])
@pytest.mark.parametrize("workers, sparse", [(1, False), (3, False), (7, False), (300, False), (5000, False),
                                             (7, True), (300, True)])
def test_units_match_every_element_against_its_owner(workers: int, sparse: bool, lookup: bool) -> None:
    """A row adds its worker's own elements where the block's owner is its rank: found by matching
    owners against sorted rows (``StreamData._owned``) or by comparing (``_lookup`` picks), the
    same units, peaks and exponents as comparing every element of every row, on blocks with
    padding, rows repeated and out of order, ranks that own nothing, and sparse blocks. Pools of
    fewer workers than half a row (1, 3, 7 here) take their dense peaks per block and owner
    (``StreamData._peaks_by_owner``): the same peaks."""
    p = InaParams(slots=4, elements=64, workers=workers, job=0, seed=2)
    g = InaGroup(np.arange(min(workers, 50)), p)
    g._lookup = lambda rows: lookup  # both ways, whatever the sizes
    c = g.collective(0, "float32", 1000, 16, Sparsity(64, 0.3, 0.6) if sparse else None)
    rng = np.random.default_rng(workers)
    ranks = rng.integers(0, workers, 400)
    blocks = rng.integers(0, 16, 400)  # block 15 holds 40 real elements and 24 of padding
    units, beta = g.units_of(c, ranks, blocks)
    k = p.elements
    owner = np.stack([np.r_[g.cache.span(c, b * k, min((b + 1) * k, 1000), "owner"),
                            np.full(max(0, (b + 1) * k - 1000), -1, np.int32)] for b in blocks])
    common = np.stack([np.r_[g.cache.span(c, b * k, min((b + 1) * k, 1000), "common"),
                             np.zeros(max(0, (b + 1) * k - 1000), np.int32)] for b in blocks])
    own = np.stack([np.r_[g.cache.span(c, b * k, min((b + 1) * k, 1000), "own"),
                          np.zeros(max(0, (b + 1) * k - 1000), np.int32)] for b in blocks])
    want = common + np.where(owner == ranks[:, None], own, 0)
    # sparse: zero outside the blocks a worker holds
    assert np.array_equal(units, want) if not sparse else ((units == want) | (units == 0)).all()
    assert (owner == ranks[:, None]).any() or workers > 1000  # some rows hold their own
    peak, peak_beta = g._peaks(c, ranks, blocks)
    assert np.array_equal(peak, np.abs(units).max(axis=1).astype(np.int64)) and np.array_equal(peak_beta, beta)


def test_waiting_workers_follow_every_slot_sent_and_back() -> None:
    """``InaGroup.waiting`` (asked by the clock several times a window, kept until a slot's state
    changes) is, after every step of a lossy stream, the workers with a slot sent and not back."""
    from emu.emulator.protocol.ina import SENT, ResultCheck
    from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch

    workers, slots, k = 4, 4, 64
    g = InaGroup(np.arange(workers), InaParams(slots=slots, elements=k, workers=workers, job=0, seed=5))
    g.collective(0, "float32", 3000, -(-3000 // k)).start_us[:] = 0.0
    sw, check, rng, retx = AggregationSwitch(slots, workers, k), ResultCheck(), np.random.default_rng(5), []
    seen = set()
    for _ in range(10_000):
        assert np.array_equal(g.waiting(), (g.slot_state == SENT).any(axis=1))
        seen.add(tuple(g.waiting().tolist()))
        pk = g.next_packets(retx)
        if pk is None:
            break
        assert np.array_equal(g.waiting(), (g.slot_state == SENT).any(axis=1))
        lost = rng.random(len(pk.local)) < 0.2
        retx = [(int(w), int(s), 0.0, 1.0) for w, s in zip(pk.local[lost], pk.headers["slot"][lost], strict=True)]
        res = sw.process(pk.headers[~lost], pk.payload[~lost], sparse=pk.sparse[~lost])
        dest = res.headers["worker"].astype(int)
        pairs = [(w, i) for i, d in enumerate(dest) for w in (range(workers) if d == MULTICAST else [d])]
        li, rb = np.array([w for w, _ in pairs], int), np.array([i for _, i in pairs], int)
        back = rng.random(len(li)) < 0.8  # the rest lost on the way down: their slots stay sent, resent
        retx += [(int(w), int(res.headers["slot"][i]), 0.0, 1.0) for w, i in zip(li[~back], rb[~back], strict=True)]
        g.on_results(li[back], rb[back], res.headers, res.payload, np.ones(back.sum()), None,
                     np.full(len(res.headers), -1), check, res.sparse)
    assert g.colls[0].finished.all() and check.mismatches == 0
    assert len(seen) > 2  # some workers waited while others did not
