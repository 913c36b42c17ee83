"""The data an aggregation stream carries (``emu.emulator.protocol.ina``): every worker's values, in fixed point.

A worker's payload is generated where it is sent (``emu.emulator.payload.generated``: shared parts and each
worker's own, paged and cached per host by ``PayloadCache``), or, where ``emu run`` recorded them,
the real ranks' tensors. This mixin of ``InaGroup`` owns what the stream asks of it: a block's
integer units and power-of-two scale, its exponent, its quantized rows, the exact int32 sums the
switch must return, an all_gather's lanes as they are, and the check of a result row against them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from emu.emulator.payload.generated import Block, block, holds, sparse_sum_units
from emu.emulator.protocol import fixedpoint
from emu.emulator.protocol.rows import positions, rows_of
from emu.traces.model import CollKind

if TYPE_CHECKING:
    from emu.emulator.protocol.ina import InaCollective, InaParams


class PayloadCache:
    """Pages of the shared payload parts (owner, common, own, beta), for every worker of a host."""

    PAGE = 16384

    def __init__(self, seed: int, workers: int, pages: int = 64) -> None:
        self.seed, self.workers, self.pages = seed, workers, pages
        self._cache: dict[tuple[int, int], Block] = {}

    def page(self, coll: InaCollective, page: int) -> Block:
        key = (coll.seq, page)
        blk = self._cache.get(key)
        if blk is None:
            start = page * self.PAGE
            blk = block(self.seed, coll.seq, start, min(self.PAGE, coll.real_elements - start), self.workers,
                        coll.dtype, coll.sparsity)
            if len(self._cache) >= self.pages:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = blk
        return blk

    def span(self, coll: InaCollective, lo: int, hi: int, field: str) -> np.ndarray:
        """One shared array over elements [lo, hi)."""
        parts = []
        while lo < hi:
            blk = self.page(coll, lo // self.PAGE)
            a, z = lo - blk.start, min(hi, blk.start + len(blk.owner)) - blk.start
            parts.append(getattr(blk, field)[a:z])
            lo = blk.start + z
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)


class StreamData:
    """The payload side of ``InaGroup`` (it sets ``p``, ``wids`` and ``cache``)."""

    p: InaParams
    wids: np.ndarray
    cache: PayloadCache

    def _gathered(self, coll: InaCollective, owners: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """An all_gather's lanes of ``blocks`` as their owners send them: the real ranks' bytes where
        they are sent (emu run), else generated int32 units."""
        if coll.recorded is not None:
            return coll.recorded.gather_lanes(coll.seq, owners, blocks, self.p.elements, self.p.workers,
                                              coll.shard_lanes)
        return self.units_of(coll, owners, blocks)[0]

    def _rows(self, coll: InaCollective, blocks: np.ndarray, field: str, dtype) -> np.ndarray:
        """A shared field of the given (sorted, unique) data blocks, one zero-padded row each."""
        k = self.p.elements
        first, last = int(blocks[0]), int(blocks[-1])
        if last - first + 1 > 4 * len(blocks):  # scattered (the sparse stream's): gather page by page
            assert PayloadCache.PAGE % k == 0, "a page holds whole packets (k is 64 or 256)"
            per_page = PayloadCache.PAGE // k
            pages = blocks // per_page
            out = np.zeros((len(blocks), k), dtype)
            for page in np.unique(pages):
                sel = np.flatnonzero(pages == page)
                arr = getattr(self.cache.page(coll, int(page)), field)
                at = (blocks[sel] - page * per_page)[:, None] * k + np.arange(k)
                out[sel] = np.where(at < len(arr), arr[np.minimum(at, len(arr) - 1)], 0)
            return out
        lo, hi = first * k, min((last + 1) * k, coll.real_elements)
        span = np.zeros((last - first + 1) * k, dtype=dtype)
        span[: hi - lo] = self.cache.span(coll, lo, hi, field)
        return rows_of(span.reshape(-1, k), blocks - first)

    def units(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Workers li's payload units of data blocks (one int32 row each, k wide, zero padded) and
        each block's power-of-two scale beta: the values are ``units * 2**beta``, exactly.

        The workers of a host mostly send the same blocks: the shared parts are gathered once
        per distinct block, and each row only adds its worker's own elements.
        """
        return self.units_of(coll, self.wids[li], blocks)

    def units_of(self, coll: InaCollective, ranks: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``units`` of the workers of these ranks in the pool, wherever they are (an all_gather's
        block is its owner's)."""
        k = self.p.elements
        if not len(blocks):
            return np.zeros((0, k), np.int32), np.zeros(0, np.int64)
        uniq, inv = np.unique(blocks, return_inverse=True)
        own = self._rows(coll, uniq, "own", np.int32)
        common = self._rows(coll, uniq, "common", np.int32)
        beta = self._rows(coll, uniq, "beta", np.int32)[:, 0].astype(np.int64)  # constant per block
        units = np.take(common, inv, axis=0)
        if self._lookup(len(blocks)):
            rows, cols = self._owned(coll, uniq, inv, ranks)
            units[rows, cols] += own[inv[rows], cols]
        else:  # a product with the mask, not np.where (measured: 5x slower on int32 rows)
            mine = np.take(self._owners(coll, uniq), inv, axis=0) == np.asarray(ranks, np.int32)[:, None]
            units += np.take(own, inv, axis=0) * mine
        if coll.sparsity is not None:  # zero outside the blocks each worker holds (padding: held by nobody)
            holders = self._rows(coll, uniq, "holders", np.int32)
            mul = self._rows(coll, uniq, "mul", np.int64)
            add = self._rows(coll, uniq, "add", np.int32)
            held = holds(mul[inv], add[inv], holders[inv], self.p.workers, ranks[:, None])
            units = np.where(held, units, np.int32(0))
        return units, beta[inv]

    def _peaks(self, coll: InaCollective, ranks: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``max |units|`` of each row of ``units_of`` (int64) and its beta, without its rows where a
        dense block's row holds none of its worker's own elements: the block's shared part's."""
        if coll.sparsity is None and 2 * self.p.workers < self.p.elements:  # few owners a block
            return self._peaks_by_owner(coll, np.asarray(ranks, np.int64), blocks)
        if coll.sparsity is not None or not self._lookup(len(blocks)):
            units, beta = self.units_of(coll, ranks, blocks)
            return np.abs(units).max(axis=1).astype(np.int64), beta
        uniq, inv = np.unique(blocks, return_inverse=True)
        common = self._rows(coll, uniq, "common", np.int32)
        beta = self._rows(coll, uniq, "beta", np.int32)[:, 0].astype(np.int64)
        peak = np.abs(common).max(axis=1)[inv]
        rows, cols = self._owned(coll, uniq, inv, ranks)
        if len(rows):  # those that hold some: their whole rows
            at, back = np.unique(rows, return_inverse=True)
            units = common[inv[at]]
            units[back, cols] += self._rows(coll, uniq, "own", np.int32)[inv[rows], cols]
            peak[at] = np.abs(units).max(axis=1)
        return peak.astype(np.int64), beta[inv]

    def _peaks_by_owner(self, coll: InaCollective, ranks: np.ndarray,
                        blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_peaks`` of a dense block's rows from each distinct block's elements once, not from every
        row: a row of rank r holds the shared part everywhere and adds r's own elements where r owns
        them, so its peak is the larger of (the most its own elements reach with theirs added) and
        (the most the shared part reaches on the elements of every other owner and the padding). Per
        block and owner both maxima are one pass over the block; a rank's "every other owner" is the
        block's largest but where that owner is the rank itself, its second largest. The same numbers
        as ``units_of``'s rows' maxima, from a workers-th of the elements where the host's workers
        send the same blocks. For pools of fewer workers than half a row's elements (its grid is
        blocks x workers)."""
        n = self.p.workers
        uniq, inv = np.unique(blocks, return_inverse=True)
        common = self._rows(coll, uniq, "common", np.int32)
        beta = self._rows(coll, uniq, "beta", np.int32)[:, 0].astype(np.int64)
        owner = self._owners(coll, uniq)
        mine = np.abs(common + self._rows(coll, uniq, "own", np.int32)).astype(np.int64)
        shared = np.abs(common).astype(np.int64)
        # per (block, owner) the maxima over that owner's elements; column n: the padding's (nobody's)
        cell = (np.arange(len(uniq))[:, None] * (n + 1) + np.where(owner >= 0, owner, n)).ravel()
        own_peak = np.zeros(len(uniq) * (n + 1), np.int64)
        np.maximum.at(own_peak, cell, mine.ravel())
        shared_peak = np.zeros(len(uniq) * (n + 1), np.int64)
        np.maximum.at(shared_peak, cell, shared.ravel())
        own_peak[n::n + 1] = 0  # padding adds nothing of anyone's
        grid = shared_peak.reshape(-1, n + 1)
        top = np.argmax(grid, axis=1)
        first = grid[np.arange(len(uniq)), top]
        second = np.partition(grid, -2, axis=1)[:, -2]  # n + 1 >= 2 columns
        others = np.where(top[inv] == ranks, second[inv], first[inv])
        return np.maximum(own_peak.reshape(-1, n + 1)[inv, ranks], others), beta[inv]

    _LOOKUP_ROWS = 1024  # rows a call must have to look a row's own elements up (measured: below, comparing is faster)

    def _lookup(self, rows: int) -> bool:
        """Whether rows find their own elements by lookup (``_owned``) rather than by comparing
        every element's owner with their rank: where a row holds few (at most 2 of k: 32 workers
        or more at k = 64) and the rows are many. Measured on 8,192 rows at k = 64: comparing
        2.4 to 2.9 ms at 8 to 1,024 workers; the lookup 7.0 ms at 8, 4.7 at 16, 1.9 at 32, 1.1 at
        64, 0.5 at 1,024 (2.3 against 6.6 at 32,768 workers and rows)."""
        return 2 * self.p.workers >= self.p.elements and rows >= self._LOOKUP_ROWS

    def _owners(self, coll: InaCollective, uniq: np.ndarray) -> np.ndarray:
        """Each element's owner (its rank) in blocks ``uniq``, one row each; -1 on padding."""
        k = self.p.elements
        owner = self._rows(coll, uniq, "owner", np.int32)
        tail = coll.real_elements - uniq * k
        owner[np.arange(k)[None, :] >= tail[:, None]] = -1  # padding belongs to nobody
        return owner

    def _owned(self, coll: InaCollective, uniq: np.ndarray, inv: np.ndarray,
               ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where rows (block ``uniq[inv[i]]`` of the worker of rank ``ranks[i]``) hold their worker's
        own elements: (row, element) pairs. Each element has one owner (padding none), so a row
        holds about k / workers of them: found by matching each element's owner against the
        sorted rows, not by comparing every element of every row."""
        ranks = np.asarray(ranks, np.int64)
        owner = self._owners(coll, uniq)
        ub, col = np.nonzero(owner >= 0)
        n = max(self.p.workers, int(owner.max(initial=-1)) + 1, int(ranks.max(initial=-1)) + 1)  # keys apart
        want = ub * n + owner[ub, col]  # the row key (block, owner) each element is added to
        key = inv * n + ranks
        order = np.argsort(key, kind="stable")
        lo = np.searchsorted(key[order], want, side="left")
        many = np.searchsorted(key[order], want, side="right") - lo
        pair = np.repeat(np.arange(len(want)), many)
        return order[positions(lo, many)], col[pair]

    def values(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Workers li's values of data blocks, float32 (what a real worker's gradient block holds);
        float64 rows of the real ranks' tensors where they are sent."""
        if coll.recorded is not None:
            if coll.kind == CollKind.REDUCE_SCATTER:
                return coll.recorded.shard_rows(coll.seq, self.wids[li], blocks, self.p.elements, self.p.workers,
                                                coll.shard_lanes)
            return coll.recorded.rows(coll.seq, self.wids[li], blocks, self.p.elements)
        units, beta = self.units(coll, li, blocks)
        return units * np.exp2(beta.astype(np.float32))[:, None]

    def exponents(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Each row's block exponent: the smallest e with 2**e >= max|x| (``fixedpoint.block_exponents``
        of ``values``, computed on the integer units: |x| = |units| * 2**beta)."""
        if coll.recorded is not None:
            return fixedpoint.block_exponents(self.values(coll, li, blocks))
        peak, beta = self._peaks(coll, self.wids[li], blocks)
        e = beta + np.ceil(np.log2(np.maximum(peak, 1))).astype(np.int64)
        return np.where(peak > 0, np.clip(e, -127, 127), fixedpoint.EXP_NONE).astype(np.int8)

    def quantized(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Rows quantized with the agreed exponents (``fixedpoint.quantize`` of ``values``): the
        power-of-two scale makes it a shift of the integer units."""
        agreed = coll.agreed[blocks]
        if coll.recorded is not None:
            return fixedpoint.quantize(self.values(coll, li, blocks), agreed, self.p.workers)
        units, beta = self.units(coll, li, blocks)
        shift = beta + fixedpoint.scale_shift(agreed, self.p.workers)
        if (agreed == fixedpoint.EXP_NONE).any() or (shift < 0).any():  # not a plain left shift
            return fixedpoint.quantize(self.values(coll, li, blocks), agreed, self.p.workers)
        return np.left_shift(units, shift.astype(np.int32)[:, None], out=units)  # units is this call's own

    def expected_sums(self, coll: InaCollective, blocks: np.ndarray) -> np.ndarray:
        """The exact int32 sums the switch must return for data blocks (rows, zero padded)."""
        n = self.p.workers
        if coll.recorded is not None:  # every worker quantizes its row's values: n / rows of each
            ranks = (coll.recorded.rank_shard_rows(coll.seq, blocks, self.p.elements, n, coll.shard_lanes)
                     if coll.kind == CollKind.REDUCE_SCATTER else coll.recorded.rank_rows(coll.seq, blocks, self.p.elements))
            agreed = coll.agreed[blocks]
            q = np.stack([fixedpoint.quantize(r, agreed, n).astype(np.int64) for r in ranks])
            return (n // len(ranks)) * q.sum(axis=0)
        uniq, inv = np.unique(blocks, return_inverse=True)  # gathered once each, page by page
        common = self._rows(coll, uniq, "common", np.int64)
        own = self._rows(coll, uniq, "own", np.int64)
        if coll.sparsity is None:
            units = n * common + own
        else:  # H_B workers hold the block, and its owner is one of them (emu.emulator.payload.generated)
            units = sparse_sum_units(self._rows(coll, uniq, "holders", np.int64), common, own)
        # per distinct block (its scale beta is one number, its agreed exponent too), then its rows
        beta = self._rows(coll, uniq, "beta", np.int64)[:, 0]
        agreed = coll.agreed[uniq]
        none = agreed == fixedpoint.EXP_NONE
        shift = np.where(none, 0, fixedpoint.scale_shift(agreed, n))
        out = (units * np.exp2((beta + shift).astype(np.float64))[:, None]).astype(np.int64)
        out[none] = 0
        return rows_of(out, inv)

    def _check(self, coll: InaCollective, rows: np.ndarray, blocks: np.ndarray, payload: np.ndarray,
               verify: np.ndarray) -> None:
        """Compare message rows with the exact sums; store each row's mismatches in ``verify``."""
        uniq, first = np.unique(rows, return_index=True)
        blocks = blocks[first]
        if coll.kind == CollKind.ALL_GATHER:  # the owner's lanes, bit for bit
            want = self._gathered(coll, coll.owner(blocks), blocks).astype(np.int64)
        else:
            want = self.expected_sums(coll, blocks)
        got = rows_of(payload, uniq)  # compared with the int64 sums as they are (numpy widens)
        real = np.arange(self.p.elements)[None, :] < coll.lanes(blocks, self.p.elements)[:, None]
        verify[uniq] = np.count_nonzero((got != want) & real, axis=1)
