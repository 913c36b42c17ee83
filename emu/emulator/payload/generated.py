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

A sparse collective (an all_reduce of floats with a ``Sparsity``: per-worker fraction
``f`` of non-zero blocks of ``K`` elements, union fraction ``u``; docs/sparse.md) is
zero outside the blocks a worker holds::

    x_w[i] = [w holds B] * (c_i + (w == owner_i) * d_i) * 2**beta_b     (B = i // K)
    sum_i  = (H_B * c_i + d_i) * 2**beta_b                                (0 outside the union)

Block ``B`` is in the union with probability ``u`` (a hashed choice of ``floor(64 u + U)``
blocks in each stratum of 64, so that even a few blocks realize ``u`` closely); its holders
are the first ``H_B`` workers of a hashed permutation of the workers (``pi_B(w) = (a_B w +
c_B) mod N``, ``a_B`` coprime to ``N``): the first, ``pi_B^-1(0)``, is the block's anchor,
and ``H_B = 1 + floor((N - 1) p + U_B)`` makes every other worker hold it with probability
``p = (f/u - 1/N) / (1 - 1/N)`` (clipped to [0, 1]), so a worker's expected fraction is ``f``
(where ``f < u/N`` the anchors alone exceed it: ``p = 0``, and each worker holds ``u/N``).
``H_B`` costs O(1) per block at any ``N``. Owners are drawn among the holders, round robin
inside the block, so a holder's block is non-zero whenever it owns an element of it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from emu.traces.model import Dtype, Sparsity

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
BETA_BLOCK = 256
# hash salts of the sparse model (1..4: owner, d, c, beta of every collective)
_UNION, _MUL, _ADD, _ROUND, _SHIFT, _OWN_SPARSE, _UNION_MUL, _UNION_ADD = 5, 6, 7, 8, 9, 10, 11, 12
# The union is drawn per stratum of consecutive blocks: exactly floor(S u + U) of each S are in it
# (a hashed permutation says which), so a collective's realized union is within a block per
# stratum of u however few blocks it has; payload scale leaves only ceil(count / R) real
# elements, and each real block stands for R on the emulated wire.
STRATUM_BLOCKS = 64
_STATS_CHUNK = 1 << 20  # blocks per pass when counting a whole collective's holders


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a good 64-bit hash, vectorized (in place: ``x`` is the caller's
    scratch, and is returned)."""
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
        return x


def _key(seed: int, seq: int, salt: int) -> np.uint64:
    return np.uint64((seed * 0x100000001B3 + seq * 0x1F3 + salt) & 0xFFFFFFFFFFFFFFFF)


def _hash(seed: int, seq: int, salt: int, index: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(index.astype(np.uint64) * _GOLD + _key(seed, seq, salt))


def _hash_scaled(scaled: np.ndarray, seed: int, seq: int, salt: int) -> np.ndarray:
    """``_hash`` of the indices whose ``index * _GOLD`` is ``scaled`` (made once for several salts)."""
    with np.errstate(over="ignore"):
        return _mix(scaled + _key(seed, seq, salt))


def _uniform(seed: int, seq: int, salt: int, index: np.ndarray) -> np.ndarray:
    """Uniform in [0, 1), float64, from the hash's top 53 bits."""
    return (_hash(seed, seq, salt, index) >> np.uint64(11)).astype(np.float64) * 2.0**-53


_WIDE = {"float32", "float64", "int32", "int64"}
_FLOAT = {d.value for d in Dtype if d.is_float}


def is_wide(dtype: str) -> bool:
    """Whether a dtype's payload has a common part (``c``) on every worker: 32 and 64 bits."""
    return dtype in _WIDE


def is_sparse(sparsity: Sparsity | None, dtype: str) -> bool:
    """Whether a collective's payload follows a sparsity: only floats (integers stay dense)."""
    return sparsity is not None and dtype in _FLOAT


def hold_probability(sparsity: Sparsity, workers: int) -> float:
    """p: the probability that a worker other than the anchor holds a union block, such that a
    worker's fraction is ``nonzero``; 0 where the union cannot be that sparse (f < u/N: each
    worker then holds u/N), 1 where f = u."""
    f, u, n = sparsity.nonzero, sparsity.union, max(1, workers)
    if u <= 0 or n == 1:
        return 1.0
    return min(1.0, max(0.0, (f / u - 1 / n) / (1 - 1 / n)))


@functools.lru_cache(maxsize=16)
def _coprime(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The multipliers coprime to n and their inverses mod n (the permutations of the workers)."""
    if n <= 1:
        return np.zeros(1, np.int64), np.zeros(1, np.int64)
    a = np.arange(1, n, dtype=np.int64)
    units = a[np.gcd(a, n) == 1]
    return units, np.array([pow(int(x), -1, n) for x in units], dtype=np.int64)


def holds(mul: np.ndarray, add: np.ndarray, holders: np.ndarray, workers: int,
          worker: int | np.ndarray) -> np.ndarray:
    """Whether ``worker`` holds each sparsity block: its rank in the block's permutation of the
    workers, ``(a_B w + c_B) mod M``, is below the block's holders ``H_B``."""
    return (mul.astype(np.int64) * worker + add) % workers < holders


def sparse_sum_units(holders: np.ndarray, common: np.ndarray, own: np.ndarray) -> np.ndarray:
    """The sum over workers of a sparse collective's units: ``H_B c + d`` in a union block (its
    owner is one of its holders), 0 outside it."""
    return holders * common + np.where(holders > 0, own, 0)


@dataclass(frozen=True)
class Holding:
    """Which workers hold each of some sparsity blocks: worker ``w`` holds block ``j`` iff
    ``(mul[j] * w + add[j]) mod workers < holders[j]``."""

    holders: np.ndarray  # int64 per block: H_B, 0 outside the union
    mul: np.ndarray  # int64: a_B, coprime to workers
    inv: np.ndarray  # int64: a_B^-1 mod workers
    add: np.ndarray  # int64: c_B
    workers: int

    def held(self, worker: int | np.ndarray) -> np.ndarray:
        """Whether ``worker`` holds each block (broadcasts: a column of workers gives a matrix)."""
        return holds(self.mul, self.add, self.holders, self.workers, worker)

    def worker_at(self, rank: np.ndarray) -> np.ndarray:
        """The worker at position ``rank`` of each block's permutation (0: the anchor)."""
        return (rank - self.add) * self.inv % self.workers


def in_union(seed: int, seq: int, blocks: np.ndarray, union: float) -> np.ndarray:
    """Whether each block is non-zero on some worker: block ``B`` is, with probability ``union``,
    when its hashed rank in its stratum is below the stratum's count (``STRATUM_BLOCKS``)."""
    s = STRATUM_BLOCKS
    stratum, pos = blocks // s, blocks % s
    count = np.floor(s * union + _uniform(seed, seq, _UNION, stratum))
    mul = (_hash(seed, seq, _UNION_MUL, stratum) % np.uint64(s // 2)).astype(np.int64) * 2 + 1  # odd: a bijection
    add = (_hash(seed, seq, _UNION_ADD, stratum) % np.uint64(s)).astype(np.int64)
    return (mul * pos + add) % s < count


def holding(seed: int, seq: int, blocks: np.ndarray, workers: int, sparsity: Sparsity) -> Holding:
    """The holders of sparsity blocks ``blocks`` of collective ``seq`` (O(1) per block)."""
    n = max(1, workers)
    blocks = np.asarray(blocks, dtype=np.int64)
    union = in_union(seed, seq, blocks, sparsity.union)
    extra = np.floor((n - 1) * hold_probability(sparsity, n) + _uniform(seed, seq, _ROUND, blocks))
    holders = np.where(union, 1 + np.minimum(extra.astype(np.int64), n - 1), 0)
    units, inverses = _coprime(n)
    pick = (_hash(seed, seq, _MUL, blocks) % np.uint64(len(units))).astype(np.int64)
    add = (_hash(seed, seq, _ADD, blocks) % np.uint64(n)).astype(np.int64)
    return Holding(holders=holders, mul=units[pick], inv=inverses[pick], add=add, workers=n)


@dataclass(frozen=True)
class Block:
    """The shared parts of elements [start, start + n) of one collective."""

    start: int
    owner: np.ndarray  # int32
    common: np.ndarray  # int32 units every worker adds (c)
    own: np.ndarray  # int32 units the owner adds (d)
    beta: np.ndarray  # int32 power-of-two scale (0 for integer dtypes)
    scale: np.ndarray  # float32 2**beta (narrow arrays: making values is memory-bound)
    # sparse collectives only (None: dense), per element, of its sparsity block: H_B, a_B, c_B
    holders: np.ndarray | None = None  # int32
    mul: np.ndarray | None = None  # int32
    add: np.ndarray | None = None  # int32
    workers: int = 0

    def held(self, worker: int) -> np.ndarray | None:
        """Whether ``worker`` holds each element's sparsity block (None: dense, every one)."""
        if self.holders is None:
            return None
        assert self.mul is not None and self.add is not None
        return holds(self.mul, self.add, self.holders, self.workers, worker)

    def units(self, worker: int) -> np.ndarray:
        units = self.common + self.own * (self.owner == worker)  # a product, not np.where: 2x faster
        held = self.held(worker)
        return units if held is None else np.where(held, units, 0).astype(units.dtype)

    def values(self, worker: int) -> np.ndarray:
        """x_w as float64 (exact: every value fits any float dtype's significand)."""
        return np.ldexp(self.units(worker).astype(np.float64), self.beta)

    def sum_units(self, num_workers: int) -> np.ndarray:
        if self.holders is None:
            return num_workers * self.common + self.own
        return sparse_sum_units(self.holders, self.common, self.own)

    def expected_sum(self, num_workers: int) -> np.ndarray:
        return np.ldexp(self.sum_units(num_workers).astype(np.float64), self.beta)


@dataclass(frozen=True)
class DenseParts:
    """The shared parts of a dense collective's elements at any indices (``Block``'s, without the
    range): each worker's values and their sum, for many workers' elements at once."""

    owner: np.ndarray  # int32
    common: np.ndarray  # int32
    own: np.ndarray  # int32
    beta: np.ndarray  # int32

    def values(self, worker: np.ndarray | int) -> np.ndarray:
        """x_w of each element, ``worker`` its worker (one, or one per element): as ``Block.values``."""
        units = self.common + self.own * (self.owner == worker)
        return np.ldexp(units.astype(np.float64), self.beta)

    def expected_sum(self, num_workers: int) -> np.ndarray:
        return np.ldexp((num_workers * self.common + self.own).astype(np.float64), self.beta)

    def take(self, at: np.ndarray) -> DenseParts:
        """The parts of elements ``at`` (a mask or indices)."""
        return DenseParts(self.owner[at], self.common[at], self.own[at], self.beta[at])


def dense_parts(seed: int, seq: int, index: np.ndarray, num_workers: int, dtype: str) -> DenseParts:
    """Elements ``index`` (any, int64) of a dense collective ``seq``: the same numbers as ``block``."""
    with np.errstate(over="ignore"):
        scaled = index.astype(np.uint64) * _GOLD
    own = _own(scaled, seed, seq, dtype, False)
    common = _common(scaled, seed, seq, dtype, False, len(index))
    if dtype in _FLOAT:
        beta = -(_hash(seed, seq, 4, index // BETA_BLOCK) % np.uint64(11)).astype(np.int32)
    else:
        beta = np.zeros(len(index), dtype=np.int32)
    owner = (_hash_scaled(scaled, seed, seq, 1) % np.uint64(max(1, num_workers))).astype(np.int32)
    return DenseParts(owner, common, own, beta)


def _own(scaled: np.ndarray, seed: int, seq: int, dtype: str, sparse: bool) -> np.ndarray:
    if dtype in ("uint8", "bool"):
        return (_hash_scaled(scaled, seed, seq, 2) % np.uint64(2)).astype(np.int32)
    if sparse:  # never 0, so that an owner's element makes its block non-zero
        own = (_hash_scaled(scaled, seed, seq, _OWN_SPARSE) % np.uint64(254)).astype(np.int32) - 127
        own += own >= 0
        return own
    return (_hash_scaled(scaled, seed, seq, 2) % np.uint64(255)).astype(np.int32) - 127


def _common(scaled: np.ndarray, seed: int, seq: int, dtype: str, sparse: bool, n: int) -> np.ndarray:
    if dtype in _WIDE and sparse:  # never 0 (and, with ``own`` fixed by the caller, nor c + d)
        common = (_hash_scaled(scaled, seed, seq, 3) % np.uint64(14)).astype(np.int32) - 7
        common += common >= 0
        return common
    if dtype in _WIDE:
        return (_hash_scaled(scaled, seed, seq, 3) % np.uint64(15)).astype(np.int32) - 7
    return np.zeros(n, dtype=np.int32)


def block(seed: int, seq: int, start: int, n: int, num_workers: int, dtype: str,
          sparsity: Sparsity | None = None) -> Block:
    """Elements [start, start + n) of collective ``seq``, shared by every worker; sparse where
    ``sparsity`` is given and the dtype is a float (module docstring)."""
    index = np.arange(start, start + n, dtype=np.int64)
    with np.errstate(over="ignore"):
        scaled = index.astype(np.uint64) * _GOLD  # hashed under each salt below
    sparse = is_sparse(sparsity, dtype) and n > 0
    own = _own(scaled, seed, seq, dtype, sparse)
    common = _common(scaled, seed, seq, dtype, sparse, n)
    if dtype in _WIDE and sparse:
        # never 0, nor c + d: then every element a holder holds is non-zero, and so is its block
        own = np.where(common + own == 0, 2 * own, own).astype(np.int32)
    if dtype in _FLOAT:
        at = index // BETA_BLOCK  # consecutive: its blocks are a range
        blocks = np.arange(start // BETA_BLOCK, (start + n - 1) // BETA_BLOCK + 1) if n else at
        per_block = -(_hash(seed, seq, 4, blocks) % np.uint64(11)).astype(np.int32)
        beta = per_block[at - blocks[0]] if n else np.zeros(0, np.int32)
    else:
        beta = np.zeros(n, dtype=np.int32)
    scale = np.exp2(beta.astype(np.float32))
    if not sparse:
        owner = (_hash_scaled(scaled, seed, seq, 1) % np.uint64(max(1, num_workers))).astype(np.int32)
        return Block(start=start, owner=owner, common=common, own=own, beta=beta, scale=scale)
    assert sparsity is not None
    k = sparsity.block_elements
    sb = index // k
    first = int(sb[0])
    hold = holding(seed, seq, np.arange(first, int(sb[-1]) + 1), num_workers, sparsity)
    at = sb - first
    holders = hold.holders[at]
    # owners go round robin over the block's holders from a hashed offset
    shift = (_hash(seed, seq, _SHIFT, np.arange(first, int(sb[-1]) + 1)) % np.uint64(1 << 32)).astype(np.int64)
    rank = (index - sb * k + shift[at]) % np.maximum(holders, 1)
    owner = ((rank - hold.add[at]) * hold.inv[at] % hold.workers).astype(np.int32)
    return Block(start=start, owner=owner, common=common, own=own, beta=beta, scale=scale,
                 holders=holders.astype(np.int32), mul=hold.mul[at].astype(np.int32),
                 add=hold.add[at].astype(np.int32), workers=hold.workers)


@dataclass(frozen=True)
class Realized:
    """What a sparse collective's payload held: its blocks, those in the union, and the blocks
    held summed over workers (a worker's mean fraction is ``held / (blocks * workers)``)."""

    blocks: int = 0
    union: int = 0
    held: int = 0

    def __add__(self, other: Realized) -> Realized:
        return Realized(self.blocks + other.blocks, self.union + other.union, self.held + other.held)


def realized(seed: int, seq: int, elements: int, workers: int, sparsity: Sparsity,
             dtype: str = "float32") -> Realized:
    """Count the non-zero blocks of every worker of a sparse collective of ``elements`` (O(1) per
    block). In a wide dtype every holder's block is non-zero; in a 16-bit one (c = 0) a holder's
    elements are non-zero only where it owns them, so a block of L elements is non-zero on at most
    L of its holders: the rest hold zeros, and are not counted."""
    k = sparsity.block_elements
    total = -(-elements // k)
    out = Realized()
    for lo in range(0, total, _STATS_CHUNK):
        ids = np.arange(lo, min(total, lo + _STATS_CHUNK))
        h = holding(seed, seq, ids, workers, sparsity).holders
        if dtype not in _WIDE:
            h = np.minimum(h, np.minimum(k, elements - ids * k))
        out = out + Realized(len(h), int(np.count_nonzero(h)), int(h.sum()))
    return out
