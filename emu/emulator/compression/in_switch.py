"""Quantized gradients summed in the INA switch (docs/compression.md, "In the switch").

The switch adds int32 lanes; it cannot decompress, so a compressor it can aggregate must send
integers whose sum means something. Three of the GRACE family do once every worker uses the
same scale (as THC's homomorphic compression does, and TernGrad's own "scaler sharing"):

- ``signsgd``: a vote of -1 or +1; the sign of the sum is the majority vote;
- ``terngrad``: -1, 0 or +1, kept with probability ``|x| / s``; the sum times ``s``;
- ``qsgd:S``: a level in -S..S, ``|x| / s * S`` rounded stochastically; the sum times ``s / S``.

The shared scale ``s`` is a power of two per packet, the largest exponent among the workers'
values in it: what the INA stream already negotiates for its fixed-point conversion (SwitchML's
block exponent, ``fixedpoint.block_exponents``), so it costs no extra round. (QSGD scales by the vector's norm,
which would need one; a block's largest magnitude is a finer scale anyway.)

Packing: a level ``l`` travels as the field ``l + S`` (never negative), and a field must hold
the sum of M of them, at most ``2 S M``: ``w = bit_length(2 S M)`` bits. ``31 // w`` fields share
one int32 lane, so lanes stay below 2^31 and the switch's signed adds never carry from one field
into the next or overflow. The result's fields, less ``M S``, are the sums of the levels. Where a
field would not fit a lane (``S M >= 2**30``) the compressor is not summed in the switch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.compression.compressors import Compressor, Qsgd, SignSgd, TernGrad
from emu.emulator.protocol.fixedpoint import EXP_NONE, block_exponents

LANE_BITS = 31  # a lane's value stays below 2**31: the switch adds signed int32


def levels_of(comp: Compressor) -> int | None:
    """S, the largest magnitude of a level the switch can sum for ``comp``; None where the switch
    cannot aggregate it (its messages carry indices, per-worker scales or exponents)."""
    if type(comp) in (SignSgd, TernGrad):
        return 1
    if type(comp) is Qsgd:
        assert comp.param is not None
        return int(comp.param)
    return None


def field_bits(levels: int, workers: int) -> int:
    """Bits of one field: the sum of ``workers`` fields of ``level + levels`` (at most 2 S M)."""
    return (2 * levels * max(1, workers)).bit_length()


def fields_per_lane(comp: Compressor, workers: int) -> int:
    """Levels one int32 lane carries at ``workers`` workers; 0 where the switch cannot sum ``comp``."""
    s = levels_of(comp)
    return 0 if s is None else LANE_BITS // field_bits(s, workers)


def lanes(comp: Compressor, n: int, workers: int) -> int | None:
    """The int32 lanes a worker sends for ``n`` elements; None where the switch cannot sum them."""
    f = fields_per_lane(comp, workers)
    return -(-n // f) if f else None


def _levels(comp: Compressor, x: np.ndarray, scale: np.ndarray, seed: int) -> np.ndarray:
    """One worker's levels in -S..S (int64) against the shared per-value scale."""
    if type(comp) is SignSgd:
        return np.where(x >= 0, 1, -1).astype(np.int64)
    s = levels_of(comp)
    assert s is not None
    mag = np.abs(x.astype(np.float64)) / scale * s  # in [0, S]: the scale bounds every worker's values
    level = np.floor(mag + np.random.default_rng(seed).random(len(x))).astype(np.int64)
    return np.where(x < 0, -1, 1) * np.minimum(level, s)


