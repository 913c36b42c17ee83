"""Fixed-point aggregation: per-block exponents and power-of-two scaling to int32.

As in SwitchML, each block of ``k`` elements has an exponent ``e``, the smallest
with ``2**e >= max|x|``; the workers agree on the maximum ``E`` over all of them
(through the switch, one round ahead) and scale by ``f = 2**(30 - L - E)`` with
``L = ceil(log2(num_workers))``, so that ``|q| <= 2**30 / num_workers`` and the sum
of all workers cannot overflow int32. emu's scale is a power of two where
SwitchML's is ``INT32_MAX / (num_workers * 2**E)``: it costs under one bit of
precision, makes quantizing a shift (cheap on a switch's ALUs, too), and is exact
for dyadic data, so a replay can check every aggregated element bit for bit.
"""

from __future__ import annotations

import numpy as np

EXP_NONE = -128  # a block of zeros: any other exponent wins the maximum
_HEADROOM = 30


def level(num_workers: int) -> int:
    """L = ceil(log2(num_workers)), the bits of headroom the sum needs."""
    return max(0, int(num_workers - 1).bit_length())


def block_exponents(x: np.ndarray) -> np.ndarray:
    """Per row of x (blocks x k), the smallest e with 2**e >= max|x| (int8; EXP_NONE for zeros)."""
    peak = np.max(np.abs(x), axis=-1) if x.size else np.zeros(x.shape[:-1])
    mant, exp = np.frexp(peak.astype(np.float64))
    exp = exp - (mant == 0.5)  # an exact power of two needs no extra bit
    exp = np.clip(exp, -127, 127)
    return np.where(peak > 0, exp, EXP_NONE).astype(np.int8)


def scale_shift(agreed: np.ndarray, num_workers: int) -> np.ndarray:
    """The power of two s with q = x * 2**s, per block (int64)."""
    return _HEADROOM - level(num_workers) - agreed.astype(np.int64)


def quantize(x: np.ndarray, agreed: np.ndarray, num_workers: int) -> np.ndarray:
    """Blocks of floats (blocks x k) to int32 with the agreed exponents (one per block)."""
    shift = np.where(agreed == EXP_NONE, 0, scale_shift(agreed, num_workers))
    # multiplying by a power of two is exact (and much faster than ldexp); float32 input stays
    # float32: scaling only moves its exponent, and |q| <= 2**30 fits
    ftype = np.float32 if x.dtype == np.float32 else np.float64
    q = np.rint(x * np.exp2(shift.astype(ftype))[..., None])
    return q.astype(np.int32)
