"""The sparse payload (docs/sparse.md): zero outside the blocks a worker holds, holders counted in
O(1) per block yet equal to a brute-force count, and a closed-form sum equal to the explicit one."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from emu.emulator.payload.generated import (
    STRATUM_BLOCKS,
    block,
    hold_probability,
    holding,
    in_union,
    is_sparse,
    realized,
)
from emu.emulator.protocol.ina import InaGroup, InaParams, ResultCheck
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from emu.traces.model import Sparsity

FLOATS = ["float32", "float16", "bfloat16", "float64"]


def test_dense_payload_is_what_it_was() -> None:
    """No sparsity (or an integer dtype): bit for bit the payload before sparsity existed (the digest
    was taken from that code)."""
    h = hashlib.sha256()
    for dt in ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool"):
        b = block(7, 3, 1000, 5000, 5, dt)
        assert b.holders is None
        for a in (b.owner, b.common, b.own, b.beta, b.scale):
            h.update(np.ascontiguousarray(a).tobytes())
    assert h.hexdigest()[:16] == "560450df36a81143"
    dense, ints = block(7, 3, 0, 999, 4, "int32"), block(7, 3, 0, 999, 4, "int32", Sparsity(256, 0.1, 0.3))
    assert ints.holders is None and np.array_equal(dense.own, ints.own) and np.array_equal(dense.owner, ints.owner)
    assert not is_sparse(Sparsity(256, 0.1, 0.3), "int64") and is_sparse(Sparsity(256, 0.1, 0.3), "float16")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k", [1, 100, 256, 300])
def test_closed_form_is_the_explicit_sum(dtype: str, workers: int, k: int) -> None:
    """Blocks of any size (not a multiple of the packet's 64 or 256, nor of the exponents' 256),
    from an unaligned start."""
    sp = Sparsity(block_elements=k, nonzero=0.2, union=0.5)
    b = block(11, 4, 777, 6000, workers, dtype, sp)
    explicit = sum(b.values(w) for w in range(workers))
    assert np.array_equal(explicit, b.expected_sum(workers))
    assert np.array_equal(sum(b.units(w).astype(np.int64) for w in range(workers)), b.sum_units(workers))


@pytest.mark.parametrize("workers", [1, 2, 7, 64, 255, 256])
def test_holders_equal_a_brute_force_count(workers: int) -> None:
    sp = Sparsity(block_elements=256, nonzero=0.3, union=0.6)
    blocks = np.arange(5000, 6000)
    hold = holding(3, 9, blocks, workers, sp)
    brute = sum(hold.held(w).astype(np.int64) for w in range(workers))
    assert np.array_equal(brute, hold.holders)
    union = hold.holders > 0
    assert np.array_equal(union, in_union(3, 9, blocks, sp.union))
    assert hold.held(hold.worker_at(np.zeros(len(blocks), np.int64)))[union].all()  # the anchor holds its block
    # per element, the same holders (and the owner is one of them)
    b = block(3, 9, 5000 * 256, 1000 * 256, workers, "float32", sp)
    assert np.array_equal(b.holders, np.repeat(hold.holders, 256))
    brute_elements = sum(b.held(w).astype(np.int64) for w in range(workers))
    assert np.array_equal(brute_elements, b.holders)
    owner_holds = np.zeros(len(b.owner), bool)
    for w in range(workers):
        owner_holds |= (b.owner == w) & b.held(w)
    assert np.array_equal(owner_holds, b.holders > 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_blocks_not_held_are_zero_and_held_ones_are_not(dtype: str) -> None:
    k, workers = 128, 6
    sp = Sparsity(block_elements=k, nonzero=0.15, union=0.4)
    b = block(5, 2, 0, 300 * k, workers, dtype, sp)
    for w in range(workers):
        x = b.values(w).reshape(-1, k)
        held = b.held(w).reshape(-1, k)[:, 0]
        assert not x[~held].any()  # exactly zero
        # a holder owns elements of its block (owners go round robin over the holders), never zero
        assert (np.abs(x[held]).max(axis=1) > 0).all()


def test_any_range_is_the_same_payload() -> None:
    """Made on demand: a range cut anywhere holds what the whole tensor holds there."""
    sp = Sparsity(block_elements=300, nonzero=0.1, union=0.3)
    whole = block(1, 1, 0, 20_000, 9, "float32", sp)
    for lo, hi in ((0, 1), (299, 301), (4_321, 17_000), (19_999, 20_000)):
        part = block(1, 1, lo, hi - lo, 9, "float32", sp)
        for w in (0, 4, 8):
            assert np.array_equal(part.values(w), whole.values(w)[lo:hi])
        assert np.array_equal(part.expected_sum(9), whole.expected_sum(9)[lo:hi])


@pytest.mark.parametrize(("workers", "f", "u"), [(4, 0.1, 0.3), (8, 0.1, 1 - 0.9**8), (64, 0.01, 0.2),
                                                 (1000, 0.05, 0.9), (65535, 0.1, 0.3), (4, 0.3, 0.3),
                                                 (4, 1.0, 1.0), (16, 0.01, 0.5)])
def test_realized_fractions_follow_the_asked_ones(workers: int, f: float, u: float) -> None:
    sp = Sparsity(block_elements=256, nonzero=f, union=u)
    r = realized(0, 12, 4_000_000, workers, sp)
    assert r.blocks == -(-4_000_000 // 256)
    assert r.union / r.blocks == pytest.approx(u, abs=0.01)
    want = max(f, u / workers)  # below u/M the union cannot be reached: every worker holds u/M
    assert r.held / r.blocks / workers == pytest.approx(want, rel=0.03, abs=0.002)


def test_union_per_stratum_is_exact_on_few_blocks() -> None:
    """With payload scale a collective has few real blocks: each stratum of 64 holds 64u rounded."""
    for u in (0.05, 0.3, 0.77):
        for seq in range(20):
            got = in_union(2, seq, np.arange(STRATUM_BLOCKS), u).sum()
            assert got in (int(np.floor(STRATUM_BLOCKS * u)), int(np.ceil(STRATUM_BLOCKS * u)))


def test_other_workers_hold_with_probability_p() -> None:
    workers, sp = 10, Sparsity(block_elements=256, nonzero=0.2, union=0.5)
    p = hold_probability(sp, workers)
    assert p == pytest.approx((0.2 / 0.5 - 0.1) / 0.9)
    hold = holding(0, 1, np.arange(200_000), workers, sp)
    union = hold.holders > 0
    anchor = hold.worker_at(np.zeros(len(union), np.int64))
    for w in (0, 3, 9):
        others = union & (anchor != w)
        assert hold.held(w)[others].mean() == pytest.approx(p, abs=0.01)
    assert hold_probability(Sparsity(256, 0.01, 0.5), 4) == 0.0  # f < u/M: only the anchors
    assert hold_probability(Sparsity(256, 0.5, 0.5), 4) == 1.0
    assert hold_probability(Sparsity(256, 0.0, 0.0), 4) == 1.0  # no union: nothing to hold


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("k", [64, 256])
def test_ina_stream_sums_sparse_collectives_exactly(dtype: str, k: int) -> None:
    """The workers' INA state machine and the switch: every element of a sparse collective (one of
    blocks of 100, one of 1000) and a dense one between them sums exactly."""
    workers, slots = 5, 8
    g = InaGroup(np.arange(workers), InaParams(slots=slots, elements=k, workers=workers, job=0, seed=4))
    sw = AggregationSwitch(slots, workers, k)
    plans = [(3000, Sparsity(100, 0.1, 0.3)), (1000, None), (5000, Sparsity(1000, 0.3, 0.5))]
    for seq, (n, sp) in enumerate(plans):
        g.collective(seq, dtype, n, -(-n // k), sp).start_us[:] = 0.0
    check = ResultCheck()
    for _ in range(10_000):
        pk = g.next_packets()
        if pk is None:
            break
        res = sw.process(pk.headers, pk.payload)
        dest = res.headers["worker"].astype(int)
        pairs = [(w, i) for i, d in enumerate(dest) for w in (range(workers) if d == MULTICAST else [d])]
        li, rb = np.array([w for w, _ in pairs], int), np.array([i for _, i in pairs], int)
        g.on_results(li, rb, res.headers, res.payload, np.ones(len(li)), None, np.full(len(res.headers), -1), check)
    assert all(c.finished.all() for c in g.colls)
    assert check.mismatches == 0 and check.elements == workers * sum(n for n, _ in plans)
    assert [c.sparsity is not None for c in g.colls] == [True, False, True]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("m, f, u, k, n", [(4, 0.1, 0.3, 256, 5000), (2048, 0.1, 0.3, 256, 20000),
                                           (8, 0.5, 0.6, 2, 3000), (300, 0.2, 0.2, 1, 2000),
                                           (5, 0.1, 0.4, 300, 7777)])
def test_realized_counts_exactly_the_blocks_that_are_non_zero(dtype: str, m: int, f: float, u: float, k: int,
                                                              n: int) -> None:
    """What the report calls non-zero is what the workers' values hold, block by block (16-bit
    types: a block of L elements is non-zero on at most L of its holders)."""
    from emu.emulator.payload.generated import block, realized
    from emu.traces.model import Sparsity

    sp = Sparsity(k, f, u)
    b = block(7, 3, 0, n, m, dtype, sp)
    blocks = -(-n // k)
    nonzero = 0
    for w in range(m):
        padded = np.zeros(blocks * k)
        padded[:n] = b.values(w)
        nonzero += int((padded.reshape(blocks, k) != 0).any(axis=1).sum())
    assert realized(7, 3, n, m, sp, dtype).held == nonzero
