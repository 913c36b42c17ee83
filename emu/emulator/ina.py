"""The workers' side of in-network aggregation: a transport-free state machine.

One ``InaGroup`` holds the streams of all the workers a host runs, as arrays
(workers x slots), so that a pass over hundreds of workers is a few numpy calls.

Each worker's stream runs across its all_reduce collectives in issue order. Chunk
``c`` uses slot ``c mod S`` and copy ``(c div S) mod 2``; a slot is used again (by
chunk ``c + S``) only once chunk ``c``'s result came back: the self-clocking
stream, ``S`` chunks in flight at most.

A collective of ``D`` data blocks (``k`` elements each) starts with ``X = min(S, D)``
exponent-only chunks, which make the workers agree (through the switch's maximum)
on the exponents of blocks ``0..X-1``; data block ``b`` then goes as chunk
``base + X + b``, quantized with the agreed exponent, and carries the worker's
exponent of block ``b + S``, the block that will next use its slot (so for
``b >= X`` the result that frees a slot also brings the exponent its next block needs).

A sparse float all_reduce, where the fabric has the sparse stream, runs it instead
(``emu.emulator.sparse_ina``): announcements where the exponent chunks go, then rounds that
carry only the blocks some worker holds.

The group decides what to send and when (emulated time); the host moves the bytes
and runs the links. Loss recovery: a packet the links lost (or whose result they
lost) is sent again ``rto`` after it was sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emu.emulator import fixedpoint
from emu.emulator.payload import Block, block, holds, is_sparse, is_wide, sparse_sum_units
from emu.emulator.recorded import RecordedPayload
from emu.emulator.sparse_ina import NONE, SparseStream, held_blocks, streams_sparse
from emu.emulator.wire import AGG_HEADER, BLOCK_NONE, FLAG_COPY, MsgType
from emu.traces.model import Sparsity

IDLE, SENT = 0, 1


@dataclass(frozen=True)
class InaParams:
    slots: int  # S: the pool, and the window of chunks in flight
    elements: int  # k per packet
    workers: int  # N in the job
    job: int
    seed: int
    scale: int = 1  # R: emulated packets per real packet
    emulated_slots: int = 0  # the emulated pool (for the exponent round's size on the wire)
    sparse_stream: bool = False  # the switch runs the sparse stream (emu.emulator.sparse_ina)


class InaCollective:
    """One all_reduce in the stream of every worker of a group."""

    def __init__(self, seq: int, dtype: str, real_elements: int, emu_packets: int, base: int,
                 params: InaParams, m: int, sparsity: Sparsity | None = None) -> None:
        self.seq, self.dtype, self.real_elements, self.emu_packets = seq, dtype, real_elements, emu_packets
        self.sparsity = sparsity if is_sparse(sparsity, dtype) else None  # the payload's (emu.emulator.payload)
        self.base = base
        self.recorded: RecordedPayload | None = None  # the real ranks' tensors, where they are sent (emu run)
        k, s = params.elements, params.slots
        self.blocks = -(-real_elements // k) if real_elements else 0  # packets of real elements
        self.data_blocks = self.blocks  # data chunks: one per block, or the sparse stream's rounds
        self.stream: SparseStream | None = None
        self.exp_chunks = min(s, self.data_blocks)
        self.agreed = np.full(self.data_blocks + s, fixedpoint.EXP_NONE, np.int8)
        self.start_us = np.full(m, np.nan)
        self.exp_known = np.full((m, self.exp_chunks), math.inf)
        self.done = np.zeros(m, np.int64)
        self.end_us = np.zeros(m)
        self.finished = np.full(m, self.data_blocks == 0)

    @property
    def chunks(self) -> int:
        return self.exp_chunks + self.data_blocks


@dataclass
class Packets:
    """Contributions of the group's workers, with the local worker index of each row."""

    local: np.ndarray
    headers: np.ndarray
    payload: np.ndarray  # (n, k) int32, zeros for exponent-only chunks
    send_us: np.ndarray
    emu_packets: np.ndarray  # emulated packets each row stands for
    retransmit: np.ndarray
    sparse: np.ndarray  # (n, 2) uint32: the sparse stream's (block, next); zeros for dense rows


@dataclass
class ResultCheck:
    elements: int = 0
    mismatches: int = 0


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


