"""Payload without memory: the data every fake worker contributes, made when sent.

Element ``i`` of collective ``seq`` holds, on worker ``w`` of ``N``::

    x_w[i] = (c_i + (w == owner_i) * d_i) * 2**beta_b     (b = i // 256)

with ``owner_i``, ``c_i``, ``d_i`` and ``beta_b`` drawn by a counter-based hash of
(seed, seq, i). No worker holds a whole tensor: any range is made on demand, and
the parts shared by all workers (owner, c, d, beta) are made once per process.
The sum over workers has a closed form, ``(N * c_i + d_i) * 2**beta_b``, so
checking an aggregated element costs O(1), not O(workers).

Every value is exact in its dtype and so is every partial sum the fabrics form:
16-bit floats and narrow integers use ``c = 0`` (a sum then holds only its owner's
value), wider types keep ``|N c + d|`` far below their significand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.traces.model import Dtype

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
BETA_BLOCK = 256


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a good 64-bit hash, vectorized."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _hash(seed: int, seq: int, salt: int, index: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        key = np.uint64((seed * 0x100000001B3 + seq * 0x1F3 + salt) & 0xFFFFFFFFFFFFFFFF)
        return _mix(index.astype(np.uint64) * _GOLD + key)


_WIDE = {"float32", "float64", "int32", "int64"}
_FLOAT = {d.value for d in Dtype if d.is_float}


@dataclass(frozen=True)
class Block:
    """The shared parts of elements [start, start + n) of one collective."""

    start: int
    owner: np.ndarray  # int32
    common: np.ndarray  # int32 units every worker adds (c)
    own: np.ndarray  # int32 units the owner adds (d)
    beta: np.ndarray  # int32 power-of-two scale (0 for integer dtypes)
    scale: np.ndarray  # float32 2**beta (narrow arrays: making values is memory-bound)

    def units(self, worker: int) -> np.ndarray:
        return self.common + np.where(self.owner == worker, self.own, 0)

    def values(self, worker: int) -> np.ndarray:
        """x_w as float64 (exact: every value fits any float dtype's significand)."""
        return np.ldexp(self.units(worker).astype(np.float64), self.beta)

    def sum_units(self, num_workers: int) -> np.ndarray:
        return num_workers * self.common + self.own

    def expected_sum(self, num_workers: int) -> np.ndarray:
        return np.ldexp(self.sum_units(num_workers).astype(np.float64), self.beta)


def block(seed: int, seq: int, start: int, n: int, num_workers: int, dtype: str) -> Block:
    """Elements [start, start + n) of collective ``seq``, shared by every worker."""
    index = np.arange(start, start + n, dtype=np.int64)
    owner = (_hash(seed, seq, 1, index) % np.uint64(max(1, num_workers))).astype(np.int32)
    if dtype in ("uint8", "bool"):
        own = (_hash(seed, seq, 2, index) % np.uint64(2)).astype(np.int32)
    else:
        own = (_hash(seed, seq, 2, index) % np.uint64(255)).astype(np.int32) - 127
    if dtype in _WIDE:
        common = (_hash(seed, seq, 3, index) % np.uint64(15)).astype(np.int32) - 7
    else:
        common = np.zeros(n, dtype=np.int32)
    if dtype in _FLOAT:
        blocks = np.unique(index // BETA_BLOCK)
        per_block = -(_hash(seed, seq, 4, blocks) % np.uint64(11)).astype(np.int32)
        beta = per_block[index // BETA_BLOCK - blocks[0]] if n else np.zeros(0, np.int32)
    else:
        beta = np.zeros(n, dtype=np.int32)
    return Block(start=start, owner=owner, common=common, own=own, beta=beta,
                 scale=np.exp2(beta.astype(np.float32)))
