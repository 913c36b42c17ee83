"""A host's in-network aggregation endpoint: its workers' aggregation stream on their links.

It holds the group (``emu.emulator.protocol.ina``: what to send and when), the contributions waiting
for their send time, the results waiting for their stamp, and the retransmission timers'
bookkeeping. The host (``emu.replay.host.runtime``) decides when: it asks for what is due before a
bound, interleaves it with the point-to-point endpoint's traffic on the shared links, and
hands it back here to cross them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emu.emulator.links.array import Transmitted
from emu.emulator.links.scaled_loss import ScaledLoss
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.protocol import wire
from emu.emulator.protocol.ina import InaCollective, InaGroup, InaParams, Packets, PayloadCache, ResultCheck
from emu.emulator.protocol.rows import every_row, indices, rows_of
from emu.emulator.protocol.switch import MULTICAST
from emu.emulator.protocol.transport import AggBatch
from emu.emulator.protocol.window import Lagging
from emu.replay.config.options import ReplayConfig
from emu.replay.control.messages import CARRIED_UNIT
from emu.replay.host.wiring import Wiring
from emu.replay.host.worker import CollRun, complete_by_run

_PACKET_FIELDS = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit", "sparse")


def take(pk: Packets, rows: np.ndarray) -> Packets:
    rows = indices(rows)  # a mask's places once, not per field
    return Packets(*(rows_of(getattr(pk, f), rows) for f in _PACKET_FIELDS))


def _concat(parts: list[Packets]) -> Packets:
    if len(parts) == 1:
        return parts[0]
    return Packets(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PACKET_FIELDS))


def _wire_sizes(headers: np.ndarray, k: int) -> np.ndarray:
    """Bytes on a link of each packet: with or without payload, and the sparse stream's 8 more."""
    sparse = (headers["msg_type"] == wire.MsgType.SPARSE_CONTRIB) | (headers["msg_type"] == wire.MsgType.SPARSE_RESULT)
    return (np.where(headers["size"] > 0, wire.agg_wire_bytes(k), wire.agg_wire_bytes(0))
            + np.where(sparse, wire.SPARSE_EXTRA, 0))


@dataclass
class Deliveries:
    """Results on their way to workers: per worker reached, the message row, the link, when the
    row is ready to leave (first and last packet), its bytes, the emulated packets it stands for,
    and (payload scale with loss) its sub-chains' delay (``InaEndpoint.deliveries``)."""

    li: np.ndarray
    rb: np.ndarray
    links: np.ndarray
    ready: np.ndarray
    ready_last: np.ndarray
    row_bytes: np.ndarray
    scale: np.ndarray
    delay: np.ndarray | None


def due(times: np.ndarray, bound: float, inclusive: bool) -> np.ndarray:
    return times <= bound if inclusive else times < bound


@dataclass(frozen=True)
class Pool:
    """The switch's slot pool an endpoint streams into: the job's, or a sub-group's (a sharded or
    split job's; docs/parallelism.md), with this host's members of it."""

    job: int  # its number in the headers' job field
    workers: int  # its workers (the headers' num_workers)
    real_slots: int
    emulated_slots: int
    ranks: np.ndarray  # this host's members: their numbers in the pool (the headers' worker)
    ids: np.ndarray  # their worker ids in the job
    locals: np.ndarray  # their indices among the host's workers (their links)
    seed_offset: int = 0  # a sub-group pool's packets have loss fates of their own (the job's pool: 0)


@dataclass
class InaCounters:
    bytes_sent: float = 0.0  # emulated wire bytes, both directions
    lost: int = 0  # real rows the links dropped
    packets_lost: int = 0  # emulated packets lost
    packets_lost_modelled: int = 0  # of those, drawn per row at payload scale above 1 (no real row dropped)


