"""The software in-network aggregation switch: SwitchML's data plane, batch by batch.

State per slot and copy: ``k`` int32 accumulators, a worker bitmap, a count, the
maximum exponent, and (for the emulated clock) the latest arrival stamps. Per
packet, exactly (docs/design.md, docs/protocol.md):

1. the sender's bit in the *other* copy of the slot is cleared (that recycles it);
2. if the sender's bit in this copy is already set, the packet is a duplicate:
   answered with the stored result to that worker alone if the copy is complete
   (count == workers), dropped otherwise;
3. else the bit is set; if the copy's count is 0 or complete (a new round) the
   payload overwrites the accumulators, else it adds; exponents take the maximum;
4. when the count reaches the number of workers, the result goes to every worker.

A batch is applied with numpy in segments that hold no duplicate and no worker
twice on one slot, so that its effect equals the packets' in order; a packet that
would break a segment (a retransmission) is applied on its own.

A reduce_scatter's and an all_gather's rounds (docs/protocol.md, "Reduce-scatter and all-gather")
run on the same slots, copies and rules, with flags that say their kind: every packet of a
reduce_scatter round (``FLAG_SCATTER``) carries a block to sum, and the round's sum goes to the
worker whose packet carried ``FLAG_OWNER`` (the owner of the block's shard) alone, with one
header-only ``SCATTER_DONE`` for every other worker, so that each still learns its slot is free
and the exponent its next block needs; a duplicate of a completed scatter round is answered with
the sum to its owner and a header-only result to anyone else. An all_gather round
(``FLAG_GATHER``) carries the owner's block and the others' headers; sizes differ within it (its
identity is its kind), and its sum, the owner's block exactly, goes to every worker.

The sparse stream (``SPARSE_CONTRIB``, docs/sparse.md) runs on the same slots, copies and
rules, with two differences: a round is pinned by its chunk *and* the block it sums (every
packet of the round names it; a header-only packet of a worker that does not hold the block
adds nothing), and the result carries the minimum of the packets' next blocks, with the
largest exponent among the packets that named that minimum, where a dense result carries the
largest exponent of all.

Whatever arrives, the switch neither crashes nor lets a bad packet touch an
aggregate: before step 1, a packet of another job or worker count is dropped as
``invalid`` (it belongs to another pool), and one that is wrong for this pool is
dropped as ``malformed``: a type other than CONTRIB, a worker or slot out of
range, a size beyond the pool's elements, or a chunk or size that differs from
the round its slot copy holds (summing it would corrupt that round; a new round,
on an empty or complete copy, may start with any chunk). A late duplicate of a
completed round's packet, arriving after its sender moved on (so its bit is
clear), is dropped as ``stale`` instead of opening a round no other worker would
join (which the plain protocol does, and which blocks the slot for good). A batch
whose arrays do not match its headers (payload not ``(n, k)``, stamps not ``n``
rows) is dropped whole as malformed. Dropped packets have no effect at all, not
even step 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.protocol.fixedpoint import EXP_NONE
from emu.emulator.protocol.rows import rows_of
from emu.emulator.protocol.wire import AGG_HEADER, BLOCK_NONE, FLAG_COPY, FLAG_GATHER, FLAG_OWNER, FLAG_SCATTER, MsgType

MULTICAST = 0xFFFF  # the destination of a result for every worker
# a round's identity: its size for a dense round, SPARSE_IDENT + block for a sparse one, and, apart
# from both (negative), SCATTER_IDENT - size for a reduce_scatter's and GATHER_IDENT for an all_gather's
SPARSE_IDENT = 256
SCATTER_IDENT = -1
GATHER_IDENT = -1000
_NO_NEXT = (BLOCK_NONE << 8) | 0xFF  # a sparse copy's (next, exponent) key before any packet


def _is_range(rows: np.ndarray) -> bool:
    return len(rows) > 0 and rows[-1] - rows[0] + 1 == len(rows)


@dataclass
class SwitchStats:
    packets: int = 0  # contributions received
    payload_bytes: int = 0  # payload bytes of accepted (non-duplicate) contributions
    results: int = 0  # slot copies completed (each multicast to all workers)
    duplicates: int = 0  # retransmissions seen (answered + dropped)
    answered: int = 0  # duplicates of complete copies answered by unicast
    dropped: int = 0  # duplicates of incomplete copies dropped
    invalid: int = 0  # packets of another job or worker count (another pool's)
    malformed: int = 0  # packets wrong for this pool (type, range, size, chunk), dropped unapplied
    stale: int = 0  # late copies of a round's packet after the round completed and the sender left

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Results:
    """What a batch produced, in the order a per-packet switch would send it."""

    headers: np.ndarray  # AGG_HEADER records; worker == MULTICAST for results to all
    payload: np.ndarray  # (n, k) int32
    stamps: np.ndarray  # (n, 2) float64: when the first and last packet each result stands for may leave
    sparse: np.ndarray  # (n, 2) uint32: a sparse result's (block, next); zeros for a dense one

    def __len__(self) -> int:
        return len(self.headers)


class AggregationSwitch:
    """One job's slot pool: ``slots`` x 2 copies x ``k`` int32, for ``workers`` workers."""

    def __init__(self, slots: int, workers: int, elements: int, job: int = 0) -> None:
        if not 1 <= slots <= 65535 or not 1 <= workers <= 65535 or elements % 64:
            raise ValueError("slots and workers in 1..65535, elements a multiple of 64")
        self.slots, self.workers, self.k, self.job = slots, workers, elements, job
        self.acc = np.zeros((slots * 2, elements), dtype=np.int32)
        self.bitmap = np.zeros((slots * 2, workers), dtype=bool)
        self.count = np.zeros(slots * 2, dtype=np.int64)
        self.exp = np.full(slots * 2, EXP_NONE, dtype=np.int64)
        self.size = np.zeros(slots * 2, dtype=np.int64)
        self.chunk = np.zeros(slots * 2, dtype=np.int64)
        self.ident = np.zeros(slots * 2, dtype=np.int64)  # the round's size (dense) or SPARSE_IDENT + block
        # sparse rounds: min over packets of next << 8 | (127 - exponent): the next block any worker
        # holds, and the largest exponent among those that announced it
        self.nkey = np.full(slots * 2, _NO_NEXT, dtype=np.int64)
        # when the first and the last emulated packet of the slot copy's group had arrived
        self.stamp = np.zeros((slots * 2, 2), dtype=np.float64)
        self.owner = np.full(slots * 2, -1, dtype=np.int64)  # a scatter or gather round's owner (-1: none yet)
        self.stats = SwitchStats()

    def process(self, headers: np.ndarray, payload: np.ndarray, stamps: np.ndarray | None = None,
                sparse: np.ndarray | None = None) -> Results:
        """Apply a batch of contributions (in order); return the results to send. ``sparse``: each
        row's (block, next) where its type is SPARSE_CONTRIB."""
        n = len(headers)
        out: list[tuple[np.ndarray, ...]] = []
        if n == 0:
            return self._results(out)
        self.stats.packets += n
        batch = self._batch_arrays(headers, payload, stamps, sparse)
        if batch is None:
            self.stats.malformed += n
            return self._results(out)
        headers, payload, stamps, sparse = batch
        slot = headers["slot"].astype(np.int64)
        worker = headers["worker"].astype(np.int64)
        copy = (headers["flags"] & FLAG_COPY).astype(np.int64)
        is_sparse = headers["msg_type"] == MsgType.SPARSE_CONTRIB
        ours = (headers["job"] == self.job) & (headers["num_workers"] == self.workers)
        flags = headers["flags"].astype(np.int64)
        scatter, gather = (flags & FLAG_SCATTER) > 0, (flags & FLAG_GATHER) > 0
        size = headers["size"].astype(np.int64)
        # a round of one kind: not scatter and gather, not sparse and either, no gather data but the owner's
        kinds_ok = ~(scatter & gather) & ~(is_sparse & (scatter | gather)) & ~(gather & (size > 0) & ((flags & FLAG_OWNER) == 0))
        valid = ours & kinds_ok & (((headers["msg_type"] == MsgType.CONTRIB) | is_sparse) & (slot < self.slots)
                                   & (worker < self.workers) & (size * 64 <= self.k))
        # per row: what pins its round (size, SPARSE_IDENT + block, or its kind's) and its (next, exponent) key
        keys = (np.where(is_sparse, SPARSE_IDENT + sparse[:, 0].astype(np.int64),
                         np.where(scatter, SCATTER_IDENT - size, np.where(gather, GATHER_IDENT, size))),
                (sparse[:, 1].astype(np.int64) << 8) | (127 - headers["exponent"].astype(np.int64)))
        self.stats.invalid += int(n - ours.sum())
        self.stats.malformed += int(ours.sum() - valid.sum())
        keep = np.flatnonzero(valid)
        idx = slot * 2 + copy
        chunk = headers["chunk"].astype(np.int64)
        start = 0
        while start < len(keep):
            rows = keep[start:]
            end = self._clean_prefix(idx[rows], worker[rows], slot[rows])
            seg = rows[:end] if end > 0 else rows[:1]
            fits, stale = self._fits_round(seg, idx, worker, chunk, keys[0])
            self.stats.stale += int(stale.sum())
            self.stats.malformed += int(len(seg) - fits.sum() - stale.sum())
            if end > 0 and fits.any():
                out.append(self._apply(seg[fits], idx, worker, headers, payload, stamps, keys))
            elif end == 0 and fits[0]:
                out.append(self._apply_one(seg[0], idx, worker, headers, payload, stamps, keys))
            start += max(end, 1)
        return self._results(out)

    def _batch_arrays(self, headers: np.ndarray, payload: np.ndarray, stamps: np.ndarray | None,
                      sparse: np.ndarray | None) -> tuple[np.ndarray, ...] | None:
        """The batch's arrays in the shapes the switch works on, or None if they cannot be."""
        n = len(headers)
        try:
            if headers.dtype != AGG_HEADER:
                headers = headers.astype(AGG_HEADER)  # by field name: fails if one is missing
            payload = np.asarray(payload)
            stamps = np.zeros((n, 2)) if stamps is None else np.asarray(stamps, dtype=np.float64)
            sparse = np.zeros((n, 2), np.int64) if sparse is None else np.asarray(sparse).astype(np.int64)
        except (TypeError, ValueError, AttributeError):
            return None
        if sparse.shape != (n, 2) or (sparse < 0).any() or (sparse > BLOCK_NONE).any():
            return None
        if payload.shape != (n, self.k) or payload.dtype.kind != "i" or payload.dtype.itemsize != 4:
            return None
        if stamps.shape in ((n,), (n, 1)):
            stamps = np.repeat(stamps.reshape(n, 1), 2, axis=1)
        if stamps.shape != (n, 2):
            return None
        return headers, payload, stamps, sparse

    def _fits_round(self, rows: np.ndarray, idx_all: np.ndarray, worker_all: np.ndarray,
                    chunk_all: np.ndarray, ident_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, in order: (does the packet belong to the round its slot copy holds,
        is it a stale copy of the round the copy completed).

        A copy in progress (0 < count < workers), or a complete one the sender
        already counted in (a retransmission), pins the round's chunk and size. A
        complete copy the sender left takes a new round, but not with the chunk it just
        completed: that is a late duplicate of the sender's packet, which would open a
        round no other worker joins and so block the slot for good. An empty copy, or
        a new round, takes the first packet's chunk and size, and the rest of the
        segment must agree with it. The size stands for the round's identity: a sparse round's is
        its block instead (``SPARSE_IDENT``), since its packets' sizes differ.
        """
        idx, chunk, size = idx_all[rows], chunk_all[rows], ident_all[rows]
        count = self.count[idx]
        pinned = (count > 0) & ((count < self.workers) | self.bitmap[idx, worker_all[rows]])
        stale = (count == self.workers) & ~pinned & (chunk == self.chunk[idx])
        opens = np.flatnonzero(~pinned & ~stale)
        first = np.full(len(rows), len(rows))  # the row whose chunk and size a new round takes
        if len(opens):
            groups, at = np.unique(idx[opens], return_index=True)
            pos = np.minimum(np.searchsorted(groups, idx), len(groups) - 1)
            first = np.where(groups[pos] == idx, opens[at][pos], len(rows))
        # after a new round opened, an old chunk is simply not the round's (as packet by packet)
        stale &= np.arange(len(rows)) < first
        first = np.minimum(first, len(rows) - 1)
        want_chunk = np.where(pinned, self.chunk[idx], chunk[first])
        want_size = np.where(pinned, self.ident[idx], size[first])
        return (chunk == want_chunk) & (size == want_size) & ~stale, stale

    def _clean_prefix(self, idx: np.ndarray, worker: np.ndarray, slot: np.ndarray) -> int:
        """Length of the longest prefix with no duplicate, each (slot, worker) once, and no
        slot copy given more packets than its round has room for.

        The room matters when a copy's count holds a worker whose bit was cleared since
        (it moved to the other copy and then resent to this one): in order, the round
        completes and the next packet starts a new one, which a sum over the segment
        would miss.
        """
        dup = self.bitmap[idx, worker]
        key = slot * self.workers + worker
        _, first = np.unique(key, return_index=True)
        repeated = np.ones(len(key), dtype=bool)
        repeated[first] = False
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.r_[True, sorted_idx[1:] != sorted_idx[:-1]]
        n = len(idx)
        rank = np.empty(n, dtype=np.int64)  # how many earlier rows of the prefix share the copy
        rank[order] = np.arange(n) - np.maximum.accumulate(np.where(starts, np.arange(n), 0))
        count = self.count[idx]
        room = self.workers - np.where(count == self.workers, 0, count)
        bad = np.flatnonzero(dup | repeated | (rank >= room))
        return int(bad[0]) if len(bad) else len(idx)

    def _apply(self, rows: np.ndarray, idx_all: np.ndarray, worker_all: np.ndarray, headers: np.ndarray,
               payload: np.ndarray, stamps: np.ndarray,
               keys: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
        idx, worker = idx_all[rows], worker_all[rows]
        self.bitmap[idx ^ 1, worker] = False
        self.bitmap[idx, worker] = True
        groups, counts, starts, order, sums = self._sums(idx, worker, rows, payload)
        fresh = (self.count[groups] == 0) | (self.count[groups] == self.workers)
        # int32 accumulators wrap like the switch's registers (numpy's int32 add wraps too)
        if fresh.all():  # every slot copy starts a round (most often): its sums are the registers
            self.acc[groups] = sums
        else:
            acc = rows_of(self.acc, groups)
            acc[fresh] = 0
            acc += sums
            self.acc[groups] = acc
        exps = headers["exponent"].astype(np.int64)[rows[order]]
        self.exp[groups] = np.maximum(np.where(fresh, EXP_NONE, self.exp[groups]),
                                      np.maximum.reduceat(exps, starts))
        self.stamp[groups] = np.maximum(np.where(fresh[:, None], -np.inf, self.stamp[groups]),
                                        np.maximum.reduceat(rows_of(stamps, rows[order]), starts, axis=0))
        firsts = rows[order][starts]
        # a sparse round's result is as wide as its widest packet (the holders'); a dense round's
        # packets all have one size
        sizes = np.maximum.reduceat(headers["size"].astype(np.int64)[rows[order]], starts)
        self.size[groups] = np.where(fresh, sizes, np.maximum(self.size[groups], sizes))
        self.ident[groups] = np.where(fresh, keys[0][firsts], self.ident[groups])
        self.nkey[groups] = np.minimum(np.where(fresh, _NO_NEXT, self.nkey[groups]),
                                       np.minimum.reduceat(keys[1][rows[order]], starts))
        self.chunk[groups] = np.where(fresh, headers["chunk"][firsts], self.chunk[groups])
        self.count[groups] = np.where(fresh, 0, self.count[groups]) + counts
        owned = np.where((headers["flags"].astype(np.int64)[rows[order]] & FLAG_OWNER) > 0, worker[order], -1)
        self.owner[groups] = np.maximum(np.where(fresh, -1, self.owner[groups]), np.maximum.reduceat(owned, starts))
        self.stats.payload_bytes += int((headers["size"][rows].astype(np.int64) * 256).sum())
        done = groups[self.count[groups] == self.workers]
        if not len(done):
            return ()
        # in the order a per-packet switch completes them: by the last contribution
        last = np.maximum.reduceat(order, starts)[self.count[groups] == self.workers]
        done = done[np.argsort(last, kind="stable")]
        self.stats.results += len(done)
        return self._complete(done)

    def _complete(self, done: np.ndarray) -> tuple[np.ndarray, ...]:
        """The results of completed copies, in order: a multicast each, but for a reduce_scatter's
        round, the sum to its owner and a completion for the others."""
        scatter = (self.ident[done] < 0) & (self.ident[done] > GATHER_IDENT) & (self.owner[done] >= 0)
        if not scatter.any():
            return self._emit(done, np.full(len(done), MULTICAST), self.stamp[done])
        idx = np.repeat(done, np.where(scatter, 2, 1))
        first = np.r_[True, idx[1:] != idx[:-1]]  # each copy's first row: the owner's sum (or the multicast)
        owner = self.owner[idx]
        two = np.repeat(scatter, np.where(scatter, 2, 1))
        dest = np.where(two & first, owner, np.where(two, owner, MULTICAST))
        rec, payload, stamps, extra = self._emit(idx, dest, self.stamp[idx])
        completion = two & ~first
        rec["msg_type"] = np.where(completion, MsgType.SCATTER_DONE, rec["msg_type"])
        rec["size"] = np.where(completion, 0, rec["size"])
        payload[completion] = 0
        return rec, payload, stamps, extra

    def _sums(self, idx: np.ndarray, worker: np.ndarray, rows: np.ndarray,
              payload: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per slot copy touched: (groups, counts, starts, order, int32 sums).

        Fast path: the lockstep batch, W workers each sending the same slot copies,
        summed with one reduction over a (W, G, k) view. Otherwise: sort and reduceat.
        """
        n = len(idx)
        first_worker = worker[0]
        g = int(np.count_nonzero(worker == first_worker))
        if n % g == 0:
            w_rows = n // g
            grid_idx = idx.reshape(w_rows, g)
            grid_w = worker.reshape(w_rows, g)
            if (grid_idx == grid_idx[0]).all() and (grid_w == grid_w[:, :1]).all():
                groups = grid_idx[0]
                order_in_row = np.argsort(groups, kind="stable")
                block = rows_of(payload, rows) if not _is_range(rows) else payload[rows[0]: rows[-1] + 1]
                sums = np.add.reduce(block.reshape(w_rows, g, -1), axis=0, dtype=np.int32)
                groups, sums = groups[order_in_row], sums[order_in_row]
                # positions in the batch: row-major, so the last contribution is in the last row
                order = (np.arange(w_rows)[:, None] * g + order_in_row[None, :]).T.ravel()
                starts = np.arange(g) * w_rows
                return groups, np.full(g, w_rows), starts, order, sums
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
        counts = np.diff(np.r_[starts, len(order)])
        sums = np.add.reduceat(rows_of(payload, rows[order]), starts, axis=0, dtype=np.int32)
        return sorted_idx[starts], counts, starts, order, sums

    def _apply_one(self, row: int, idx_all: np.ndarray, worker_all: np.ndarray, headers: np.ndarray,
                   payload: np.ndarray, stamps: np.ndarray,
                   keys: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
        idx, worker = int(idx_all[row]), int(worker_all[row])
        self.bitmap[idx ^ 1, worker] = False
        if self.bitmap[idx, worker]:
            self.stats.duplicates += 1
            if self.count[idx] == self.workers:
                self.stats.answered += 1
                when = np.maximum(stamps[row], self.stamp[idx])
                out = self._emit(np.array([idx]), np.array([worker]), when[None, :])
                if SCATTER_IDENT >= self.ident[idx] > GATHER_IDENT and worker != self.owner[idx]:
                    out[0]["size"], out[1][:] = 0, 0  # the sum is the owner's: anyone else gets its header
                return out
            self.stats.dropped += 1
            return ()
        return self._apply(np.array([row]), idx_all, worker_all, headers, payload, stamps, keys)

    def _emit(self, idx: np.ndarray, dest: np.ndarray, when: np.ndarray) -> tuple[np.ndarray, ...]:
        rec = np.zeros(len(idx), AGG_HEADER)
        sparse = self.ident[idx] >= SPARSE_IDENT
        rec["msg_type"] = np.where(sparse, MsgType.SPARSE_RESULT, MsgType.RESULT)
        kind = np.where(self.ident[idx] == GATHER_IDENT, FLAG_GATHER,
                        np.where((self.ident[idx] < 0) & (self.ident[idx] > GATHER_IDENT), FLAG_SCATTER, 0))
        rec["flags"] = (idx & 1) | kind
        rec["job"] = self.job
        rec["worker"] = dest
        rec["num_workers"] = self.workers
        rec["slot"] = idx >> 1
        rec["exponent"] = np.where(sparse, 127 - (self.nkey[idx] & 0xFF), self.exp[idx])
        rec["size"] = self.size[idx]
        rec["chunk"] = self.chunk[idx]
        extra = np.zeros((len(idx), 2), np.uint32)
        extra[:, 0] = np.where(sparse, self.ident[idx] - SPARSE_IDENT, 0)
        extra[:, 1] = np.where(sparse, self.nkey[idx] >> 8, 0)
        return (rec, self.acc[idx].copy(), np.asarray(when, dtype=np.float64).reshape(len(idx), 2), extra)

    def _results(self, parts: list[tuple[np.ndarray, ...]]) -> Results:
        parts = [p for p in parts if p]
        if not parts:
            return Results(np.zeros(0, AGG_HEADER), np.zeros((0, self.k), np.int32), np.zeros((0, 2)),
                           np.zeros((0, 2), np.uint32))
        return Results(*(np.concatenate([p[i] for p in parts]) for i in range(4)))