def _value(comp: Compressor, total: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What the summed levels stand for: the vote's sign (a tie is +1, as GRACE's), or a sum."""
    if type(comp) is SignSgd:
        return np.where(total >= 0, 1.0, -1.0)
    s = levels_of(comp)
    assert s is not None
    return total * scale / s


def agreed_exponents(g: np.ndarray, block: int, agreed: np.ndarray | None = None) -> np.ndarray:
    """Per packet of ``block`` values: the largest of ``agreed`` (the workers' so far; None: none
    yet) and worker values ``g``'s ``fixedpoint.block_exponents`` there (int64)."""
    n = len(g)
    blocks = -(-n // block)
    padded = np.zeros(blocks * block)
    padded[:n] = g
    mine = block_exponents(padded.reshape(blocks, block)).astype(np.int64)
    return mine if agreed is None else np.maximum(agreed, mine)


def scale_of(agreed: np.ndarray, block: int, n: int) -> np.ndarray:
    """Per value: ``2**E`` of its packet's agreed exponent (``agreed_exponents``); 1 for a packet of zeros."""
    return np.repeat(np.where(agreed == EXP_NONE, 1.0, np.ldexp(1.0, agreed)), block)[:n]


def shared_scale(grads: list[np.ndarray], block: int) -> np.ndarray:
    """Per value: ``2**E``, with ``E`` the exponent the stream negotiates for the value's packet
    (``fixedpoint.block_exponents`` of each worker's values there, the largest over the workers),
    so every magnitude is at most the scale; 1 for a packet of zeros."""
    agreed = None
    for g in grads:
        agreed = agreed_exponents(g, block, agreed)
    assert agreed is not None
    return scale_of(agreed, block, len(grads[0]))


def worker_lanes(comp: Compressor, x: np.ndarray, scale: np.ndarray, seed: int, workers: int) -> np.ndarray:
    """The int32 lanes one worker sends for gradient ``x`` against the shared ``scale``: its levels,
    each plus S, packed ``fields_per_lane`` to a lane at ``workers``'s field width."""
    s = levels_of(comp)
    assert s is not None
    return pack_lanes(_levels(comp, x, scale, seed) + s, field_bits(s, workers), fields_per_lane(comp, workers))


def lanes_value(comp: Compressor, summed: np.ndarray, scale: np.ndarray, workers: int, n: int) -> np.ndarray:
    """What the switch's sum of ``workers``' lanes (int64, as the workers get it) stands for: the
    fields unpacked, less ``workers S``, the levels' sums, as values (float64)."""
    s = levels_of(comp)
    assert s is not None
    total = unpack_lanes(summed, field_bits(s, workers), fields_per_lane(comp, workers), n) - workers * s
    return _value(comp, total, scale).astype(np.float64)


def pack_lanes(fields: np.ndarray, width: int, per_lane: int) -> np.ndarray:
    """Non-negative fields of ``width`` bits, ``per_lane`` to an int32 lane (the first lowest)."""
    padded = np.zeros(-(-len(fields) // per_lane) * per_lane, np.int64)
    padded[: len(fields)] = fields
    shifts = np.arange(per_lane, dtype=np.int64) * width
    return (padded.reshape(-1, per_lane) << shifts).sum(axis=1).astype(np.int32)


def unpack_lanes(lanes_: np.ndarray, width: int, per_lane: int, n: int) -> np.ndarray:
    shifts = np.arange(per_lane, dtype=np.int64) * width
    return ((lanes_.astype(np.int64)[:, None] >> shifts) & ((1 << width) - 1)).ravel()[:n]


@dataclass(frozen=True)
class SwitchSum:
    """One step summed in the switch: the aggregate, and whether the fields the switch's int32
    sums hold are exactly the sums of the workers' levels."""

    aggregate: np.ndarray  # float32
    exact: bool
    fields_per_lane: int


def switch_aggregate(comp: Compressor, grads: list[np.ndarray], seed: int, packet_lanes: int,
                     workers: int | None = None) -> SwitchSum:
    """What the workers end with when the switch sums ``comp``'s levels: levels against the shared
    scale, packed into lanes, the lanes added as int32 (what the switch does), unpacked. The
    fields are as wide as ``workers`` (default: the gradients given) need: the replay's packing
    checked on a sample of its workers."""
    m = workers or len(grads)
    s = levels_of(comp)
    f = fields_per_lane(comp, m)
    if s is None or not f:
        raise ValueError(f"the switch cannot sum {comp.label} at {m} workers")
    width = field_bits(s, m)
    n = len(grads[0])
    scale = shared_scale(grads, packet_lanes * f)
    levels = [_levels(comp, g, scale, seed + w) for w, g in enumerate(grads)]
    summed = np.zeros(-(-n // f), np.int32)
    for lv in levels:
        summed = summed + pack_lanes(lv + s, width, f)  # int32 adds, as the switch's
    total = unpack_lanes(summed, width, f, n) - len(grads) * s
    exact = bool(np.array_equal(total, np.sum(levels, axis=0)))
    return SwitchSum(aggregate=_value(comp, total, scale).astype(np.float32), exact=exact, fields_per_lane=f)