class InaEndpoint:
    def __init__(self, cfg: ReplayConfig, workers: np.ndarray, wiring: Wiring,
                 index: dict[int, int], timer: Callable[[float, int, int, float], None],
                 completed: Callable[[np.ndarray, CollRun, np.ndarray], None], recorded: RecordedPayload | None = None,
                 job: int = 0, pool: Pool | None = None) -> None:
        """``workers``: the host's; ``pool``: the sub-group pool it streams into (None: the job's,
        of every worker, numbered ``job`` in the headers); ``completed(ids, run, ends)``: workers
        ``ids`` (an array) completed ``run``, at ``ends``."""
        if pool is None:
            pool = Pool(job=job, workers=cfg.workers, real_slots=cfg.real_slots, emulated_slots=cfg.emulated_slots,
                        ranks=np.asarray(workers, np.int64), ids=np.asarray(workers, np.int64),
                        locals=np.asarray([index[int(w)] for w in workers], np.int64))
        self.pool = pool
        self.cfg, self.up, self.down = cfg, wiring.up, wiring.down
        self.local_of = np.full(int(pool.ids.max(initial=-1)) + 1, -1, np.int64)  # a worker id's place here
        self.local_of[pool.ids] = np.arange(len(pool.ids))
        self.by_rank = {int(r): i for i, r in enumerate(pool.ranks)}  # a pool rank's place here
        # each local worker's link (its NIC's, shared with the node's other workers on a topology),
        # and, with several leaves, each one's leaf, whose links to the spine (which aggregates)
        # every contribution and result crosses (emu.replay.host.wiring, emu.replay.host.leaves)
        self.link = wiring.local_link[pool.locals] if len(pool.locals) else np.zeros(0, np.int64)
        self.shared = len(np.unique(self.link)) < len(self.link)  # workers here share a link (a NIC)
        self.leaves = wiring.leaves
        self.leaf = (wiring.layout.leaf[pool.ids] if wiring.layout is not None and self.leaves is not None
                     else np.zeros(len(pool.ids), np.int64))
        self.k = cfg.elements
        self.timer, self.completed = timer, completed
        params = InaParams(slots=pool.real_slots, elements=self.k, workers=pool.workers, job=pool.job, seed=cfg.seed,
                           scale=cfg.scale, emulated_slots=pool.emulated_slots,
                           sparse_stream=cfg.network.sparse_stream)
        self.group = InaGroup(pool.ranks, params, PayloadCache(cfg.seed, pool.workers), recorded)
        # with payload scale, loss is drawn per emulated packet and the real rows always cross; each
        # pool's packets have fates of their own
        self.scaled = (ScaledLoss(cfg.seed + pool.seed_offset, pool.workers, cfg.link.loss, pool.real_slots,
                                  -(-pool.emulated_slots // pool.real_slots), cfg.timeout_rto_us)
                       if cfg.scale > 1 and cfg.link.loss > 0 else None)
        self.counters = InaCounters()
        # per collective (its seq): payload bytes (values, the sparse stream's block and next) and
        # header and framing bytes of every packet, contributions and results, resends aside
        self.carried: dict[int, list[int]] = {}  # in CARRIED_UNIT parts of a byte
        self.check = ResultCheck()
        self.runs: dict[int, np.ndarray] = {}  # per collective (its seq): each local worker's run (object)
        self.open = np.zeros(len(pool.ids), np.int64)  # per local worker, its runs started, not completed
        # the pool's collectives numbered in the order its members start them (``lagging``): per
        # local worker, how many it started; per open collective (its seq), its number; whether
        # two local members started them in different orders (then nothing is known)
        self.started = np.zeros(len(pool.ids), np.int64)
        self.order: dict[int, int] = {}
        self.unordered = False
        self.retx_scale: dict[tuple[int, int], float] = {}  # what a pending retransmission stands for
        self.retx_due: list[tuple[int, int, float, float]] = []
        self.pump_due = False
        self.up_heap: list[tuple[float, int, Packets]] = []  # contributions waiting for their send time
        self.down_heap: list[tuple[float, int, AggBatch, np.ndarray]] = []  # results waiting for their stamp
        self._parts = 0  # keeps heap entries of equal keys apart
        self.outgoing: list[AggBatch] = []

    # -- the stream ---------------------------------------------------------------------
    def start(self, workers: int | np.ndarray, run: CollRun, real_elements: int) -> bool:
        """Workers (ids: a cohort's members, one program, one start time) start an all_reduce on
        the stream; True if it is already complete (empty)."""
        op = run.op
        coll = self.group.collective(run.seq, op.dtype.value, real_elements, -(-op.count // self.k), op.sparsity,
                                     op.kind, op.count)
        local = self.local_of[workers]
        assert (np.asarray(local) >= 0).all(), "a worker starts a collective on a pool it is not in"
        coll.start_us[local] = run.start_us
        n = self.started[local]
        self.started[local] += 1
        if coll.chunks == 0:
            coll.finished[local] = True
            return True
        runs = self.runs.get(run.seq)
        if runs is None:
            runs = self.runs[run.seq] = np.full(self.group.m, None, object)
        number = int(np.min(n))
        if self.order.setdefault(run.seq, number) != number or (np.asarray(n) != number).any():
            self.unordered = True
        runs[local] = run
        self.open[local] += 1
        self.pump_due = True
        return False

    def pending(self) -> list[CollRun]:
        """Each started run not yet completed, once per worker."""
        return [run for runs in self.runs.values() for run in runs.tolist() if run is not None]

    def most_resent(self) -> tuple[int, int, int, int]:
        """``InaGroup.most_resent``."""
        return self.group.most_resent()

    def timer_fired(self, local: int, slot: int, t: float, lost: float) -> None:
        self.retx_scale[(local, slot)] = lost
        self.retx_due.append((local, slot, t, lost))

    def pump(self) -> None:
        """The group's next packets (every chunk any worker may send, with its send time, and the
        retransmissions due): asked once per window, since they depend only on the state."""
        if not self.pump_due and not self.retx_due:
            return
        self.pump_due = False
        retx, self.retx_due = self.retx_due, []
        pk = self.group.next_packets(retx)
        if pk is not None:
            self._parts += 1
            heapq.heappush(self.up_heap, (float(pk.send_us.min()), self._parts, pk))

    def next_us(self) -> float:
        return min(self.up_heap[0][0] if self.up_heap else math.inf,
                   self.down_heap[0][0] if self.down_heap else math.inf)

    def busy(self) -> bool:
        return self.pump_due or bool(self.retx_due)

    def link_events(self, nxt: np.ndarray) -> list[tuple[int, np.ndarray, float]]:
        """Into ``nxt`` (per uplink): the earliest contribution waiting to be sent on it. Returns
        for its pool (its number in the headers' job field) the links of the workers that wait
        for a result (a slot sent, not back: only they can receive one), and the earliest result
        held here for its stamp."""
        for _, _, pk in self.up_heap:
            np.minimum.at(nxt, self.link[pk.local], pk.send_us)
        ((job, links),) = self.waiting_links()
        return [(job, links, self.down_heap[0][0] if self.down_heap else math.inf)]

    def waiting_links(self) -> list[tuple[int, np.ndarray]]:
        """For its pool (its number in the headers' job field), the links of the workers that wait
        for one of its results: a slot sent, not back (only they can receive one)."""
        return [(self.pool.job, self.link[self.group.waiting()])]

    def inside(self, into: np.ndarray) -> None:
        """Mark in ``into`` (per worker id) the workers inside one of the pool's collectives:
        started, not finished."""
        into[self.pool.ids[self.open > 0]] = True

    def lagging(self, run_t: np.ndarray, inside: np.ndarray) -> list[tuple[int, Lagging]]:
        """For its pool, what its members held here have started (``Lagging``); ``run_t``: per
        worker id, its program's next resumption; ``inside``: per worker id, whether it is inside
        a collective of any kind (``inside``, and the point-to-point endpoint's)."""
        ids = self.pool.ids
        if self.unordered:
            return [(self.pool.job, Lagging(-math.inf, -math.inf, -math.inf))]
        if not len(ids):
            return [(self.pool.job, Lagging())]
        least = int(self.started.min())
        at = ids[self.started == least]
        nxt = float(np.where(inside[at], -math.inf, run_t[at]).min())
        return [(self.pool.job, Lagging(float(least - 1), nxt, float(min(self.order.values(), default=math.inf))))]

    # -- uplinks ------------------------------------------------------------------------
    def due_up(self, bound: float, inclusive: bool) -> Packets | None:
        """Every contribution due before the bound, in each uplink's FIFO order."""
        parts: list[Packets] = []
        while self.up_heap and (self.up_heap[0][0] <= bound if inclusive else self.up_heap[0][0] < bound):
            _, _, pk = heapq.heappop(self.up_heap)
            now = due(pk.send_us, bound, inclusive)
            if not now.all():
                rest = take(pk, np.flatnonzero(~now))
                self._parts += 1
                heapq.heappush(self.up_heap, (float(rest.send_us.min()), self._parts, rest))
                pk = take(pk, np.flatnonzero(now))
            parts.append(pk)
        if not parts:
            return None
        pk = _concat(parts)
        order = np.lexsort((pk.headers["chunk"], pk.local, pk.send_us, self.link[pk.local]))
        return pk if every_row(order, len(order)) else take(pk, order)  # in order already: no payload copy

    def _scaled_lost(self, chunks: np.ndarray, per: np.ndarray, local: np.ndarray, down: bool) -> np.ndarray:
        """With payload scale: the emulated packets each row's link lost (and resent)."""
        assert self.scaled is not None
        out = np.zeros(len(chunks))
        wids = self.group.wids[local]
        for c in np.unique(chunks):
            rows = np.flatnonzero(chunks == c)
            fate = self.scaled.fate(int(c), float(per[rows[0]]))
            out[rows] = (fate.k_down if down else fate.k_up)[wids[rows]]
        return out

    def send(self, pk: Packets) -> None:
        """Contributions cross their uplinks: what arrives goes to the switch, what is lost waits
        for its timer."""
        links, wire_bytes, packets = self.offer(pk)
        self.sent(pk, self.up.transmit(links, pk.send_us, wire_bytes, packets=packets, lossy=self.scaled is None),
                  wire_bytes, packets)

    def offer(self, pk: Packets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What contributions ask of their uplinks: the links, wire bytes and emulated packets (the
        pools of one host share its links: ``emu.replay.host.pools`` hands them over together)."""
        sizes = _wire_sizes(pk.headers, self.k)
        packets = pk.emu_packets
        if self.scaled is not None:
            resent = self._scaled_lost(pk.headers["chunk"].astype(np.int64), pk.emu_packets, pk.local, down=False)
            self.counters.packets_lost += int(resent.sum())
            self.counters.packets_lost_modelled += int(resent.sum())
            packets = packets + resent
        return self.link[pk.local], sizes * packets, packets

    def sent(self, pk: Packets, sent: Transmitted, wire_bytes: np.ndarray, packets: np.ndarray) -> None:
        """What the uplinks did with contributions (``offer``'s): on to the switch, or lost."""
        arrival = np.stack([sent.first_us, sent.last_us], axis=1)
        self.counters.bytes_sent += float(np.rint(wire_bytes).sum())  # whole bytes: exact in any order
        fresh = ~np.asarray(pk.retransmit, bool)
        if fresh.all():  # no retransmission (most often): nothing to select
            self._carry(pk.headers, np.asarray(pk.emu_packets, np.float64))
        else:
            self._carry(pk.headers[fresh], np.asarray(pk.emu_packets, np.float64)[fresh])
        lost = sent.lost
        if lost.any():
            self.counters.lost += int(lost.sum())
            self.counters.packets_lost += int(np.rint(sent.lost_packets[lost]).sum())
            for local, slot, at, n in zip(pk.local[lost], pk.headers["slot"][lost], pk.send_us[lost],
                                          sent.lost_packets[lost], strict=True):
                self.timer(float(at) + self.cfg.timeout_rto_us, int(local), int(slot), float(n))
        keep = ~lost
        if keep.any():
            emu_packets = np.asarray(packets, np.float64)
            batch = AggBatch(pk.headers, pk.payload, arrival, pk.sparse, emu_packets)
            batch = batch if not lost.any() else batch.take(keep)  # no copy where none was lost
            if self.leaves is not None:  # up the leaf's link to the aggregating spine
                self.leaves.batch(0, self.leaf[pk.local[keep]], batch, wire_bytes[keep], packets[keep])
            else:
                self.outgoing.append(batch)

    def take_outgoing(self) -> AggBatch | None:
        """What the uplinks delivered since the last call, as one batch for the switch."""
        if not self.outgoing:
            return None
        batch = AggBatch.concat(self.outgoing)
        self.outgoing = []
        return batch

    # -- downlinks ----------------------------------------------------------------------
    def arrive(self, batch: AggBatch) -> None:
        """Results from the switch: with several leaves, down each leaf's link from the spine first
        (a multicast result once a leaf this host holds, a unicast one to its worker's leaf)."""
        if self.leaves is None or not len(batch.headers):
            self.receive(batch)
            return
        dest = batch.headers["worker"].astype(np.int64)
        mine = np.unique(self.leaf)
        # a reduce_scatter's completion goes to every worker but the one it names, as a multicast
        done = batch.headers["msg_type"] == wire.MsgType.SCATTER_DONE
        multi = np.flatnonzero((dest == MULTICAST) | done)
        uni = np.flatnonzero((dest != MULTICAST) & ~done & np.isin(dest, self.group.wids))
        at = np.concatenate([np.repeat(multi, len(mine)), uni])
        if not len(at):
            return
        tags = np.concatenate([np.tile(mine, len(multi)),
                               self.leaf[[self.by_rank[int(d)] for d in dest[uni]]] if len(uni) else np.zeros(0, np.int64)])
        copy = batch.take(at)
        assert copy.sparse is not None
        per, _ = self.group.emu_packets_of(copy.headers, copy.sparse)
        self.leaves.batch(1, tags, copy, _wire_sizes(copy.headers, self.k) * per, per, tags)

    def receive(self, batch: AggBatch, leaves: np.ndarray | None = None) -> None:
        """Results, kept until the clock reaches their stamps; ``leaves``: per row, the leaf whose
        workers it is for (None: every worker here)."""
        if not len(batch.headers):
            return
        order = np.lexsort((batch.headers["chunk"], batch.stamps[:, 0]))
        batch = batch.take(order)
        tags = np.full(len(order), -1, np.int64) if leaves is None else np.asarray(leaves, np.int64)[order]
        self._parts += 1
        heapq.heappush(self.down_heap, (float(batch.stamps[0, 0]), self._parts, batch,
                                        np.full(len(order), -1, np.int64), tags))

    def due_down(self, bound: float, inclusive: bool) -> tuple[AggBatch, np.ndarray, np.ndarray] | None:
        """Every result due before the bound, in stamp order, with its verification state and leaf."""
        parts: list[tuple[AggBatch, np.ndarray, np.ndarray]] = []
        while self.down_heap and (self.down_heap[0][0] <= bound if inclusive else self.down_heap[0][0] < bound):
            _, _, batch, verify, tags = heapq.heappop(self.down_heap)
            now = due(batch.stamps[:, 0], bound, inclusive)
            if not now.all():
                rest = ~now
                self._parts += 1
                heapq.heappush(self.down_heap, (float(batch.stamps[rest, 0].min()), self._parts,
                                                batch.take(rest), verify[rest], tags[rest]))
                batch, verify, tags = batch.take(now), verify[now], tags[now]
            parts.append((batch, verify, tags))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        batch = AggBatch.concat([b for b, _, _ in parts])
        order = np.lexsort((batch.headers["chunk"], batch.stamps[:, 0]))
        return (batch.take(order), np.concatenate([v for _, v, _ in parts])[order],
                np.concatenate([t for _, _, t in parts])[order])

    def on_results(self, batch: AggBatch, verify: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Results cross the downlinks to the workers they are for (``tags``: per row, the leaf whose
        workers a multicast row is for; -1: every worker here)."""
        rows = self.deliveries(batch, tags)
        if rows is None:
            return
        got = self.down.transmit(rows.links, rows.ready, rows.row_bytes, packets=rows.scale,
                                 ready_last_us=rows.ready_last, lossy=self.scaled is None)
        self.delivered_rows(rows, got, batch, verify)

    def deliveries(self, batch: AggBatch, tags: np.ndarray | None = None) -> Deliveries | None:
        """What results ask of their downlinks: per worker reached, the row, the link, when ready and
        the bytes (None: they reach nobody here)."""
        g = self.group
        dest = batch.headers["worker"].astype(np.int64)
        chunks = batch.headers["chunk"].astype(np.int64)
        assert batch.sparse is not None
        per, _ = g.emu_packets_of(batch.headers, batch.sparse)
        sizes = _wire_sizes(batch.headers, self.k) * per
        done = batch.headers["msg_type"] == wire.MsgType.SCATTER_DONE  # to all but the worker it names
        multi = np.flatnonzero((dest == MULTICAST) | done)
        li_parts, rb_parts = [], []
        if len(multi):  # every worker of the host (of the row's leaf) receives these, each on its own downlink
            li = np.repeat(np.arange(g.m), len(multi))
            rb = np.tile(multi, g.m)
            if tags is not None and (tags[multi] >= 0).any():
                ok = (tags[rb] < 0) | (tags[rb] == self.leaf[li])
                li, rb = li[ok], rb[ok]
            if done.any():
                keep = ~done[rb] | (g.wids[li] != dest[rb])
                li, rb = li[keep], rb[keep]
            li_parts.append(li)
            rb_parts.append(rb)
        uni = np.flatnonzero((dest != MULTICAST) & ~done & np.isin(dest, g.wids))
        if len(uni):
            li_parts.append(np.array([self.by_rank[int(d)] for d in dest[uni]]))
            rb_parts.append(uni)
        if not li_parts:
            return None
        li, rb = np.concatenate(li_parts), np.concatenate(rb_parts)
        scale = per[rb]
        fresh = np.ones(len(rb), bool)  # what crossed for the first time (``carried``)
        if len(uni):  # an answer to a retransmission stands for the packets that were resent
            n_uni = len(uni)
            scale = scale.copy()
            keys = [(int(li[-n_uni + i]), int(batch.headers["slot"][uni[i]])) for i in range(n_uni)]
            scale[-n_uni:] = [min(scale[-n_uni + i], self.retx_scale.get(key, 1.0)) for i, key in enumerate(keys)]
            fresh[-n_uni:] = [key not in self.retx_scale for key in keys]
        if (len(uni) and len(multi)) or self.shared:
            # each downlink in the message's (stamp) order; a NIC's workers' rows interleaved by it
            order = np.lexsort((li, rb, self.link[li]))
            li, rb, scale, fresh = li[order], rb[order], scale[order], fresh[order]
        delay = None
        if self.scaled is not None:
            resent = self._scaled_lost(chunks[rb], per[rb], li, down=True)
            self.counters.packets_lost += int(resent.sum())
            self.counters.packets_lost_modelled += int(resent.sum())
            scale = scale + resent
            delay = np.zeros(len(chunks))
            slots = batch.headers["slot"].astype(np.int64)
            which = g.locate(chunks)
            for i in np.unique(rb):  # the slowest sub-chain of each row (emu.emulator.links.scaled_loss)
                coll = g.colls[int(which[i])]
                # the slot's last pass of the collective: the final chunks of the range, or in a
                # sparse stream the result that ends the slot's partition (it may end early)
                last = (int(batch.sparse[i, 1]) == wire.BLOCK_NONE if coll.stream is not None
                        else int(chunks[i]) >= coll.base + coll.chunks - g.p.slots)
                delay[i] = self.scaled.delay(int(chunks[i]), int(slots[i]), int(which[i]), float(per[i]), last)
        self._carry(batch.headers[rb[fresh]], per[rb[fresh]])
        row_bytes = sizes[rb] / per[rb] * scale
        return Deliveries(li, rb, self.link[li], batch.stamps[rb, 0], batch.stamps[rb, 1], row_bytes, scale, delay)

    def _carry(self, headers: np.ndarray, packets: np.ndarray) -> None:
        """Into ``carried``, per collective: these packets' payload (``k`` int32 values where one has
        data, the sparse stream's 8 bytes of block and next) and header bytes, ``packets`` emulated
        ones a row."""
        if not len(headers):
            return
        kind = headers["msg_type"]
        sparse = (kind == wire.MsgType.SPARSE_CONTRIB) | (kind == wire.MsgType.SPARSE_RESULT)
        payload = np.rint((np.where(headers["size"] > 0, 4 * self.k, 0) + np.where(sparse, wire.SPARSE_EXTRA, 0))
                          * packets)
        header = np.rint(_wire_sizes(headers, self.k) * packets) - payload
        which = self.group.locate(headers["chunk"].astype(np.int64))
        for i in np.unique(which):
            sel = which == i
            got = self.carried.setdefault(self.group.colls[int(i)].seq, [0, 0])
            got[0] += int(payload[sel].sum()) * CARRIED_UNIT
            got[1] += int(header[sel].sum()) * CARRIED_UNIT

    def delivered_rows(self, rows: Deliveries, got: Transmitted, batch: AggBatch, verify: np.ndarray) -> None:
        """What the downlinks did with results (``deliveries``'): to the workers, or lost."""
        g = self.group
        li, rb, row_bytes, delay = rows.li, rows.rb, rows.row_bytes, rows.delay
        first, last, lost = got.first_us, got.last_us, got.lost
        if delay is not None:
            first, last = first + delay[rb], last + delay[rb]
        self.counters.bytes_sent += float(np.rint(row_bytes).sum())
        if lost.any():
            self.counters.lost += int(lost.sum())
            self.counters.packets_lost += int(np.rint(got.lost_packets[lost]).sum())
            rto = self.cfg.timeout_rto_us
            for local, slot, arrival, n in zip(li[lost], batch.headers["slot"][rb[lost]], first[lost],
                                               got.lost_packets[lost], strict=True):
                # the worker's timer, armed when it sent, fires every rto until the result is in:
                # the first firing after the lost result would have arrived resends
                sent = float(g.sent_at[local, slot])
                self.timer(sent + rto * max(1.0, math.ceil((float(arrival) - sent) / rto)), int(local),
                           int(slot), float(n))
        keep = ~lost
        done = g.on_results(li[keep], rb[keep], batch.headers, batch.payload, first[keep], last[keep], verify,
                            self.check, batch.sparse)
        for coll, local in done:
            self._finished(coll, local)
        self.pump_due = True

    def _finished(self, coll: InaCollective, local: np.ndarray) -> None:
        """Local workers ``local`` just completed ``coll``: to the host, those of one run (a
        cohort's members share it) at once, runs in the order their first worker comes."""
        runs = self.runs[coll.seq]
        got = runs[local]
        runs[local] = None
        self.open[local] -= 1
        if coll.finished.all():
            del self.runs[coll.seq]
            self.order.pop(coll.seq, None)
        complete_by_run(self.pool.ids[local], got, coll.end_us[local], self.completed)
