"""A host's aggregation endpoints when its job aggregates on several pools: the job's and its
sub-groups' (a sharded or split job's data-parallel groups; docs/parallelism.md).

Each sub-group whose all_reduces the switch sums is a pool of its own, as a job is: its own slots
(the job's share of the switch split among its pools), its own stream of chunks, its members
numbered 0..g-1 in its headers, its number in the headers' job field. Each pool is an ordinary
``InaEndpoint``; this class gives the host the one endpoint's interface over all of them. The
pools' packets share the workers' links, so what is due on the links is handed over in one
transmission, in each link's time order, and each pool then handles what its own rows met.

A retransmission timer names its pool in its local number's high bits (``_POOL_BITS``): the host's
events stay (time, kind, endpoint, detail) tuples, and pool 0's numbers are the one pool's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from emu.emulator.protocol.rows import every_row
from emu.emulator.protocol.transport import AggBatch
from emu.emulator.protocol.window import Lagging
from emu.replay.host.ina import Deliveries, InaCounters, InaEndpoint, Packets, Pool, take
from emu.replay.host.worker import CollRun

_POOL_BITS = 32
_LOCAL = (1 << _POOL_BITS) - 1


class _Sum:
    """Counters summed over the pools (what the host reports)."""

    def __init__(self, pools: list[InaEndpoint], attr: str, sub: str | None = None) -> None:
        self.pools, self.attr, self.sub = pools, attr, sub

    def __getattr__(self, name: str) -> int | float:
        return sum(getattr(getattr(p, self.attr) if self.sub is None else getattr(getattr(p, self.attr), self.sub),
                           name) for p in self.pools)


class InaPools:
    def __init__(self, endpoints: dict[int, InaEndpoint], pool_of: dict[tuple[int, ...], int]) -> None:
        """``endpoints``: per pool number (0: the job's); ``pool_of``: a sub-group's pool by its workers."""
        self.endpoints = endpoints
        self.order = sorted(endpoints)
        self.pool_of = pool_of
        first = endpoints[self.order[0]]
        self.up, self.down, self.cfg = first.up, first.down, first.cfg
        pools = [endpoints[p] for p in self.order]
        self.counters = _Sum(pools, "counters")
        self.check = _Sum(pools, "check")
        self.group = _Sum(pools, "group")

    @property
    def carried(self) -> dict[int, list[int]]:
        """Every pool's bytes per collective (``InaEndpoint.carried``; a collective streams in one pool)."""
        return {seq: got for p in self.order for seq, got in self.endpoints[p].carried.items()}

    @staticmethod
    def timer_for(pool: int, timer: Callable[[float, int, int, float], None]) -> Callable[[float, int, int, float], None]:
        """The host's timer, as a pool's endpoint calls it: the pool in the local number's high bits."""
        return lambda t, local, slot, lost: timer(t, (pool << _POOL_BITS) | local, slot, lost)

    def _of(self, run: CollRun) -> InaEndpoint:
        group = run.op.group
        return self.endpoints[0 if group is None else self.pool_of[group]]

    # -- what the host asks of one endpoint ---------------------------------------------
    def pending(self) -> list[CollRun]:
        return [run for ep in self.endpoints.values() for run in ep.pending()]

    @property
    def scaled(self) -> _Sum | None:
        have = [p for p in self.endpoints.values() if p.scaled is not None]
        return _Sum(have, "scaled") if have else None

    def start(self, workers: int | np.ndarray, run: CollRun, real_elements: int) -> bool:
        return self._of(run).start(workers, run, real_elements)

    def most_resent(self) -> tuple[int, int, int, int]:
        return max(ep.most_resent() for ep in self.endpoints.values())

    def timer_fired(self, local: int, slot: int, t: float, lost: float) -> None:
        self.endpoints[local >> _POOL_BITS].timer_fired(local & _LOCAL, slot, t, lost)

    def pump(self) -> None:
        for p in self.order:
            self.endpoints[p].pump()

    def next_us(self) -> float:
        return min((ep.next_us() for ep in self.endpoints.values()), default=math.inf)

    def busy(self) -> bool:
        return any(ep.busy() for ep in self.endpoints.values())

    def link_events(self, nxt: np.ndarray) -> list[tuple[int, np.ndarray, float]]:
        """Every pool's (``InaEndpoint.link_events``)."""
        return [w for p in self.order for w in self.endpoints[p].link_events(nxt)]

    def waiting_links(self) -> list[tuple[int, np.ndarray]]:
        return [w for p in self.order for w in self.endpoints[p].waiting_links()]

    def inside(self, into: np.ndarray) -> None:
        for p in self.order:
            self.endpoints[p].inside(into)

    def lagging(self, run_t: np.ndarray, inside: np.ndarray) -> list[tuple[int, Lagging]]:
        return [x for p in self.order for x in self.endpoints[p].lagging(run_t, inside)]

    # -- uplinks ------------------------------------------------------------------------
    def due_up(self, bound: float, inclusive: bool) -> Packets | None:
        """Every pool's contributions due before the bound, as one set of rows in each uplink's FIFO
        order (a row's local number carries its pool)."""
        parts, links = [], []
        for p in self.order:
            ep = self.endpoints[p]
            pk = ep.due_up(bound, inclusive)
            if pk is not None:
                links.append(ep.link[pk.local])
                pk.local = (p << _POOL_BITS) | pk.local
                parts.append(pk)
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        fields = ("local", "headers", "payload", "send_us", "emu_packets", "retransmit", "sparse")
        pk = Packets(*(np.concatenate([getattr(x, f) for x in parts]) for f in fields))
        order = np.lexsort((pk.headers["chunk"], pk.local, pk.send_us, np.concatenate(links)))
        return pk if every_row(order, len(order)) else take(pk, order)  # in order already: no payload copy

    def _split(self, local: np.ndarray) -> list[tuple[int, np.ndarray]]:
        pools = local >> _POOL_BITS
        return [(int(p), np.flatnonzero(pools == p)) for p in np.unique(pools)]

    def send(self, pk: Packets) -> None:
        """Contributions cross their uplinks, every pool's in one transmission (its rows' order)."""
        parts = self._split(pk.local)
        if len(parts) == 1:
            p, _ = parts[0]
            pk.local = pk.local & _LOCAL
            self.endpoints[p].send(pk)
            return
        links = np.zeros(len(pk.local), np.int64)
        wire_bytes, packets = np.zeros(len(pk.local)), np.zeros(len(pk.local))
        mine = []
        for p, rows in parts:
            sub = take(pk, rows)
            sub.local = sub.local & _LOCAL
            links[rows], wire_bytes[rows], packets[rows] = self.endpoints[p].offer(sub)
            mine.append((p, rows, sub))
        sent = self.up.transmit(links, pk.send_us, wire_bytes, packets=packets, lossy=self._lossy())
        for p, rows, sub in mine:
            self.endpoints[p].sent(sub, type(sent)(*(np.asarray(a)[rows] for a in sent)), wire_bytes[rows],
                                   packets[rows])

    def _lossy(self) -> bool:
        return all(ep.scaled is None for ep in self.endpoints.values())

    def take_outgoing(self) -> AggBatch | None:
        batches = [b for b in (self.endpoints[p].take_outgoing() for p in self.order) if b is not None]
        return AggBatch.concat(batches) if batches else None

    @property
    def outgoing(self) -> _Outgoing:
        return _Outgoing(self)

    # -- downlinks ----------------------------------------------------------------------
    def _by_pool(self, batch: AggBatch) -> list[tuple[int, np.ndarray]]:
        pools = batch.headers["job"].astype(np.int64)
        return [(int(p), np.flatnonzero(pools == p)) for p in np.unique(pools)]

    def arrive(self, batch: AggBatch) -> None:
        for p, rows in self._by_pool(batch):
            self.endpoints[p].arrive(batch.take(rows))

    def receive(self, batch: AggBatch, leaves: np.ndarray | None = None) -> None:
        for p, rows in self._by_pool(batch):
            self.endpoints[p].receive(batch.take(rows), None if leaves is None else np.asarray(leaves)[rows])

    def due_down(self, bound: float, inclusive: bool) -> tuple[AggBatch, np.ndarray, np.ndarray] | None:
        """Every pool's results due before the bound, in stamp order (ties: by pool)."""
        parts = [r for r in (self.endpoints[p].due_down(bound, inclusive) for p in self.order) if r is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        batch = AggBatch.concat([b for b, _, _ in parts])
        order = np.argsort(batch.stamps[:, 0], kind="stable")
        return (batch.take(order), np.concatenate([v for _, v, _ in parts])[order],
                np.concatenate([t for _, _, t in parts])[order])

    def on_results(self, batch: AggBatch, verify: np.ndarray, tags: np.ndarray | None = None) -> None:
        """Results cross the downlinks, every pool's in one transmission, per link in stamp order."""
        parts = self._by_pool(batch)
        if len(parts) == 1:
            self.endpoints[parts[0][0]].on_results(batch, verify, tags)
            return
        asked: list[tuple[InaEndpoint, AggBatch, np.ndarray, Deliveries]] = []
        for p, rows in parts:
            ep = self.endpoints[p]
            sub, sub_verify = batch.take(rows), verify[rows]
            rows_out = ep.deliveries(sub, None if tags is None else tags[rows])
            if rows_out is not None:
                asked.append((ep, sub, sub_verify, rows_out))
        if not asked:
            return
        links = np.concatenate([d.links for *_, d in asked])
        ready = np.concatenate([d.ready for *_, d in asked])
        owner = np.concatenate([np.full(len(d.links), i) for i, (*_, d) in enumerate(asked)])
        order = np.lexsort((np.arange(len(links)), owner, ready, links))  # each link in stamp order
        cat = {f: np.concatenate([getattr(d, f) for *_, d in asked])[order]
               for f in ("links", "ready", "ready_last", "row_bytes", "scale")}
        got = self.down.transmit(cat["links"], cat["ready"], cat["row_bytes"], packets=cat["scale"],
                                 ready_last_us=cat["ready_last"], lossy=self._lossy())
        back = np.empty(len(order), np.int64)
        back[order] = np.arange(len(order))
        start = 0
        for ep, sub, sub_verify, d in asked:
            rows = back[start:start + len(d.links)]
            start += len(d.links)
            ep.delivered_rows(d, type(got)(*(np.asarray(a)[rows] for a in got)), sub, sub_verify)


class _Outgoing:
    """``outgoing.append``: what the leaves' links delivered up, for the switch (any pool's)."""

    def __init__(self, pools: InaPools) -> None:
        self.pools = pools

    def append(self, batch: AggBatch) -> None:
        self.pools.endpoints[self.pools.order[0]].outgoing.append(batch)


def pools_of(host_workers: np.ndarray, index: dict[int, int], groups: tuple[tuple[int, ...], ...],
             slots: tuple[tuple[int, int], ...]) -> list[Pool]:
    """The sub-group pools this host's workers are in: pool ``1 + i`` is ``groups[i]`` with
    ``slots[i]`` (real, emulated)."""
    mine = set(int(w) for w in host_workers)
    out = []
    for i, (members, (real, emulated)) in enumerate(zip(groups, slots, strict=True)):
        here = [r for r, w in enumerate(members) if w in mine]
        if not here:
            continue
        ids = np.asarray([members[r] for r in here], np.int64)
        out.append(Pool(job=1 + i, workers=len(members), real_slots=real, emulated_slots=emulated,
                        ranks=np.asarray(here, np.int64), ids=ids,
                        locals=np.asarray([index[int(w)] for w in ids], np.int64), seed_offset=7919 * (1 + i)))
    return out


__all__ = ["InaPools", "InaCounters", "pools_of"]
