"""The GRACE compressors: true packed sizes, what each keeps, unbiasedness, votes, error feedback."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.compression.compressors import (
    COMPRESSORS,
    Aggregation,
    ErrorFeedback,
    PowerSgd,
    aggregate,
    index_bits,
    pack_bits,
    parse_compress,
    unpack_bits,
)
from emu.errors import ConfigError

N = 100_003  # not a multiple of 8: the packed tails count


def grad(seed: int = 0, n: int = N) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * np.exp2(-8)).astype(np.float32)


@pytest.mark.parametrize("bits", [1, 2, 7, 9, 17, 33])
def test_packing_round_trips(bits: int) -> None:
    v = np.random.default_rng(bits).integers(0, 2**bits, 1001, dtype=np.uint64)
    packed = pack_bits(v, bits)
    assert len(packed) == -(-1001 * bits // 8)
    assert np.array_equal(unpack_bits(packed, bits, 1001), v)


@pytest.mark.parametrize("name", [n for n in COMPRESSORS if n != "powersgd"])
def test_the_bytes_are_the_packed_size(name: str) -> None:
    comp = parse_compress(name)
    x = grad()
    data = comp.compress(x, seed=3)
    back = comp.decompress(data, N, seed=3)
    assert data.dtype == np.uint8 and back.shape == (N,) and back.dtype == np.float32
    if name == "dgc":  # the count varies with the sample: within a few percent of the ratio's
        assert len(data) == pytest.approx(comp.wire_bytes(N), rel=0.2)
    else:
        assert len(data) == comp.wire_bytes(N)


def test_sizes_are_what_the_formats_need() -> None:
    k = 1001  # ceil(0.01 N)
    assert parse_compress("topk:0.01").wire_bytes(N) == 4 * k + -(-k * 17 // 8)  # 17-bit indices
    assert index_bits(N) == 17 and index_bits(2) == 1
    assert parse_compress("randomk:0.01").wire_bytes(N) == 4 * k  # shared indices: values only
    assert parse_compress("fp16").wire_bytes(N) == 2 * N
    assert parse_compress("signsgd").wire_bytes(N) == -(-N // 8)
    assert parse_compress("efsignsgd").wire_bytes(N) == 4 + -(-N // 8)
    assert parse_compress("onebit").wire_bytes(N) == 8 + -(-N // 8)
    assert parse_compress("terngrad").wire_bytes(N) == 4 + -(-2 * N // 8)
    assert parse_compress("qsgd:64").wire_bytes(N) == 4 + -(-8 * N // 8)  # sign + 7 bits for 0..64
    assert parse_compress("natural").wire_bytes(N) == -(-9 * N // 8)
    # top-k at 1% cuts the bytes 10x and more: 4 + 17/8 bytes for 1% of the elements
    assert 4 * N / parse_compress("topk:0.01").wire_bytes(N) > 10


def test_topk_keeps_the_largest_and_randomk_shares_its_indices() -> None:
    x = grad()
    back = parse_compress("topk:0.01").decompress(parse_compress("topk:0.01").compress(x, 0), N, 0)
    kept = np.flatnonzero(back)
    assert len(kept) == 1001 and np.array_equal(back[kept], x[kept])
    assert np.abs(x[kept]).min() >= np.sort(np.abs(x))[-1001]
    rk = parse_compress("randomk:0.01")
    a, b = (rk.decompress(rk.compress(grad(s), 7), N, 7) for s in (1, 2))
    assert np.array_equal(np.flatnonzero(a), np.flatnonzero(b))  # the same indices on every worker


@pytest.mark.parametrize("name", ["qsgd", "terngrad", "natural"])
def test_stochastic_rounding_is_unbiased(name: str) -> None:
    comp = parse_compress(name)
    x = grad(n=2000)
    mean = np.mean([comp.decompress(comp.compress(x, s), 2000, s) for s in range(400)], axis=0)
    scale = np.abs(x).max()
    assert np.abs(mean - x).max() < 0.2 * scale
    assert abs(float(np.mean(mean - x))) < 0.01 * scale


def test_signsgd_votes_and_efsignsgd_sums() -> None:
    grads = [np.array([1.0, -1.0, 2.0, -3.0], np.float32), np.array([1.0, 1.0, -2.0, -3.0], np.float32),
             np.array([-1.0, 1.0, -2.0, -3.0], np.float32)]
    assert aggregate(parse_compress("signsgd"), grads, 0).tolist() == [1.0, 1.0, -1.0, -1.0]
    ef = aggregate(parse_compress("efsignsgd"), grads, 0)
    assert ef.tolist() == [1.75, 1.75, -1.75, -5.25]  # each scaled by its mean magnitude, 1.75


def test_error_feedback_carries_what_was_dropped() -> None:
    comp = parse_compress("topk:0.01")
    ef = ErrorFeedback(comp)
    x = grad()
    _, first = ef.step(0, 0, x, 0)
    residual = ef.residual[(0, 0)]
    assert np.allclose(first + residual, x)  # nothing lost, only postponed
    _, second = ef.step(0, 0, x, 0)
    assert np.flatnonzero(second).tolist() != np.flatnonzero(first).tolist()  # the residual changes the pick
    plain = ErrorFeedback(parse_compress("qsgd"))
    plain.step(0, 0, x, 0)
    assert not plain.residual  # unbiased compressors keep no memory


def test_powersgd_needs_shapes_and_recovers_a_low_rank_sum() -> None:
    comp = PowerSgd(param=1, shapes=((64, 32), (32,)))
    assert comp.aggregation == Aggregation.ALL_REDUCE
    assert comp.sizes(64 * 32 + 32) == (64 + 32, 32) and comp.wire_bytes(64 * 32 + 32) == 4 * 128
    u, v = np.random.default_rng(0).standard_normal((2, 64)), np.random.default_rng(1).standard_normal(32)
    grads = [np.concatenate([(c * np.outer(u[0], v)).ravel(), np.full(32, c)]).astype(np.float32) for c in (1, 2)]
    got = aggregate(comp, grads, seed=5)
    assert np.allclose(got, grads[0] + grads[1], atol=1e-4)  # rank one: exact
    with pytest.raises(ConfigError, match="needs the bucket's parameter shapes"):
        PowerSgd(param=1).wire_bytes(10)
    with pytest.raises(ConfigError, match="hold 2080 elements, not its 10"):
        comp.wire_bytes(10)


@pytest.mark.parametrize(("text", "words"), [
    ("topk:0", "ratio must be in (0, 1]"), ("topk:2", "ratio must be in (0, 1]"), ("qsgd:1.5", "integer"),
    ("tpk", "did you mean topk"), ("fp16:3", "takes no parameter"), ("topk:x", "not a number"),
    ("powersgd:0", "rank must be")])
def test_bad_values_name_the_option(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match="--compress") as err:
        parse_compress(text)
    assert words in str(err.value)


@pytest.mark.parametrize("name", ["signsgd", "terngrad", "qsgd:4", "qsgd:64"])
def test_the_switch_lanes_hold_the_exact_sums_of_the_levels(name: str) -> None:
    """Levels packed into int32 lanes and added as int32 (as the switch does) unpack to the exact
    sums; the aggregate is the vote or an unbiased sum against the shared power-of-two scale."""
    from emu.emulator.compression.in_switch import shared_scale, switch_aggregate

    rng = np.random.default_rng(1)
    grads = [(rng.standard_normal(5000) * 2.0**-6).astype(np.float32) for _ in range(8)]
    comp = parse_compress(name)
    got = switch_aggregate(comp, grads, 0, 64)
    assert got.exact and got.aggregate.dtype == np.float32
    exact = np.sum(grads, axis=0, dtype=np.float64)
    scale = shared_scale(grads, 64 * got.fields_per_lane)
    assert np.all(scale >= np.max(np.abs(grads), axis=0)) and np.all(np.log2(scale) == np.round(np.log2(scale)))
    if name == "signsgd":  # the same vote as the all_gather's
        assert np.array_equal(got.aggregate, comp.combine([comp.decompress(comp.compress(g, 0), 5000, 0)
                                                           for g in grads]))
        return
    # unbiased: over many seeds the mean aggregate approaches the exact sum
    mean = np.mean([switch_aggregate(comp, grads, s, 64).aggregate for s in range(0, 4000, 8)], axis=0)
    assert np.linalg.norm(mean - exact) / np.linalg.norm(exact) < 0.1


def test_a_lane_never_carries_into_the_next_field() -> None:
    """Every worker at the largest level: each field's sum is 2 S M, the most it can hold."""
    from emu.emulator.compression.in_switch import field_bits, pack_lanes, unpack_lanes

    s, m = 64, 8
    width = field_bits(s, m)
    per = 31 // width
    fields = np.full(10, 2 * s)
    total = np.zeros(-(-10 // per), np.int32)
    for _ in range(m):
        total = total + pack_lanes(fields, width, per)
    assert total.max() < 2**31 and np.array_equal(unpack_lanes(total, width, per, 10), np.full(10, 2 * s * m))


def test_the_shared_scale_is_the_streams_block_exponent() -> None:
    """An exact power of two is its own scale (fixedpoint.block_exponents), zeros scale by 1."""
    from emu.emulator.compression.in_switch import shared_scale

    grads = [np.array([1.0, 0.25, 0.0, 0.0], np.float32), np.array([-0.5, 0.75, 0.0, 0.0], np.float32)]
    assert list(shared_scale(grads, 2)) == [1.0, 1.0, 1.0, 1.0]
    assert list(shared_scale([np.array([0.3, 3.0], np.float32)], 1)) == [0.5, 4.0]


def test_the_cost_model_follows_the_compressors_parameter() -> None:
    """Each compressor is charged at its own parameter: the measured rate where it was measured,
    between the two around it elsewhere (linear in the parameter's logarithm, in seconds an
    element), the nearest measured beyond them; PowerSGD's rank and top-k's ratio change what
    a bucket costs (one rate per name charged them all alike)."""
    from emu.emulator.compression.compressors import _speeds, cost_us, rates

    table = _speeds()
    for name in ("topk", "randomk", "dgc", "qsgd", "powersgd"):
        rows = sorted(table[name], key=lambda r: r["param"])
        assert len(rows) >= 4
        for row in rows:
            assert rates(parse_compress(f"{name}:{row['param']:g}")) == pytest.approx((row["compress"], row["decompress"]))
        lo, hi = rows[0], rows[1]
        mid = (lo["param"] * hi["param"]) ** 0.5 if name != "qsgd" else None
        if mid is not None:  # halfway in the logarithm: the mean of the seconds an element
            got = rates(parse_compress(f"{name}:{mid!r}"))[0]
            assert got == pytest.approx(1 / (0.5 / lo["compress"] + 0.5 / hi["compress"]))
    assert rates(parse_compress("powersgd:1024")) == rates(parse_compress("powersgd:64"))  # beyond: the nearest
    one, four = cost_us(parse_compress("powersgd:1"), 1 << 20, 8), cost_us(parse_compress("powersgd:4"), 1 << 20, 8)
    assert four != one
    assert cost_us(parse_compress("topk:0.1"), 1 << 20, 8)[1] > cost_us(parse_compress("topk:0.01"), 1 << 20, 8)[1]
