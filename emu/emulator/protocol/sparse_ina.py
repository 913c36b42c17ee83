"""The workers' side of the sparse aggregation stream (docs/sparse.md, "The sparse INA stream").

OmniReduce's idea on emu's switch: a sparse float all_reduce streams only the blocks (packets
of ``k`` elements) that some worker holds. Slot ``j`` of the pool owns partition ``j``, the
blocks ``b`` with ``b mod S = j``, and runs its rounds one after the other:

- **announcement** (the first chunk on each slot): every worker sends a header naming its
  first non-zero block of the partition, with that block's exponent; the switch's result
  carries the minimum, and the largest exponent among the workers that named it;
- **round r**: the block the previous result named. Its holders send its data, quantized with
  the agreed exponent; every other worker sends a header alone. Every packet names the
  sender's next non-zero block of the partition (and its exponent), so the result brings the
  next block any worker holds; a block nobody holds is never sent;
- **the end**: a result naming no block (``BLOCK_NONE``) ends the partition.

A packet is one block here, whatever the sparsity's ``block_elements``: it is non-zero where any
element is (OmniReduce's zero threshold).

Every worker sends in every round (a header where it holds nothing). That keeps the dense
protocol's completion rule (a round completes when every worker's packet is in), its two
copies per slot and its loss recovery (a duplicate is answered from the shadow copy) unchanged:
a worker that only listened could lose a result and find the copy reused by the time it asked
again. The cost is one header (90 bytes on the wire) per round from each worker without data.

In emu's stream a collective is a range of chunk numbers: ``S`` announcements, then ``S R``
rounds (``R``: the most union blocks of any partition), chunk ``S + r S + j`` being round
``r`` of partition ``j``, on the same slot as its announcement. A partition that ends early
skips its remaining rounds: the slot goes on to the next collective's chunk, after one more
header-only round when an odd number of rounds is skipped, since a slot's copies must
alternate (the switch tells a new round from a retransmission by them). ``R`` comes from the
payload model's union (the same on every worker); the protocol itself learns each block from
the results.
"""

from __future__ import annotations

import numpy as np

from emu.emulator.payload.generated import block, holding, is_sparse, is_wide
from emu.emulator.protocol.wire import SPARSE_EXTRA, agg_wire_bytes
from emu.traces.model import Sparsity

NONE = -1  # no block: an announcement's, or past a partition's last
UNKNOWN = -2  # a round whose block no result has named yet


