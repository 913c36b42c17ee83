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
(``emu.emulator.protocol.sparse_ina``): announcements where the exponent chunks go, then rounds that
carry only the blocks some worker holds.

A reduce_scatter and an all_gather run on the same stream (docs/protocol.md, "Reduce-scatter and
all-gather"). Their tensor is the group's ``g`` shards, each cut into ``P`` blocks of its own (a
block never spans two shards; a shard's last block is padded), so block ``b`` is shard
``b // P``'s, whose owner is worker ``b // P``. A reduce_scatter's blocks go as an all_reduce's do
(the exponent chunks first, every worker's block quantized), flagged ``FLAG_SCATTER`` and, on the
owner's packet, ``FLAG_OWNER``: the sum comes back to the owner alone, a header-only completion
(with the exponent the slot's next block needs) to the others. An all_gather needs no exponents:
the owner of each block sends it, its int32 lanes as they are (the bytes of its shard), the others
a header, and the block comes back to all, bit for bit.

The group decides what to send and when (emulated time); the host moves the bytes
and runs the links. Loss recovery: a packet the links lost (or whose result they
lost) is sent again ``rto`` after it was sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emu.emulator.payload.generated import is_sparse, is_wide
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.protocol import fixedpoint
from emu.emulator.protocol.ina_data import PayloadCache, StreamData
from emu.emulator.protocol.rows import distinct, every_row, rows_of
from emu.emulator.protocol.sparse_ina import NONE, SparseStream, held_blocks, streams_sparse
from emu.emulator.protocol.wire import AGG_HEADER, BLOCK_NONE, FLAG_COPY, FLAG_GATHER, FLAG_OWNER, FLAG_SCATTER, MsgType
from emu.traces.model import CollKind, Dtype, Sparsity

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
    sparse_stream: bool = False  # the switch runs the sparse stream (emu.emulator.protocol.sparse_ina)


def shard_layout(kind: CollKind, count: int, dtype: str, params: InaParams) -> tuple[int, int, int]:
    """A reduce_scatter's or all_gather's shards on the stream: (lanes of real data a shard holds,
    blocks a shard takes, emulated packets of a shard). A reduce_scatter's lane is an element in
    fixed point; an all_gather's carries 4 bytes of the tensor as they are."""
    shard = -(-count // params.workers)  # a count that does not divide: the last shards padded
    k, r = params.elements, max(1, params.scale)
    if kind == CollKind.REDUCE_SCATTER:
        lanes, emulated = -(-shard // r), -(-shard // k)
    else:
        size = Dtype(dtype).itemsize
        lanes, emulated = -(-(-(-shard // r) * size) // 4), -(-(shard * size) // (4 * k))
    return lanes, -(-lanes // k) if lanes else 0, emulated


class InaCollective:
    """One all_reduce (or reduce_scatter, or all_gather) in the stream of every worker of a group."""

    def __init__(self, seq: int, dtype: str, real_elements: int, emu_packets: int, base: int,
                 params: InaParams, m: int, sparsity: Sparsity | None = None,
                 kind: CollKind = CollKind.ALL_REDUCE, count: int = 0) -> None:
        """``count``: a reduce_scatter's or all_gather's full tensor on the emulated wire."""
        self.kind = kind
        self.shard_lanes = self.shard_blocks = self.shard_emulated = 0
        if kind != CollKind.ALL_REDUCE:  # g shards of P blocks, each shard's last padded
            self.shard_lanes, self.shard_blocks, self.shard_emulated = shard_layout(kind, count, dtype, params)
            real_elements = params.workers * self.shard_blocks * params.elements
            emu_packets = params.workers * self.shard_emulated
        self.seq, self.dtype, self.real_elements, self.emu_packets = seq, dtype, real_elements, emu_packets
        self.sparsity = sparsity if is_sparse(sparsity, dtype) else None  # the payload's (emu.emulator.payload.generated)
        self.base = base
        self.recorded: RecordedPayload | None = None  # the real ranks' tensors, where they are sent (emu run)
        k, s = params.elements, params.slots
        self.blocks = -(-real_elements // k) if real_elements else 0  # packets of real elements
        self.data_blocks = self.blocks  # data chunks: one per block, or the sparse stream's rounds
        self.stream: SparseStream | None = None
        # an all_gather moves its bytes as they are: no exponents to agree on
        self.exp_chunks = 0 if kind == CollKind.ALL_GATHER else min(s, self.data_blocks)
        self.agreed = np.full(self.data_blocks + s, fixedpoint.EXP_NONE, np.int8)
        self.start_us = np.full(m, np.nan)
        self.exp_known = np.full((m, self.exp_chunks), math.inf)
        self.done = np.zeros(m, np.int64)
        self.end_us = np.zeros(m)
        self.finished = np.full(m, self.data_blocks == 0)

    @property
    def chunks(self) -> int:
        return self.exp_chunks + self.data_blocks

    def owner(self, blocks: np.ndarray) -> np.ndarray:
        """A reduce_scatter's or all_gather's block's shard, whose owner is the worker of that rank."""
        return blocks // max(1, self.shard_blocks)

    def lanes(self, blocks: np.ndarray, k: int) -> np.ndarray:
        """The lanes of real data each block holds (a shard's last block fewer: its padding is not data)."""
        if self.kind == CollKind.ALL_REDUCE:
            return np.minimum(k, self.real_elements - blocks * k)
        return np.clip(self.shard_lanes - (blocks % max(1, self.shard_blocks)) * k, 0, k)


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
    elements: int = 0  # element deliveries checked (a result row reaching 4 workers counts 4)
    mismatches: int = 0
    distinct: int = 0  # distinct elements of the results checked (at the group's first worker)


def _finish(coll: InaCollective, newly: np.ndarray, finished: list[tuple[InaCollective, np.ndarray]]) -> None:
    """Mark the local workers ``newly`` (a mask) done with ``coll``, and add them to ``finished``."""
    at = np.flatnonzero(newly)
    if len(at):
        coll.finished[at] = True
        finished.append((coll, at))


class InaGroup(StreamData):
    def __init__(self, workers: np.ndarray, params: InaParams, cache: PayloadCache | None = None,
                 recorded: RecordedPayload | None = None) -> None:
        self.wids = np.asarray(workers, dtype=np.int64)
        self.recorded = recorded
        self.m = len(self.wids)
        self.p = params
        s = params.slots
        self.slot_chunk = np.tile(np.arange(s, dtype=np.int64), (self.m, 1))
        self.slot_state = np.full((self.m, s), IDLE, np.int8)
        self._waiting: np.ndarray | None = None  # ``waiting``'s answer until a slot's state changes
        self.free_at = np.zeros((self.m, s))
        self.sent_at = np.zeros((self.m, s))
        self.colls: list[InaCollective] = []
        self.by_seq: dict[int, InaCollective] = {}
        self.bases: list[int] = []
        self.end = 0
        self.retransmissions = 0
        # per worker and slot: its resends since the slot's result last came back (what a stall
        # would show: one packet resent again and again, ``Host._check_progress``)
        self.resends = np.zeros((self.m, s), np.int64)
        self.cache = cache or PayloadCache(params.seed, params.workers)

    # -- the stream -------------------------------------------------------------------
    def collective(self, seq: int, dtype: str, real_elements: int, emu_packets: int,
                   sparsity: Sparsity | None = None, kind: CollKind = CollKind.ALL_REDUCE,
                   count: int = 0) -> InaCollective:
        """The stream's collective number ``seq`` (added when the first worker starts it); its payload
        follows ``sparsity`` where given (the same on every worker); ``kind`` and ``count``: a
        reduce_scatter's or all_gather's (its full tensor's elements)."""
        coll = self.by_seq.get(seq)
        if coll is None:
            if self.colls and seq < self.colls[-1].seq:
                raise ValueError(f"collective {seq} joins the stream after {self.colls[-1].seq}")
            coll = InaCollective(seq, dtype, real_elements, emu_packets, self.end, self.p, self.m, sparsity,
                                 kind, count)
            if self.recorded is not None and coll.sparsity is None:
                need = real_elements if kind == CollKind.ALL_REDUCE else -(-count // self.p.scale)
                if self.recorded.kept(seq) < need:
                    raise ValueError(f"collective {seq}: {need} elements to send, "
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

    def waiting(self) -> np.ndarray:
        """Per local worker, whether it has a slot sent and not back (read only: asked several
        times a window by the clock, and made again only after a slot's state changed)."""
        if self._waiting is None:
            self._waiting = (self.slot_state == SENT).any(axis=1)
            self._waiting.setflags(write=False)
        return self._waiting

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
            cis = distinct(which).tolist()
            for ci in cis:
                mine = slice(None) if len(cis) == 1 else which == ci  # one collective (most often): no mask
                part = self._build(self.colls[ci], li[mine], si[mine], chunks[mine], retx=False)
                if part is not None:
                    parts.append(part)
        if retransmit:
            retx = self._retransmissions(retransmit)
            if retx is not None:
                parts.append(retx)
        if not parts:
            return None
        fields = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit", "sparse")
        pk = parts[0] if len(parts) == 1 else Packets(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))
        order = np.lexsort((pk.send_us, pk.local))  # per worker in time order: its uplink's FIFO
        if every_row(order, len(order)):  # in that order already (most often): no copy of the payload
            return pk
        return Packets(*(rows_of(getattr(pk, f), order) for f in fields))

    def _retransmissions(self, retransmit: list[tuple[int, int, float, float]]) -> Packets | None:
        """The given retransmissions of slots still waiting (built per collective at once), in the
        order given."""
        arr = np.asarray(retransmit, np.float64).reshape(-1, 4)
        li, si = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
        keep = np.flatnonzero(self.slot_state[li, si] == SENT)
        if not len(keep):
            return None
        li, si, when, lost = li[keep], si[keep], arr[keep, 2], arr[keep, 3]
        chunks = self.slot_chunk[li, si]
        which = self.locate(chunks)
        parts, rows = [], []
        for ci in distinct(which).tolist():
            mine = np.flatnonzero(which == ci)
            part = self._build(self.colls[ci], li[mine], si[mine], chunks[mine], retx=True, at=when[mine])
            assert part is not None  # a retransmission is always ready
            part.emu_packets = np.minimum(part.emu_packets, lost[mine])
            parts.append(part)
            rows.append(mine)
        self.retransmissions += len(li)
        np.add.at(self.resends, (li, si), 1)
        order = np.argsort(np.concatenate(rows), kind="stable")  # back to the order given
        fields = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit", "sparse")
        return Packets(*(np.concatenate([getattr(p, f) for p in parts])[order] for f in fields))

    def _build(self, coll: InaCollective, li: np.ndarray, si: np.ndarray, chunks: np.ndarray, retx: bool,
               at: np.ndarray | float = 0.0) -> Packets | None:
        x, k, s = coll.exp_chunks, self.p.elements, self.p.slots
        local = chunks - coll.base
        is_exp = local < x
        b = np.where(is_exp, local, local - x)
        start = coll.start_us[li]
        if retx:
            ready = np.ones(len(li), bool)
            send = np.broadcast_to(np.asarray(at, np.float64), (len(li),)).copy()
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
        self._waiting = None
        self.sent_at[li, si] = send
        if coll.stream is not None:
            return self._build_sparse(coll, h, li, is_exp, b, send, retx)
        if coll.kind == CollKind.ALL_GATHER:
            return self._build_gather(coll, h, li, b, send, retx)
        target = np.where(is_exp, b, b + s)
        has = target < coll.blocks
        exps = np.full(n, fixedpoint.EXP_NONE, np.int8)
        if has.any():
            exps[has] = self.exponents(coll, li[has], target[has])
        h["exponent"] = exps
        h["size"] = np.where(is_exp, 0, k // 64)
        if coll.kind == CollKind.REDUCE_SCATTER:
            owns = ~is_exp & (coll.owner(b) == self.wids[li])
            h["flags"] |= (np.where(is_exp, 0, FLAG_SCATTER) | np.where(owns, FLAG_OWNER, 0)).astype(np.uint8)
        data = np.flatnonzero(~is_exp)
        if len(data) == n:  # data rows only (most often): the quantized rows are the payload
            payload = self.quantized(coll, li, b)
        else:
            payload = np.zeros((n, k), np.int32)
            if len(data):
                payload[data] = self.quantized(coll, li[data], b[data])
        return Packets(li, h, payload, send, self._emu_packets(coll, b, is_exp), np.full(n, retx),
                       np.zeros((n, 2), np.uint32))

    def _build_gather(self, coll: InaCollective, h: np.ndarray, li: np.ndarray, b: np.ndarray, send: np.ndarray,
                      retx: bool) -> Packets:
        """An all_gather's packets: each block's owner sends its lanes as they are, the others a header."""
        n, k = len(li), self.p.elements
        owns = coll.owner(b) == self.wids[li]
        h["flags"] |= (FLAG_GATHER | np.where(owns, FLAG_OWNER, 0)).astype(np.uint8)
        h["exponent"] = fixedpoint.EXP_NONE
        h["size"] = np.where(owns, k // 64, 0)
        payload = np.zeros((n, k), np.int32)
        if owns.any():
            payload[owns] = self._gathered(coll, self.wids[li[owns]], b[owns])
        return Packets(li, h, payload, send, self._emu_packets(coll, b, np.zeros(n, bool)), np.full(n, retx),
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
        if coll.kind != CollKind.ALL_REDUCE:  # each shard's last block stands for the shard's rest
            p = max(1, coll.shard_blocks)
            rest = max(1.0, float(coll.shard_emulated - r * (p - 1)))
            per = np.where(~is_exp & (b % p == p - 1), rest, float(r))
        else:
            per = np.where(~is_exp & (b == last), max(1.0, float(coll.emu_packets - r * last)), float(r))
        if coll.exp_chunks:
            emu_window = self.p.emulated_slots or self.p.slots * r
            per = np.where(is_exp, min(emu_window, coll.emu_packets) / coll.exp_chunks, per)
        return per

    # -- data -------------------------------------------------------------------------
    def emu_packets_of(self, headers: np.ndarray, extra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For results: emulated packets each stands for, and whether it carries a payload."""
        chunks = headers["chunk"].astype(np.int64)
        per = np.zeros(len(chunks))
        which = self.locate(chunks)
        cis = distinct(which).tolist()
        for ci in cis:
            coll = self.colls[ci]
            mine = slice(None) if len(cis) == 1 else which == ci
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
                   extra: np.ndarray | None = None) -> list[tuple[InaCollective, np.ndarray]]:
        """Results reaching workers: result ``rb[i]`` of the message reached worker ``li[i]``, its
        first packet at ``first_us[i]`` and its last at ``last_us[i]`` (with payload scale a row
        stands for many packets: the next chunk on the slot goes when the first is back, as the
        emulated packets self-clock one by one; the collective ends when the last is back).

        ``verify`` holds per message row the mismatches found in it, or -1 while unchecked: each
        row is checked once (every worker of a host receives the same bytes), and every worker it
        reaches counts its elements and mismatches, so the totals do not depend on how workers
        are spread over hosts. ``extra``: the message's (block, next) rows (the sparse stream's).
        Returns, per collective, the local workers that just completed it (ascending).
        """
        if extra is None:
            extra = np.zeros((len(headers), 2), np.uint32)
        chunks = headers["chunk"][rb].astype(np.int64)
        slots = headers["slot"][rb].astype(np.int64)
        ok = (self.slot_state[li, slots] == SENT) & (self.slot_chunk[li, slots] == chunks)
        rows = np.flatnonzero(ok)
        if len(rows) > 1:  # a worker may get a slot's result twice in one message: the first counts
            key = li[rows] * self.p.slots + slots[rows]
            if not (key[1:] > key[:-1]).all():  # rising keys (most often) are each once: no sort
                _, first = np.unique(key, return_index=True)
                rows = rows[np.sort(first)]
        if not len(rows):
            return []
        arrival_us = first_us
        last_us = first_us if last_us is None else last_us
        finished: list[tuple[InaCollective, np.ndarray]] = []
        advance = np.full(len(rows), self.p.slots, np.int64)  # how far each slot's next chunk is
        which = self.locate(chunks[rows])
        cis = distinct(which).tolist()
        for ci in cis:
            coll = self.colls[ci]
            sel = slice(None) if len(cis) == 1 else which == ci
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
                    carries = headers["size"][msg_rows] > 0  # a reduce_scatter's completion holds no data
                    msg_rows, checked = msg_rows[carries], b[carries]
                    todo = verify[msg_rows] < 0
                    if todo.any():
                        self._check(coll, msg_rows[todo], checked[todo], payload, verify)
                    real = coll.lanes(checked, self.p.elements)
                    if coll.kind == CollKind.ALL_GATHER:  # a lane carries 4 bytes of the tensor
                        real = real * 4 // Dtype(coll.dtype).itemsize
                    check.elements += int(real.sum())
                    # a reduce_scatter's sums reach their owner alone; other results reach every
                    # member, and count as distinct at the group's first
                    first = None if coll.kind == CollKind.REDUCE_SCATTER else self.wids[w[d][carries]] == 0
                    check.distinct += int(real.sum() if first is None else real[first].sum())
                    check.mismatches += int(verify[msg_rows].sum())
                np.add.at(coll.done, w[d], 1)
                np.maximum.at(coll.end_us, w[d], t_last[d])
                _finish(coll, (coll.done >= coll.data_blocks) & ~coll.finished, finished)
        w, s = li[rows], slots[rows]
        self.resends[w, s] = 0
        self.slot_chunk[w, s] = chunks[rows] + advance
        self.slot_state[w, s] = IDLE
        self._waiting = None
        self.free_at[w, s] = arrival_us[rows]
        return finished

    def _sparse_results(self, coll: InaCollective, r: np.ndarray, li: np.ndarray, rb: np.ndarray,
                        headers: np.ndarray, payload: np.ndarray, arrival_us: np.ndarray, last_us: np.ndarray,
                        verify: np.ndarray | None, check: ResultCheck | None, extra: np.ndarray,
                        finished: list[tuple[InaCollective, np.ndarray]]) -> np.ndarray:
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
            check.distinct += int(real[self.wids[w[summed]] == 0].sum())
            check.mismatches += int(verify[msg_rows].sum())
        # a sparse collective is done once every chunk of its range came back or was skipped (the
        # announcements count: with no union block they are all there is)
        np.add.at(coll.done, w, 1 + skip)
        np.maximum.at(coll.end_us, w, last_us[r])
        _finish(coll, (coll.done >= coll.chunks) & ~coll.finished, finished)
        return s * (1 + skip)

    def most_resent(self) -> tuple[int, int, int, int]:
        """(resends, worker id, slot, chunk) of the slot resent most times in a row, without its
        result coming back (0 resends: none)."""
        if not self.resends.size:
            return 0, -1, -1, -1
        li, si = np.unravel_index(int(np.argmax(self.resends)), self.resends.shape)
        return int(self.resends[li, si]), int(self.wids[li]), int(si), int(self.slot_chunk[li, si])

    def pending(self) -> bool:
        return any(not c.finished.all() for c in self.colls)