class InaGroup:
    def __init__(self, workers: np.ndarray, params: InaParams, cache: PayloadCache | None = None,
                 recorded: RecordedPayload | None = None) -> None:
        self.wids = np.asarray(workers, dtype=np.int64)
        self.recorded = recorded
        self.m = len(self.wids)
        self.p = params
        s = params.slots
        self.slot_chunk = np.tile(np.arange(s, dtype=np.int64), (self.m, 1))
        self.slot_state = np.full((self.m, s), IDLE, np.int8)
        self.free_at = np.zeros((self.m, s))
        self.sent_at = np.zeros((self.m, s))
        self.colls: list[InaCollective] = []
        self.by_seq: dict[int, InaCollective] = {}
        self.bases: list[int] = []
        self.end = 0
        self.retransmissions = 0
        self.cache = cache or PayloadCache(params.seed, params.workers)

    # -- the stream -------------------------------------------------------------------
    def collective(self, seq: int, dtype: str, real_elements: int, emu_packets: int,
                   sparsity: Sparsity | None = None) -> InaCollective:
        """The stream's collective number ``seq`` (added when the first worker starts it); its payload
        follows ``sparsity`` where given (the same on every worker)."""
        coll = self.by_seq.get(seq)
        if coll is None:
            if self.colls and seq < self.colls[-1].seq:
                raise ValueError(f"collective {seq} joins the stream after {self.colls[-1].seq}")
            coll = InaCollective(seq, dtype, real_elements, emu_packets, self.end, self.p, self.m, sparsity)
            if self.recorded is not None and coll.sparsity is None:
                if self.recorded.kept(seq) < real_elements:
                    raise ValueError(f"collective {seq}: {real_elements} elements to send, "
                                     f"{self.recorded.kept(seq)} recorded")
                coll.recorded = self.recorded
            if self.p.sparse_stream and coll.sparsity is not None and streams_sparse(
                    coll.sparsity, dtype, real_elements, self.p.elements, self.p.slots):
                self._plan_sparse(coll)
            self.colls.append(coll)
            self.by_seq[seq] = coll
            self.bases.append(coll.base)
            self.end += coll.chunks
        return coll

    def _plan_sparse(self, coll: InaCollective) -> None:
        """Make ``coll`` a sparse stream: S announcements, then S rounds per union block of the
        longest partition."""
        assert coll.sparsity is not None
        s = self.p.slots
        owner = None if is_wide(coll.dtype) else self.cache.span(coll, 0, coll.real_elements, "owner")
        held, union = held_blocks(self.p.seed, coll.seq, coll.real_elements, self.p.elements, self.p.workers,
                                  self.wids, coll.sparsity, coll.dtype, owner)
        coll.stream = SparseStream(held, union, s)
        coll.exp_chunks = s
        coll.data_blocks = s * coll.stream.rounds
        coll.exp_known = np.full((self.m, s), math.inf)
        coll.finished = np.zeros(self.m, bool)

    def locate(self, chunks: np.ndarray) -> np.ndarray:
        """The index (in issue order) of the collective each chunk belongs to."""
        return np.searchsorted(np.asarray(self.bases), chunks, side="right") - 1

    def next_packets(self, retransmit: list[tuple[int, int, float, float]] | None = None) -> Packets | None:
        """Every chunk any worker may send now, with send times, and the given retransmissions:
        (worker, slot, when, emulated packets it stands for: those lost, with payload scale)."""
        li, si = np.nonzero((self.slot_state == IDLE) & (self.slot_chunk < self.end))
        parts = []
        if len(li):
            chunks = self.slot_chunk[li, si]
            which = self.locate(chunks)
            for ci in np.unique(which):
                mine = which == ci
                part = self._build(self.colls[ci], li[mine], si[mine], chunks[mine], retx=False)
                if part is not None:
                    parts.append(part)
        for local, slot, when, lost in retransmit or ():
            if self.slot_state[local, slot] != SENT:
                continue
            chunk = self.slot_chunk[local, slot]
            coll = self.colls[int(self.locate(np.array([chunk]))[0])]
            part = self._build(coll, np.array([local]), np.array([slot]), np.array([chunk]), retx=True, at=when)
            if part is not None:
                part.emu_packets = np.minimum(part.emu_packets, lost)
                self.retransmissions += 1
                parts.append(part)
        if not parts:
            return None
        fields = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit", "sparse")
        pk = Packets(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))
        order = np.lexsort((pk.send_us, pk.local))  # per worker in time order: its uplink's FIFO
        return Packets(*(getattr(pk, f)[order] for f in fields))

    def _build(self, coll: InaCollective, li: np.ndarray, si: np.ndarray, chunks: np.ndarray, retx: bool,
               at: float = 0.0) -> Packets | None:
        x, k, s = coll.exp_chunks, self.p.elements, self.p.slots
        local = chunks - coll.base
        is_exp = local < x
        b = np.where(is_exp, local, local - x)
        start = coll.start_us[li]
        if retx:
            ready = np.ones(len(li), bool)
            send = np.full(len(li), at)
        else:
            known = np.where(is_exp | (b >= x), 0.0, coll.exp_known[li, np.minimum(b, max(x - 1, 0))]
                             if x else 0.0)
            ready = ~np.isnan(start) & (known < math.inf)
            if not ready.any():
                return None
            li, si, chunks, is_exp, b, start, known = (a[ready] for a in (li, si, chunks, is_exp, b, start, known))
            send = np.maximum(np.maximum(self.free_at[li, si], start), known)
        n = len(li)
        h = np.zeros(n, AGG_HEADER)
        h["msg_type"] = MsgType.CONTRIB
        h["flags"] = (chunks // s) % 2 * FLAG_COPY
        h["job"] = self.p.job
        h["worker"] = self.wids[li]
        h["num_workers"] = self.p.workers
        h["slot"] = si
        h["chunk"] = chunks
        self.slot_state[li, si] = SENT
        self.sent_at[li, si] = send
        if coll.stream is not None:
            return self._build_sparse(coll, h, li, is_exp, b, send, retx)
        target = np.where(is_exp, b, b + s)
        has = target < coll.blocks
        exps = np.full(n, fixedpoint.EXP_NONE, np.int8)
        if has.any():
            exps[has] = self.exponents(coll, li[has], target[has])
        h["exponent"] = exps
        h["size"] = np.where(is_exp, 0, k // 64)
        payload = np.zeros((n, k), np.int32)
        data = np.flatnonzero(~is_exp)
        if len(data):
            payload[data] = self.quantized(coll, li[data], b[data])
        return Packets(li, h, payload, send, self._emu_packets(coll, b, is_exp), np.full(n, retx),
                       np.zeros((n, 2), np.uint32))

    def _build_sparse(self, coll: InaCollective, h: np.ndarray, li: np.ndarray, is_exp: np.ndarray,
                      i: np.ndarray, send: np.ndarray, retx: bool) -> Packets:
        """The sparse stream's packets: an announcement (data chunk ``i`` is round ``i // S`` of
        partition ``i % S``), the round's block from its holders, a header from everyone else."""
        st = coll.stream
        assert st is not None
        n, k, s = len(li), self.p.elements, self.p.slots
        j, r = i % s, i // s
        blk = np.where(is_exp, NONE, st.ublock[j, np.where(is_exp, 0, r)])
        assert (blk >= NONE).all(), "a round's block is named by the result before it"
        has = blk >= 0
        holder = np.zeros(n, bool)
        holder[has] = st.held[li[has], blk[has]]
        nxt = np.full(n, NONE, np.int64)
        nxt[is_exp] = st.first[li[is_exp], j[is_exp]]
        nxt[has] = st.nxt[li[has], blk[has]]
        exps = np.full(n, fixedpoint.EXP_NONE, np.int8)
        named = nxt >= 0
        if named.any():
            exps[named] = self.exponents(coll, li[named], nxt[named])
        h["msg_type"] = MsgType.SPARSE_CONTRIB
        h["exponent"] = exps
        h["size"] = np.where(holder, k // 64, 0)
        payload = np.zeros((n, k), np.int32)
        if holder.any():
            payload[holder] = self.quantized(coll, li[holder], blk[holder])
        extra = np.stack([np.where(has, blk, BLOCK_NONE), np.where(named, nxt, BLOCK_NONE)], axis=1).astype(np.uint32)
        return Packets(li, h, payload, send, self._emu_packets_sparse(coll, blk, is_exp), np.full(n, retx), extra)

    def _emu_packets_sparse(self, coll: InaCollective, blk: np.ndarray, is_exp: np.ndarray) -> np.ndarray:
        """As the dense stream's, with the round's block for ``b``; a header-only round after a
        partition's end stands for one packet."""
        return np.where(~is_exp & (blk < 0), 1.0, self._emu_packets(coll, blk, is_exp))

    def _emu_packets(self, coll: InaCollective, b: np.ndarray, is_exp: np.ndarray) -> np.ndarray:
        r = self.p.scale
        last = coll.blocks - 1
        per = np.where(~is_exp & (b == last), max(1.0, float(coll.emu_packets - r * last)), float(r))
        if coll.exp_chunks:
            emu_window = self.p.emulated_slots or self.p.slots * r
            per = np.where(is_exp, min(emu_window, coll.emu_packets) / coll.exp_chunks, per)
        return per

    # -- data -------------------------------------------------------------------------
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
        return span.reshape(-1, k)[blocks - first]

    def units(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Workers li's payload units of data blocks (one int32 row each, k wide, zero padded) and
        each block's power-of-two scale beta: the values are ``units * 2**beta``, exactly.

        The workers of a host mostly send the same blocks: the shared parts are gathered once
        per distinct block, and each row only adds its worker's own elements.
        """
        k = self.p.elements
        if not len(blocks):
            return np.zeros((0, k), np.int32), np.zeros(0, np.int64)
        uniq, inv = np.unique(blocks, return_inverse=True)
        owner = self._rows(coll, uniq, "owner", np.int32)
        tail = coll.real_elements - uniq * k
        owner[np.arange(k)[None, :] >= tail[:, None]] = -1  # padding belongs to nobody
        own = self._rows(coll, uniq, "own", np.int32)
        common = self._rows(coll, uniq, "common", np.int32)
        beta = self._rows(coll, uniq, "beta", np.int32)[:, 0].astype(np.int64)  # constant per block
        units = common[inv] + np.where(owner[inv] == self.wids[li][:, None], own[inv], np.int32(0))
        if coll.sparsity is not None:  # zero outside the blocks each worker holds (padding: held by nobody)
            holders = self._rows(coll, uniq, "holders", np.int32)
            mul = self._rows(coll, uniq, "mul", np.int64)
            add = self._rows(coll, uniq, "add", np.int32)
            held = holds(mul[inv], add[inv], holders[inv], self.p.workers, self.wids[li][:, None])
            units = np.where(held, units, np.int32(0))
        return units, beta[inv]

    def values(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Workers li's values of data blocks, float32 (what a real worker's gradient block holds);
        float64 rows of the real ranks' tensors where they are sent."""
        if coll.recorded is not None:
            return coll.recorded.rows(coll.seq, self.wids[li], blocks, self.p.elements)
        units, beta = self.units(coll, li, blocks)
        return units * np.exp2(beta.astype(np.float32))[:, None]

    def exponents(self, coll: InaCollective, li: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Each row's block exponent: the smallest e with 2**e >= max|x| (``fixedpoint.block_exponents``
        of ``values``, computed on the integer units: |x| = |units| * 2**beta)."""
        if coll.recorded is not None:
            return fixedpoint.block_exponents(self.values(coll, li, blocks))
        units, beta = self.units(coll, li, blocks)
        peak = np.abs(units).max(axis=1).astype(np.int64)
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
        return np.left_shift(units, shift.astype(np.int32)[:, None])

    def expected_sums(self, coll: InaCollective, blocks: np.ndarray) -> np.ndarray:
        """The exact int32 sums the switch must return for data blocks (rows, zero padded)."""
        n = self.p.workers
        if coll.recorded is not None:  # every worker quantizes its real rank's rows: n / K of each
            ranks = coll.recorded.rank_rows(coll.seq, blocks, self.p.elements)
            agreed = coll.agreed[blocks]
            q = np.stack([fixedpoint.quantize(r, agreed, n).astype(np.int64) for r in ranks])
            return (n // coll.recorded.real_ranks) * q.sum(axis=0)
        uniq, inv = np.unique(blocks, return_inverse=True)  # gathered once each, page by page
        common = self._rows(coll, uniq, "common", np.int64)
        own = self._rows(coll, uniq, "own", np.int64)
        if coll.sparsity is None:
            units = n * common + own
        else:  # H_B workers hold the block, and its owner is one of them (emu.emulator.payload)
            units = sparse_sum_units(self._rows(coll, uniq, "holders", np.int64), common, own)
        units = units[inv]
        beta = self._rows(coll, uniq, "beta", np.int64)[inv]
        agreed = coll.agreed[blocks]
        none = agreed == fixedpoint.EXP_NONE
        shift = np.where(none, 0, fixedpoint.scale_shift(agreed, n))
        out = (units * np.exp2((beta + shift[:, None]).astype(np.float64))).astype(np.int64)
        return np.where(none[:, None], 0, out)

    def emu_packets_of(self, headers: np.ndarray, extra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For results: emulated packets each stands for, and whether it carries a payload."""
        chunks = headers["chunk"].astype(np.int64)
        per = np.zeros(len(chunks))
        which = self.locate(chunks)
        for ci in np.unique(which):
            coll = self.colls[ci]
            mine = which == ci
            local = chunks[mine] - coll.base
            is_exp = local < coll.exp_chunks
            if coll.stream is not None:
                blk = np.where(extra[mine, 0] == BLOCK_NONE, NONE, extra[mine, 0].astype(np.int64))
                per[mine] = self._emu_packets_sparse(coll, blk, is_exp)
            else:
                per[mine] = self._emu_packets(coll, np.where(is_exp, local, local - coll.exp_chunks), is_exp)
        return per, headers["size"] > 0

    # -- results ----------------------------------------------------------------------
    def on_results(self, li: np.ndarray, rb: np.ndarray, headers: np.ndarray, payload: np.ndarray,
                   first_us: np.ndarray, last_us: np.ndarray | None = None, verify: np.ndarray | None = None,
                   check: ResultCheck | None = None,
                   extra: np.ndarray | None = None) -> list[tuple[int, InaCollective]]:
        """Results reaching workers: result ``rb[i]`` of the message reached worker ``li[i]``, its
        first packet at ``first_us[i]`` and its last at ``last_us[i]`` (with payload scale a row
        stands for many packets: the next chunk on the slot goes when the first is back, as the
        emulated packets self-clock one by one; the collective ends when the last is back).

        ``verify`` holds per message row the mismatches found in it, or -1 while unchecked: each
        row is checked once (every worker of a host receives the same bytes), and every worker it
        reaches counts its elements and mismatches, so the totals do not depend on how workers
        are spread over hosts. ``extra``: the message's (block, next) rows (the sparse stream's).
        Returns (local worker, collective) pairs that just completed.
        """
        if extra is None:
            extra = np.zeros((len(headers), 2), np.uint32)
        chunks = headers["chunk"][rb].astype(np.int64)
        slots = headers["slot"][rb].astype(np.int64)
        ok = (self.slot_state[li, slots] == SENT) & (self.slot_chunk[li, slots] == chunks)
        rows = np.flatnonzero(ok)
        if len(rows):  # a worker may get a slot's result twice in one message: the first counts
            key = li[rows] * self.p.slots + slots[rows]
            _, first = np.unique(key, return_index=True)
            rows = rows[np.sort(first)]
        if not len(rows):
            return []
        arrival_us = first_us
        last_us = first_us if last_us is None else last_us
        finished = []
        advance = np.full(len(rows), self.p.slots, np.int64)  # how far each slot's next chunk is
        which = self.locate(chunks[rows])
        for ci in np.unique(which):
            coll = self.colls[ci]
            sel = which == ci
            r = rows[sel]
            if coll.stream is not None:
                advance[sel] = self._sparse_results(coll, r, li, rb, headers, payload, arrival_us, last_us,
                                                    verify, check, extra, finished)
                continue
            w = li[r]
            local = chunks[r] - coll.base
            t = arrival_us[r]
            t_last = last_us[r]
            exps = headers["exponent"][rb[r]].astype(np.int8)
            is_exp = local < coll.exp_chunks
            coll.exp_known[w[is_exp], local[is_exp]] = t[is_exp]
            coll.agreed[local[is_exp]] = exps[is_exp]
            d = ~is_exp
            if d.any():
                b = local[d] - coll.exp_chunks
                coll.agreed[b + self.p.slots] = exps[d]
                if check is not None and verify is not None:
                    msg_rows = rb[r[d]]
                    todo = verify[msg_rows] < 0
                    if todo.any():
                        self._check(coll, msg_rows[todo], b[todo], payload, verify)
                    real = np.minimum(self.p.elements, coll.real_elements - b * self.p.elements)
                    check.elements += int(real.sum())
                    check.mismatches += int(verify[msg_rows].sum())
                np.add.at(coll.done, w[d], 1)
                np.maximum.at(coll.end_us, w[d], t_last[d])
                newly = (coll.done >= coll.data_blocks) & ~coll.finished
                for local_w in np.flatnonzero(newly):
                    coll.finished[local_w] = True
                    finished.append((int(local_w), coll))
        w, s = li[rows], slots[rows]
        self.slot_chunk[w, s] = chunks[rows] + advance
        self.slot_state[w, s] = IDLE
        self.free_at[w, s] = arrival_us[rows]
        return finished

    def _sparse_results(self, coll: InaCollective, r: np.ndarray, li: np.ndarray, rb: np.ndarray,
                        headers: np.ndarray, payload: np.ndarray, arrival_us: np.ndarray, last_us: np.ndarray,
                        verify: np.ndarray | None, check: ResultCheck | None, extra: np.ndarray,
                        finished: list[tuple[int, InaCollective]]) -> np.ndarray:
        """Results of the sparse stream reaching workers (rows ``r``): learn each partition's next
        block and its exponent, verify the blocks summed, count the rounds done (and those a
        partition that ended skips). Returns how far each row's slot moves on."""
        st = coll.stream
        assert st is not None
        s = self.p.slots
        w = li[r]
        local = headers["chunk"][rb[r]].astype(np.int64) - coll.base
        is_exp = local < s
        i = np.where(is_exp, local, local - s)
        j, rnd = i % s, np.where(is_exp, -1, i // s)
        blk = np.where(extra[rb[r], 0] == BLOCK_NONE, NONE, extra[rb[r], 0].astype(np.int64))
        nxt = np.where(extra[rb[r], 1] == BLOCK_NONE, NONE, extra[rb[r], 1].astype(np.int64))
        exps = headers["exponent"][rb[r]].astype(np.int8)
        st.ublock[j, rnd + 1] = nxt  # every worker gets the same results: the same writes
        named = nxt >= 0
        coll.agreed[nxt[named]] = exps[named]
        coll.exp_known[w[is_exp], j[is_exp]] = arrival_us[r][is_exp]
        skip = np.where(nxt < 0, st.skipped(rnd), 0)
        d = ~is_exp
        summed = d & (blk >= 0)
        if check is not None and verify is not None and summed.any():
            msg_rows = rb[r[summed]]
            todo = verify[msg_rows] < 0
            if todo.any():
                self._check(coll, msg_rows[todo], blk[summed][todo], payload, verify)
            real = np.minimum(self.p.elements, coll.real_elements - blk[summed] * self.p.elements)
            check.elements += int(real.sum())
            check.mismatches += int(verify[msg_rows].sum())
        # a sparse collective is done once every chunk of its range came back or was skipped (the
        # announcements count: with no union block they are all there is)
        np.add.at(coll.done, w, 1 + skip)
        np.maximum.at(coll.end_us, w, last_us[r])
        newly = (coll.done >= coll.chunks) & ~coll.finished
        for local_w in np.flatnonzero(newly):
            coll.finished[local_w] = True
            finished.append((int(local_w), coll))
        return s * (1 + skip)

    def _check(self, coll: InaCollective, rows: np.ndarray, blocks: np.ndarray, payload: np.ndarray,
               verify: np.ndarray) -> None:
        """Compare message rows with the exact sums; store each row's mismatches in ``verify``."""
        uniq, first = np.unique(rows, return_index=True)
        blocks = blocks[first]
        want = self.expected_sums(coll, blocks)
        got = payload[uniq].astype(np.int64)
        real = np.arange(self.p.elements)[None, :] < (coll.real_elements - blocks * self.p.elements)[:, None]
        verify[uniq] = np.count_nonzero((got != want) & real, axis=1)

    def pending(self) -> bool:
        return any(not c.finished.all() for c in self.colls)