def streams_sparse(sparsity: Sparsity | None, dtype: str, real_elements: int, elements: int, slots: int) -> bool:
    """Whether an all_reduce runs the sparse stream on a fabric that has one: a sparse float payload
    with at least one block (packet) per slot, and a union sparse enough that the 8 more header
    bytes per packet pay (``u (wire(k) + 8) < wire(k)``, ``u`` the packets' union: a packet spanning
    ``c`` sparsity blocks is in it with about ``1 - (1 - u)^c``). The framework's own sparse
    all_reduce (``sparse_tensor``) runs it whatever the cost. The same answer on every worker: it
    depends only on the collective and the job's sparsity."""
    if sparsity is None or not is_sparse(sparsity, dtype) or real_elements == 0:
        return False
    if sparsity.sparse_tensor:
        return True
    if -(-real_elements // elements) < slots:
        return False
    full = agg_wire_bytes(elements)
    return packet_union(sparsity, elements) * (full + SPARSE_EXTRA) < full


def packet_union(sparsity: Sparsity, elements: int) -> float:
    """The expected fraction of packets of ``elements`` non-zero on some worker: ``u`` where a packet
    lies within one sparsity block, ``1 - (1 - u)^c`` where it spans ``c`` of them."""
    return 1 - (1 - sparsity.union) ** max(1.0, elements / sparsity.block_elements)


class SparseStream:
    """One sparse collective's stream for a group's workers: what each holds, and what the results
    said so far."""

    def __init__(self, held: np.ndarray, union: np.ndarray, slots: int) -> None:
        m, blocks = held.shape
        self.slots, self.blocks = slots, blocks
        t = -(-blocks // slots)
        grid = np.zeros((m, t * slots), bool)
        grid[:, :blocks] = held
        tidx = np.where(grid.reshape(m, t, slots), np.arange(t)[None, :, None], t)
        from_here = np.minimum.accumulate(tidx[:, ::-1, :], axis=1)[:, ::-1, :]  # first held at or after
        after = np.concatenate([from_here[:, 1:, :], np.full((m, 1, slots), t)], axis=1)
        col = np.arange(slots)[None, None, :]
        self.held = held
        # per worker and block: the next block it holds in the block's partition (NONE: none)
        self.nxt = np.where(after < t, after * slots + col, NONE).reshape(m, t * slots)[:, :blocks]
        self.first = np.where(from_here[:, 0, :] < t, from_here[:, 0, :] * slots + col[0], NONE)  # (m, S)
        self.per_partition = partition_rounds(union, slots)
        self.rounds = int(self.per_partition.max()) if blocks else 0
        self.union_blocks = int(union.sum())
        # the block of round r of partition j, as the results name them (the same for every worker)
        self.ublock = np.full((slots, self.rounds + 1), UNKNOWN, np.int64)

    def skipped(self, round_done: np.ndarray) -> np.ndarray:
        """After a result that ended a partition at round ``round_done`` (-1: its announcement), the
        rounds the slot skips: all those left when they are even, else none (one header-only round
        first, so that the slot's copies keep alternating)."""
        left = self.rounds - (round_done + 1)
        return np.where(left % 2 == 0, left, 0)


def partition_rounds(union: np.ndarray, slots: int) -> np.ndarray:
    """The union blocks of each partition (block ``b`` in partition ``b mod S``): its rounds."""
    t = -(-len(union) // slots)
    u = np.zeros(t * slots, bool)
    u[: len(union)] = union
    return u.reshape(t, slots).sum(axis=0)


def held_blocks(seed: int, seq: int, real_elements: int, elements: int, workers: int, wids: np.ndarray,
                sparsity: Sparsity, dtype: str, owner: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per worker of ``wids``, which blocks (packets of ``elements``) hold a non-zero element, and
    which blocks some worker holds, from the payload model (emu.emulator.payload.generated): in a wide
    dtype every element of a sparsity block its holder holds is non-zero; in a 16-bit one only
    those it owns (``owner``: every real element's owner, needed then). A packet may cover parts
    of several sparsity blocks (any ``block_elements``): it is non-zero where any of them is."""
    k, n = elements, real_elements
    blocks = -(-n // k)
    if blocks == 0:
        return np.zeros((len(wids), 0), bool), np.zeros(0, bool)
    kb = sparsity.block_elements
    first = np.arange(blocks) * k // kb
    last = (np.minimum(np.arange(1, blocks + 1) * k, n) - 1) // kb
    hold = holding(seed, seq, np.arange(int(last[-1]) + 1), workers, sparsity)

    def any_of(per_block: np.ndarray) -> np.ndarray:  # (..., sparsity blocks) -> (..., packets)
        out = per_block[..., first]
        for o in range(1, int((last - first).max()) + 1):
            out = out | per_block[..., np.minimum(first + o, last)]
        return out

    union = any_of(hold.holders > 0)
    if is_wide(dtype):
        return any_of(hold.held(np.asarray(wids, np.int64)[:, None])), union
    assert owner is not None and len(owner) == n
    lut = np.full(max(workers, 1), -1, np.int64)
    lut[wids] = np.arange(len(wids))
    local = lut[owner]
    # outside the union an element's owner holds nothing (payload.py: the owner is one of H_B = 0 holders)
    mine = np.flatnonzero((local >= 0) & (hold.holders[np.arange(n) // kb] > 0))
    held = np.zeros((len(wids), blocks), bool)
    held[local[mine], mine // k] = True
    return held, union


_WORKERS_PER_PASS = 256  # counting every worker's blocks, a few at a time: memory stays small


def stream_bytes(seed: int, seq: int, real_elements: int, elements: int, slots: int, workers: int,
                 sparsity: Sparsity, dtype: str) -> tuple[float, float]:
    """(sent, dense): the bytes of values and indices a sparse stream carries over every link, and
    the values a dense stream would: per worker and direction, ``4 k`` for each block it sends or
    receives, and the sparse header's 8 bytes (block, next) on every packet (announcements and
    header-only rounds included), counted from the same hashes that make the payload (every
    worker's blocks: O(workers x real elements), which the payload scale bounds)."""
    k = elements
    blocks = -(-real_elements // k)
    owner = None if is_wide(dtype) else block(seed, seq, 0, real_elements, workers, dtype, sparsity).owner
    held_total, union = 0, np.zeros(blocks, bool)
    for lo in range(0, workers, _WORKERS_PER_PASS):
        wids = np.arange(lo, min(workers, lo + _WORKERS_PER_PASS))
        held, union = held_blocks(seed, seq, real_elements, k, workers, wids, sparsity, dtype, owner)
        held_total += int(held.sum())
    per_partition = partition_rounds(union, slots)
    rounds = int(per_partition.max()) if blocks else 0
    # a partition's rounds, and one header-only round more where it skips an odd number
    packets = slots + int(per_partition.sum()) + int(((rounds - per_partition) % 2).sum())
    values = 4 * k * (float(held_total) + workers * float(union.sum()))
    sent = values + 2 * workers * packets * SPARSE_EXTRA
    return sent, 2.0 * workers * blocks * 4 * k
