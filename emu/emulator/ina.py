"""One worker's stream through the aggregation switch: a transport-free state machine.

The stream runs across the worker's all_reduce collectives in issue order. Chunk
``c`` of the stream uses slot ``c mod S`` and copy ``(c div S) mod 2``; a slot is
used again (by chunk ``c + S``) only once chunk ``c``'s result came back: the
self-clocking stream, with ``S`` chunks in flight at most.

A collective of ``D`` data blocks (``k`` elements each) starts with ``X = min(S, D)``
exponent-only chunks, which make the workers agree (through the switch's maximum)
on the exponents of blocks ``0..X-1``; then data block ``b`` goes as chunk
``base + X + b``, quantized with the agreed exponent, and carries the worker's
exponent of block ``b + S``, the block that will next use its slot.

The stream decides *what* to send and *when* in emulated time; the host turns
its ``Packet`` batches into wire messages, runs the link model, and hands results
back. Loss recovery: a packet the link model lost (or whose result it lost) is
sent again ``rto_us`` after it was sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from emu.emulator import fixedpoint
from emu.emulator.payload import Block, block
from emu.emulator.wire import AGG_HEADER, FLAG_COPY, MsgType

IDLE, SENT = 0, 1


@dataclass(frozen=True)
class InaParams:
    slots: int  # S: the pool, and the window of chunks in flight
    elements: int  # k per packet
    workers: int  # N
    job: int
    seed: int
    scale: int = 1  # R: emulated packets per real packet
    rto_us: float = 10_000.0


@dataclass
class InaCollective:
    """One all_reduce in the stream, as one worker sees it."""

    seq: int
    dtype: str
    real_elements: int  # what is really sent (count / R)
    emu_packets: int  # packets of k elements on the emulated wire
    base: int = 0  # first chunk
    start_us: float | None = None
    agreed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    known_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # when each agreed exponent arrived
    done: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    end_us: float = 0.0
    finished: bool = False

    def setup(self, k: int, slots: int) -> None:
        d = -(-self.real_elements // k) if self.real_elements else 0
        self.data_blocks = d
        self.exp_chunks = min(slots, d)
        self.agreed = np.full(d, fixedpoint.EXP_NONE, np.int8)
        self.known_at = np.full(d, math.inf)
        self.done = np.zeros(d, bool)
        self.finished = d == 0

    @property
    def chunks(self) -> int:
        return self.exp_chunks + self.data_blocks


@dataclass
class Packets:
    """Contributions one worker sends, in the order it sends them."""

    headers: np.ndarray
    payload: np.ndarray  # (n, k) int32, zeros for exponent-only chunks
    send_us: np.ndarray  # when each may leave the worker (emulated)
    emu_packets: np.ndarray  # emulated packets each stands for
    retransmit: np.ndarray  # bool


@dataclass
class ResultCheck:
    elements: int = 0
    mismatches: int = 0


class PayloadCache:
    """Pages of the shared payload parts (owner, common, own, beta), for every stream of a host.

    The workers of a host move through the same collectives in near lockstep, so
    a small cache serves all of them: each page is drawn once per host.
    """

    PAGE = 16384

    def __init__(self, seed: int, workers: int, pages: int = 64) -> None:
        self.seed, self.workers, self.pages = seed, workers, pages
        self._cache: dict[tuple[int, int], Block] = {}

    def page(self, coll: InaCollective, page: int) -> Block:
        key = (coll.seq, page)
        blk = self._cache.get(key)
        if blk is None:
            start = page * self.PAGE
            n = min(self.PAGE, coll.real_elements - start)
            blk = block(self.seed, coll.seq, start, n, self.workers, coll.dtype)
            if len(self._cache) >= self.pages:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = blk
        return blk


class InaStream:
    def __init__(self, worker: int, params: InaParams, cache: PayloadCache | None = None) -> None:
        self.w = worker
        self.p = params
        s = params.slots
        self.slot_chunk = np.arange(s, dtype=np.int64)  # the chunk each slot holds or waits to send
        self.slot_state = np.full(s, IDLE, np.int8)
        self.free_at = np.zeros(s)  # when each slot's previous result arrived
        self.sent_at = np.zeros(s)
        self.colls: list[InaCollective] = []
        self.bases: list[int] = []
        self.end = 0  # first chunk past the last collective added
        self.retransmissions = 0
        self.late_results = 0  # results for chunks no longer outstanding (answered twice)
        self.cache = cache or PayloadCache(params.seed, params.workers)

    # -- the stream -----------------------------------------------------------------
    def add(self, coll: InaCollective) -> None:
        """Append an all_reduce to the stream (in issue order); it starts when ``start_us`` is set."""
        coll.setup(self.p.elements, self.p.slots)
        coll.base = self.end
        self.colls.append(coll)
        self.bases.append(coll.base)
        self.end += coll.chunks

    def _locate(self, chunks: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.bases), chunks, side="right") - 1

    def pending(self) -> bool:
        return any(not c.finished for c in self.colls)

    def next_packets(self, retransmit_at: dict[int, float] | None = None) -> Packets | None:
        """Every chunk that may be sent now, with its emulated send time."""
        live = np.flatnonzero((self.slot_state == IDLE) & (self.slot_chunk < self.end))
        rows = []
        if len(live):
            chunks = self.slot_chunk[live]
            which = self._locate(chunks)
            for ci in np.unique(which):
                coll = self.colls[ci]
                if coll.start_us is None:
                    continue
                mine = which == ci
                rows.append((coll, live[mine], chunks[mine] - coll.base))
        out = [self._build(coll, slots, local) for coll, slots, local in rows]
        out = [p for p in out if p is not None]
        if retransmit_at:
            out.extend(self._resend(retransmit_at))
        if not out:
            return None
        pk = Packets(*(np.concatenate([getattr(p, f) for p in out]) for f in
                       ("headers", "payload", "send_us", "emu_packets", "retransmit")))
        order = np.argsort(pk.send_us, kind="stable")
        return Packets(pk.headers[order], pk.payload[order], pk.send_us[order], pk.emu_packets[order],
                       pk.retransmit[order])

    def _build(self, coll: InaCollective, slots: np.ndarray, local: np.ndarray) -> Packets | None:
        k = self.p.elements
        is_exp = local < coll.exp_chunks
        b = np.where(is_exp, local, local - coll.exp_chunks)
        ready = is_exp | (coll.known_at[np.minimum(b, coll.data_blocks - 1)] < math.inf)
        if not ready.any():
            return None
        slots, local, b, is_exp = slots[ready], local[ready], b[ready], is_exp[ready]
        n = len(slots)
        chunks = coll.base + local
        send = np.maximum(self.free_at[slots], coll.start_us)
        send = np.where(is_exp, send, np.maximum(send, coll.known_at[b]))
        own = self._own_exponents(coll, b, is_exp)
        headers = self._headers(chunks, n)
        headers["exponent"] = own
        headers["size"] = np.where(is_exp, 0, k // 64)
        payload = np.zeros((n, k), np.int32)
        data = np.flatnonzero(~is_exp)
        if len(data):
            x = self._values(coll, b[data])
            payload[data] = fixedpoint.quantize(x, coll.agreed[b[data]], self.p.workers)
        self.slot_state[slots] = SENT
        self.sent_at[slots] = send
        emu = self._emu_packets(coll, b, is_exp)
        return Packets(headers, payload, send, emu, np.zeros(n, bool))

    def _resend(self, retransmit_at: dict[int, float]) -> list[Packets]:
        out = []
        for slot, when in retransmit_at.items():
            if self.slot_state[slot] != SENT:
                continue
            chunk = int(self.slot_chunk[slot])
            coll = self.colls[int(self._locate(np.array([chunk]))[0])]
            local = chunk - coll.base
            is_exp = np.array([local < coll.exp_chunks])
            b = np.array([local if is_exp[0] else local - coll.exp_chunks])
            headers = self._headers(np.array([chunk]), 1)
            headers["exponent"] = self._own_exponents(coll, b, is_exp)
            headers["size"] = 0 if is_exp[0] else self.p.elements // 64
            payload = np.zeros((1, self.p.elements), np.int32)
            if not is_exp[0]:
                payload[0] = fixedpoint.quantize(self._values(coll, b), coll.agreed[b], self.p.workers)[0]
            self.sent_at[slot] = when
            self.retransmissions += 1
            out.append(Packets(headers, payload, np.array([when]), self._emu_packets(coll, b, is_exp),
                               np.array([True])))
        return out

    def _headers(self, chunks: np.ndarray, n: int) -> np.ndarray:
        h = np.zeros(n, AGG_HEADER)
        h["msg_type"] = MsgType.CONTRIB
        h["flags"] = (chunks // self.p.slots) % 2 * FLAG_COPY
        h["job"] = self.p.job
        h["worker"] = self.w
        h["num_workers"] = self.p.workers
        h["slot"] = chunks % self.p.slots
        h["chunk"] = chunks
        return h

    def _emu_packets(self, coll: InaCollective, b: np.ndarray, is_exp: np.ndarray) -> np.ndarray:
        r = self.p.scale
        per = np.full(len(b), float(r))
        last = coll.data_blocks - 1
        tail = coll.emu_packets - r * last
        per = np.where(~is_exp & (b == last), max(1.0, float(tail)), per)
        if coll.exp_chunks:
            # the exponent round covers min(S, D) chunks on the emulated wire too
            per = np.where(is_exp, min(self.p.slots * r, coll.emu_packets) / coll.exp_chunks, per)
        return per

    # -- data -----------------------------------------------------------------------
    def _values(self, coll: InaCollective, blocks: np.ndarray) -> np.ndarray:
        """This worker's values of data blocks (len(blocks) x k, zero padded), float32 (exact)."""
        k = self.p.elements
        out = np.zeros((len(blocks), k), np.float32)
        if not len(blocks):
            return out
        first, last = int(blocks.min()), int(blocks.max())
        if last - first + 1 <= 4 * len(blocks):  # one contiguous range: vectorized
            lo, hi = first * k, min((last + 1) * k, coll.real_elements)
            span = np.zeros((last - first + 1) * k, np.float32)
            span[: hi - lo] = self._range(coll, lo, hi, lambda blk, a, z: blk.values_at(self.w, a, z))
            return span.reshape(-1, k)[blocks - first]
        for i, b in enumerate(blocks):
            lo, hi = int(b) * k, min((int(b) + 1) * k, coll.real_elements)
            out[i, : hi - lo] = self._range(coll, lo, hi, lambda blk, a, z: blk.values_at(self.w, a, z))
        return out

    def _range(self, coll: InaCollective, lo: int, hi: int, fn) -> np.ndarray:
        parts = []
        while lo < hi:
            blk = self.cache.page(coll, lo // PayloadCache.PAGE)
            a, z = lo - blk.start, min(hi, blk.start + len(blk.owner)) - blk.start
            parts.append(fn(blk, a, z))
            lo = blk.start + z
        return np.concatenate(parts) if parts else np.zeros(0)

    def _own_exponents(self, coll: InaCollective, b: np.ndarray, is_exp: np.ndarray) -> np.ndarray:
        """Exponent to agree on: of block b itself (exponent round) or of b + S (data)."""
        target = np.where(is_exp, b, b + self.p.slots)
        valid = target < coll.data_blocks
        out = np.full(len(b), fixedpoint.EXP_NONE, np.int8)
        if valid.any():
            out[valid] = fixedpoint.block_exponents(self._values(coll, target[valid]))
        return out

    def expected_sums(self, coll: InaCollective, blocks: np.ndarray) -> np.ndarray:
        """The exact int32 sums the switch must return for data blocks (len x k, zero padded)."""
        k = self.p.elements
        out = np.zeros((len(blocks), k), np.int64)
        if not len(blocks):
            return out
        first, last = int(blocks.min()), int(blocks.max())
        lo, hi = first * k, min((last + 1) * k, coll.real_elements)
        n = self.p.workers
        units = np.zeros((last - first + 1) * k, np.int64)
        beta = np.zeros((last - first + 1) * k, np.int64)
        units[: hi - lo] = self._range(coll, lo, hi, lambda blk, a, z: n * blk.common[a:z] + blk.own[a:z])
        beta[: hi - lo] = self._range(coll, lo, hi, lambda blk, a, z: blk.beta[a:z])
        units = units.reshape(-1, k)[blocks - first]
        beta = beta.reshape(-1, k)[blocks - first]
        agreed = coll.agreed[blocks]
        shift = np.where(agreed == fixedpoint.EXP_NONE, 0, fixedpoint.scale_shift(agreed, n))
        out = (units * np.exp2((beta + shift[:, None]).astype(np.float64))).astype(np.int64)
        return np.where((agreed == fixedpoint.EXP_NONE)[:, None], 0, out)

    def emu_packets_of(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For result chunks: emulated packets each stands for, and whether it carries a payload."""
        per = np.zeros(len(chunks))
        data = np.zeros(len(chunks), bool)
        which = self._locate(chunks)
        for ci in np.unique(which):
            coll = self.colls[ci]
            mine = which == ci
            local = chunks[mine] - coll.base
            is_exp = local < coll.exp_chunks
            b = np.where(is_exp, local, local - coll.exp_chunks)
            per[mine] = self._emu_packets(coll, b, is_exp)
            data[mine] = ~is_exp
        return per, data

    def on_results(self, headers: np.ndarray, payload: np.ndarray, arrival_us: np.ndarray,
                   verify: np.ndarray | None = None, check: ResultCheck | None = None) -> list[InaCollective]:
        """Results that reached this worker (in arrival order); returns collectives now complete.

        Rows whose ``verify`` flag is set are checked against the closed-form sums
        (and the flag cleared, so that the other workers of the host skip them).
        """
        chunks = headers["chunk"].astype(np.int64)
        slots = headers["slot"].astype(np.int64)
        ok = (self.slot_state[slots] == SENT) & (self.slot_chunk[slots] == chunks)
        rows = np.flatnonzero(ok)
        _, first = np.unique(slots[rows], return_index=True)
        keep = rows[np.sort(first)]
        self.late_results += len(headers) - len(keep)
        if not len(keep):
            return []
        finished = []
        which = self._locate(chunks[keep])
        for ci in np.unique(which):
            coll = self.colls[ci]
            r = keep[which == ci]
            local = chunks[r] - coll.base
            t = arrival_us[r]
            exps = headers["exponent"][r].astype(np.int8)
            is_exp = local < coll.exp_chunks
            e_rows = local[is_exp]
            coll.agreed[e_rows] = exps[is_exp]
            coll.known_at[e_rows] = t[is_exp]
            b = local[~is_exp] - coll.exp_chunks
            if len(b):
                rd = r[~is_exp]
                if check is not None and verify is not None:
                    todo = verify[rd]
                    if todo.any():
                        rows_v, blocks_v = rd[todo], b[todo]
                        want = self.expected_sums(coll, blocks_v)
                        got = payload[rows_v].astype(np.int64)
                        tail = coll.real_elements - blocks_v * self.p.elements
                        real = np.arange(self.p.elements)[None, :] < tail[:, None]
                        check.elements += int(real.sum())
                        check.mismatches += int(np.count_nonzero((got != want) & real))
                        verify[rows_v] = False
                nxt = b + self.p.slots
                has = nxt < coll.data_blocks
                coll.agreed[nxt[has]] = exps[~is_exp][has]
                coll.known_at[nxt[has]] = t[~is_exp][has]
                coll.done[b] = True
                coll.end_us = max(coll.end_us, float(t[~is_exp].max()))
                if not coll.finished and coll.done.all():
                    coll.finished = True
                    finished.append(coll)
        s = slots[keep]
        self.slot_chunk[s] = chunks[keep] + self.p.slots
        self.slot_state[s] = IDLE
        self.free_at[s] = arrival_us[keep]
        return finished
