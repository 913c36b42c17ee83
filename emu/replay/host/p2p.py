"""A host's point-to-point endpoint: ring, tree, all-to-all, send/recv and parameter-server traffic.

Each collective that does not run on the aggregation stream runs here as an algorithm of
``emu.emulator.algorithms.p2p`` per worker (which one is the fabric's choice), exchanging segments
through the switch; a parameter-server host's shards live here too. A collective on a sub-group
(``Coll.group``: its workers) runs its algorithm among the group's members, numbered 0..g-1
in ascending order, and its segments go to the members' own ids. A sparse float all_reduce
on a ring or parameter server runs the sparse algorithm of ``emu.emulator.algorithms.sparse_p2p`` where it
sends fewer bytes than the dense one (the same choice on every worker). Like the aggregation
endpoint it keeps what waits for its time, and the host decides when it crosses the links.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from emu.emulator.algorithms.p2p import Algorithm, Check, PSServer, Seg
from emu.emulator.algorithms.sparse_p2p import SPARSE_SEGMENT, SparsePSServer
from emu.emulator.fabric import Fabric
from emu.emulator.links import topology as shape
from emu.emulator.mechanisms import Mechanism, Start
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.protocol import wire
from emu.emulator.protocol.transport import FrameError, Segment
from emu.errors import RunFailed
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.messages import CARRIED_UNIT
from emu.replay.host.wiring import Wiring
from emu.replay.host.worker import CollRun
from emu.traces.model import CollKind

# a segment waiting for its send time: (time, collective, segment, source, destination) order it;
# at equal times a shared NIC takes its workers' segments in turn (segment 0 of each, then 1, ...),
# as its arbitration shares it, not one worker's whole burst after another's
UpSeg = tuple[float, int, int, int, int, Seg, str]
Hand = Callable[[int, int], None]  # hands a window's due segments a to b on (``due_up``, ``due_down``)


def _reply_turns(layout: shape.Layout | None) -> np.ndarray | None:
    """The order in which a dense parameter-server shard answers the workers on a topology, as each
    worker's turn: NIC by NIC in turn (the first worker of every NIC, then the second of each, ...),
    so that a NIC shared by several workers gets one answer while the others get theirs, not all of
    its workers' answers back to back while other NICs idle. Without sharing (a NIC a worker, or no
    topology) it is rank order, as on one switch. (A sparse shard numbers its answers by destination
    already, which orders them first.)"""
    if layout is None or layout.busiest_nic() == 1:
        return None
    w = np.arange(layout.workers)
    by_nic = np.lexsort((w, layout.nic))
    nics, first = np.unique(layout.nic[by_nic], return_index=True)
    counts = np.diff(np.r_[first, layout.workers])
    place = np.empty(layout.workers, np.int64)
    place[by_nic] = w - np.repeat(first, counts)  # each worker's place among its NIC's workers
    turn = np.empty(layout.workers, np.int64)
    turn[np.lexsort((layout.nic, place))] = w
    return turn


class P2PEndpoint:
    batched = False  # segments one at a time (``emu.replay.host.p2p_batched``: a window's at once)

    def __init__(self, cfg: ReplayConfig, net: Fabric, servers: tuple[int, ...], wiring: Wiring,
                 index: dict[int, int], host: int, completed: Callable[[np.ndarray, CollRun, np.ndarray], None],
                 recorded: RecordedPayload | None = None, job: int = 0,
                 groups: tuple[tuple[int, ...] | None, ...] = ()) -> None:
        """``groups``: a sharded or split job's, for the parameter-server shards: per collective
        number within an iteration, its group's workers (None: the whole job; empty: every one);
        ``completed(ids, run, ends)``: workers ``ids`` (an array) completed ``run``, at ``ends``."""
        self.cfg, self.net, self.index, self.job = cfg, net, index, job
        self.wiring, self.up, self.down = wiring, wiring.up, wiring.down
        self._nodes: tuple[dict[int, list[int]], list[int]] | None = None
        self.recorded = recorded  # the real ranks' tensors, sent in place of generated payload (emu run)
        self.host, self.completed = host, completed
        self.m = cfg.workers
        self.check = Check()
        self.bytes_sent = 0.0  # on the network's links (NICs), both ways; traffic inside nodes is not counted
        # segments that stood for payload on the emulated wire, and those of them with no real
        # element (a payload scale so coarse that a chunk of the real tensor is empty)
        self.payload_segments = 0
        self.empty_segments = 0
        # per collective (its seq): the payload bytes (values, and a sparse message's indices) and the
        # header and framing bytes of every segment sent, once where it was sent, resends aside, in
        # CARRIED_UNIT parts of a byte: what crossed the wire (the report's sparsity.sent_bytes)
        self.carried: dict[int, list[int]] = {}
        self.algs: dict[tuple[int, int], Algorithm] = {}
        self.runs: dict[tuple[int, int], CollRun] = {}
        # per endpoint id, its runs in ``runs`` (the clock asks every window which endpoints are
        # inside one: ``inside_ids``), and the shards' ids
        self.running = np.zeros(max(index, default=-1) + 1, np.int64)
        self._server_ids = np.asarray(sorted(servers), np.int64)
        # a sub-group collective's members (its algorithm's ranks) and each one's rank among them
        self.members: dict[tuple[int, int], tuple[tuple[int, ...], dict[int, int]]] = {}
        self._ranks: dict[tuple[int, ...], dict[int, int]] = {}
        self.early: dict[tuple[int, int], list[tuple[int, int, np.ndarray, float]]] = {}
        self.groups = groups
        self.servers = {e: PSServer(self.m, groups) for e in servers}
        self._turn = _reply_turns(wiring.layout) if servers else None
        self.sparse_servers = {e: SparsePSServer(self.m) for e in servers}
        # only the synchronized clock asks when a shard can send (the wall clock's switch answers as
        # things come): elsewhere nothing is kept
        self.shard_wakes = ShardWakes(PSServer(self.m, groups).needed, cfg.resolved_clock == Clock.SYNC)
        # segments to send (keyed by their source's link) and to receive (by their destination's);
        # a segment inside a node counts for both its ends (it may make either send)
        link = wiring.link
        self.up_heap = _Timed(lambda e: (link[e[3]],))
        self.down_heap = _Timed(lambda e: (link[e[1]],))
        # with node passes (ReplayConfig.node_passes), the segments inside a node wait apart
        self.split_inside = cfg.node_passes and wiring.intra_up is not None
        self.inside_up = _Timed(lambda e: (link[e[3]], link[e[5].dst]))
        self.inside_down = _Timed(lambda e: (link[e[1]],))
        self.outgoing: list[Segment] = []
        # the least time from a segment's first packet at the switch to its endpoint acting on it: the
        # downlink's hop (``link_events``; jitter, loss and a busy link only add)
        self.down_hop_us = cfg.nic_hop_us()

    def next_us(self) -> float:
        return min(self.up_heap.first(), self.down_heap.first(), self.inside_us())

    def link_events(self, nxt: np.ndarray, down_free: np.ndarray) -> None:
        """Into ``nxt`` (per uplink): the earliest segment to send from an endpoint on it, or to
        reach one (which may make it send): one from the switch no earlier than its downlink, a
        FIFO busy until ``down_free``, can start on it, and it is in a link's hop later (its
        latency and the least serialization: ``ReplayConfig.nic_hop_us``), when its endpoint can
        act on it (``BatchedP2P.departs_us`` alike)."""
        for q in (self.up_heap, self.inside_down, self.inside_up):
            q.earliest(nxt)
        if self.down_heap.by_link:
            down = np.full(len(nxt), math.inf)
            if self.servers:
                self.shard_wakes.earliest(down)
            else:
                self.down_heap.earliest(down)
            # without node passes, segments inside a node wait here too, and cross the node's own link
            crosses_nic = self.split_inside or self.wiring.intra_up is None
            np.minimum(nxt, np.maximum(down, down_free) + self.down_hop_us if crosses_nic else down, out=nxt)

    def inside_us(self) -> float:
        """The earliest segment inside a node on its way: to be sent, or to arrive (inf: none)."""
        return min(self.inside_up.first(), self.inside_down.first())

    # -- collectives --------------------------------------------------------------------
    def pending(self) -> list[CollRun]:
        """Each started run not yet completed, once per worker."""
        return list(self.runs.values())

    def inside_ids(self, servers: bool = False) -> np.ndarray:
        """The endpoints inside a collective run here (``runs``), ascending, and with ``servers``
        the shards after them: those waiting for something from outside (``emu.replay.host.horizons``)."""
        ids = np.flatnonzero(self.running)
        return np.concatenate([ids, self._server_ids]) if servers and len(self._server_ids) else ids

    def start_many(self, ws: np.ndarray, run: CollRun, real_elements: int, mech: Mechanism) -> None:
        """Workers ``ws`` (a cohort's members) start one collective, in their order (``start``)."""
        for w in ws.tolist():
            self.start(w, run, real_elements, mech)

    def start(self, w: int, run: CollRun, real_elements: int, mech: Mechanism) -> None:
        """Worker ``w`` starts a collective that ``mech`` runs (the fabric's choice: emu.emulator.mechanisms)."""
        key = (w, run.seq)
        self.running[w] += key not in self.runs
        self.runs[key] = run
        if run.op.group is not None:
            group = run.op.group
            ranks = self._ranks.get(group)
            if ranks is None:
                ranks = self._ranks[group] = {g: i for i, g in enumerate(group)}
            self.members[key] = (group, ranks)
        alg = self._algorithm(w, run, real_elements, mech)
        if mech.servers:
            self.members.pop(key, None)  # it talks to the shards, by their own ids, not to its group
        self.algs[key] = alg
        self._queue(w, self._out(key, alg.start(run.start_us)), alg.dtype)
        for src, seg, data, t in self.early.pop(key, []):
            self._queue(w, self._out(key, alg.on_segment(self._in(key, src), seg, data, max(t, run.start_us))),
                        alg.dtype)
        if alg.finished:
            self._finish(w, run.seq)

    def _out(self, key: tuple[int, int], segs: list[Seg]) -> list[Seg]:
        """A sub-group algorithm's sends, to its members' own ids."""
        group = self.members.get(key)
        if group is not None:
            for seg in segs:
                seg.dst = group[0][seg.dst]
        return segs

    def _in(self, key: tuple[int, int], src: int) -> int:
        """A sender's rank among a sub-group algorithm's members."""
        group = self.members.get(key)
        return src if group is None else group[1][src]

    def _algorithm(self, w: int, run: CollRun, real: int, mech: Mechanism) -> Algorithm:
        return mech.algorithm(self._start_of(w, run, real, mech))

    def _start_of(self, w: int, run: CollRun, real: int, mech: Mechanism) -> Start:
        """What ``mech`` needs to run collective ``run`` on worker ``w``."""
        op, cfg = run.op, self.cfg
        group = None
        if op.group is not None:
            ranks = self._ranks.get(op.group)
            if ranks is None:
                ranks = self._ranks[op.group] = {g: i for i, g in enumerate(op.group)}
            group = (op.group, ranks)
        rank, m = (w, self.m) if group is None else (group[1][w], len(group[0]))  # among the group's members
        root = op.root or 0  # a broadcast's, among the group's members where it has one
        if group is not None and op.kind == CollKind.BROADCAST:
            root = group[1][root]
        servers = tuple(self.m + j for j in range(cfg.shards)) if mech.servers else ()
        return Start(op=op, rank=rank, size=m, seq=run.seq, real=real, seed=cfg.seed, check=self.check,
                     recorded=self.recorded, servers=servers, node=lambda: self._node_of(w),
                     root=root, member_nodes=lambda: self._member_nodes(group), scale=cfg.scale)

    def _member_nodes(self, group: tuple[tuple[int, ...], dict[int, int]] | None) -> tuple[int, ...]:
        """Each member's node (the job's workers, or a group's), every member its own without a topology."""
        members = range(self.m) if group is None else group[0]
        lay = self.wiring.layout
        return tuple(members) if lay is None else tuple(int(n) for n in lay.node[list(members)])

    def _node_of(self, w: int) -> tuple[list[int], list[int]]:
        """Worker w's node (its workers, the leader first) and every node's leader, in node order
        (worked out once: the layout is the job's)."""
        if self._nodes is None:
            lay = self.wiring.layout
            assert lay is not None
            order = np.argsort(lay.node, kind="stable")  # by node, then rank
            nodes, starts = np.unique(lay.node[order], return_index=True)
            members = np.split(order, starts[1:])
            self._nodes = ({int(n): m.tolist() for n, m in zip(nodes, members, strict=True)},
                           [int(m[0]) for m in members])  # the leader: a node's lowest rank
        by_node, leaders = self._nodes
        assert self.wiring.layout is not None
        return by_node[int(self.wiring.layout.node[w])], leaders

    def _finish(self, w: int, seq: int) -> None:
        self.members.pop((w, seq), None)
        alg = self.algs.pop((w, seq))
        run = self.runs.pop((w, seq))
        self.running[w] -= 1
        self.completed(np.array([w], np.int64), run, np.array([alg.end_us], np.float64))

    def _queue(self, src: int, segs: list[Seg], dtype: str) -> None:
        # a shard's answers, sent at once, leave in its turn order (``_reply_turns``); else by destination
        turn = self._turn if src in self.servers else None
        for seg in segs:
            inside = self.split_inside and self.wiring.same_node(src, seg.dst)
            (self.inside_up if inside else self.up_heap).push((seg.send_us, seg.seq, seg.segment, src,
                                                                seg.dst if turn is None else int(turn[seg.dst]), seg,
                                                                seg.wire_dtype or dtype))

    # -- uplinks ------------------------------------------------------------------------
    def due_up(self, bound: float, inclusive: bool) -> tuple[np.ndarray, Hand]:
        """Every segment due before the bound, in (time, collective, segment, source) order: their
        send times, and what sends segments a to b of them onto their uplinks."""
        segs: list[UpSeg] = self.up_heap.due(bound, inclusive)

        def send(a: int, b: int) -> None:
            for _, _, _, src, _, seg, dtype in segs[a:b]:
                self.send(src, seg, dtype)
        return np.array([e[0] for e in segs]), send

    def send(self, src: int, seg: Seg, dtype: str) -> None:
        packets, wire_bytes = _wire(seg.emu_bytes)
        if seg.emu_bytes > 0:
            self.payload_segments += 1
            self.empty_segments += not len(seg.data)
        carried = self.carried.get(seg.seq)
        if carried is None:
            carried = self.carried[seg.seq] = [0, 0]
        payload = round(seg.emu_bytes * CARRIED_UNIT)
        carried[0] += payload
        carried[1] += round(wire_bytes * CARRIED_UNIT) - payload
        w = self.wiring
        inside = w.same_node(src, seg.dst)
        if inside:  # through the node's own fabric, never its NICs (emu.replay.host.wiring)
            assert w.intra_up is not None
            first, last, _ = w.intra_up.send_segment(self.index[src], seg.send_us, wire_bytes, packets)
        else:
            first, last, resent = self.up.send_segment(w.link[src], seg.send_us, wire_bytes, packets)
            self.bytes_sent += round(wire_bytes + resent)
        segment = Segment(self.job, dtype, src, seg.dst, seg.seq, seg.segment, seg.emu_bytes, first, last, seg.data)
        if inside:
            self.receive(segment, inside=True)
        elif w.leaves is not None and w.crosses(src, seg.dst):  # on to the spine through its leaf
            assert w.layout is not None
            w.leaves.segment(0, int(w.layout.leaf[src]), segment, wire_bytes, packets)
        else:
            self.outgoing.append(segment)

    def arrive(self, seg: Segment) -> None:
        """A segment from the switch: through its leaf's link from the spine first, where it crossed."""
        src, dst = seg.src, seg.dst
        w = self.wiring
        if w.leaves is not None and dst < self.m and w.crosses(src, dst):
            assert w.layout is not None
            packets, wire_bytes = _wire(seg.emu_bytes)
            w.leaves.segment(1, int(w.layout.leaf[dst]), seg, wire_bytes, packets)
        else:
            self.receive(seg)

    def take_outgoing(self) -> list[Segment]:
        out, self.outgoing = self.outgoing, []
        return out

    # -- downlinks ----------------------------------------------------------------------
    def receive(self, seg: Segment, inside: bool = False) -> None:
        """A segment for one of this host's endpoints (``inside``: from a worker of the same node)."""
        heap = self.inside_down if inside and self.split_inside else self.down_heap
        heap.push((seg.first_us, seg.dst, seg.src, seg.seq, seg.segment, inside, seg))
        if self.servers:
            one = np.array([[seg.dst, seg.seq, seg.segment]], np.int64)
            self.shard_wakes.arrive(np.array([self.wiring.link[seg.dst]]), one, np.array([seg.first_us]))

    def due_down(self, bound: float, inclusive: bool) -> tuple[np.ndarray, Hand]:
        """Every segment from the switch due before the bound (and, without node passes, from inside
        a node), in stamp order: their stamps, and what hands segments a to b of them on
        (``on_segment``)."""
        segs = [(e[-1], e[-2]) for e in self.down_heap.due(bound, inclusive)]
        self.shard_wakes.passed(bound)

        def deliver(a: int, b: int) -> None:
            for seg, inside in segs[a:b]:
                self.on_segment(seg, inside)
        return np.array([s.first_us for s, _ in segs]), deliver

    def due_inside_down(self, bound: float) -> list[tuple[Segment, bool]]:
        """With node passes: the segments inside a node arriving before the bound, in stamp order."""
        return [(e[-1], e[-2]) for e in self.inside_down.due(bound, False)]

    def due_inside_up(self, bound: float) -> list[UpSeg]:
        """With node passes: the segments inside a node to send before the bound, in order."""
        return self.inside_up.due(bound, False)

    def on_segment(self, seg: Segment, inside: bool = False) -> None:
        """A segment crosses its downlink (its node port, ``inside``) and reaches its algorithm (or shard)."""
        src, dst, seq, segno = seg.src, seg.dst, seg.seq, seg.segment
        if dst not in self.index:
            raise FrameError(f"segment for endpoint {dst}, which host {self.host} does not hold")
        packets, wire_bytes = _wire(seg.emu_bytes)
        if inside:
            assert self.wiring.intra_down is not None
            t, _ = self.wiring.intra_down.receive_segment(self.index[dst], seg.first_us, seg.last_us, wire_bytes,
                                                          packets)
        else:
            t, resent = self.down.receive_segment(self.wiring.link[dst], seg.first_us, seg.last_us, wire_bytes,
                                                  packets)
            self.bytes_sent += round(wire_bytes + resent)
        if dst in self.servers and segno & SPARSE_SEGMENT:
            self._queue(dst, self.sparse_servers[dst].on_segment(dst, seq, seg.values, t), seg.dtype)
            return
        if dst in self.servers:
            replies = self.servers[dst].on_segment(dst, src, seq, segno, seg.values, seg.emu_bytes, t)
            self._queue(dst, replies, seg.dtype)
            return
        key = (dst, seq)
        alg = self.algs.get(key)
        if alg is None:
            self.early.setdefault(key, []).append((src, segno, seg.values, t))
            return
        self._queue(dst, self._out(key, alg.on_segment(self._in(key, src), segno, seg.values, t)), alg.dtype)
        if alg.finished and key in self.runs:
            self._finish(dst, seq)


class ShardWakes:
    """When a push still to arrive at a parameter-server shard can make it send (a wake from
    outside: ``P2PEndpoint.link_events``, ``BatchedP2P.departs_us``). A shard sends a sum once it
    has every member's push, so only a push that completes one does, and no earlier than the last
    of them reaches the shard's downlink; a sparse push at its own time (its shard answers each).
    Per sum, the pushes that reached the host so far (``arrive``); per shard link, the sums that
    have them all, by the time of the last. A sum's pushes all cross the downlink in the window
    whose bound passes its last one, and complete it there: the sums behind the bound are gone
    (``passed``). Where a sum's last push arrives early, the wake is early: never late."""

    def __init__(self, needed: Callable[[int], int], kept: bool = True) -> None:
        self.needed = needed  # the pushes a sum of collective ``seq`` takes
        self.kept = kept  # False: nobody asks (the wall clock), nothing is kept
        # the sums with some of their pushes, by key (``_code``), sorted: pushes so far, the last's time
        self.keys = np.zeros(0, np.int64)
        self.pushes = np.zeros(0, np.int64)
        self.last = np.zeros(0)
        self.ready: dict[int, list[float]] = {}  # per shard link, heaps of complete sums' last pushes
        self._passed = -math.inf

    def arrive(self, links: np.ndarray, keys: np.ndarray, t: np.ndarray) -> None:
        """Pushes reaching the host: per push its shard's link, (shard, collective, segment) and
        its first packet's time."""
        if not self.kept:
            return
        sparse = (keys[:, 2] & SPARSE_SEGMENT) != 0
        for i in np.flatnonzero(sparse).tolist():
            heapq.heappush(self.ready.setdefault(int(links[i]), []), float(t[i]))
        dense = np.flatnonzero(~sparse)
        if not len(dense):
            return
        uniq, which = np.unique(_code(keys[dense]), return_inverse=True)
        which = which.reshape(-1)
        last = np.full(len(uniq), -math.inf)
        np.maximum.at(last, which, t[dense])
        link = np.empty(len(uniq), np.int64)
        link[which] = links[dense]
        at = np.minimum(np.searchsorted(self.keys, uniq), max(len(self.keys) - 1, 0))
        found = self.keys[at] == uniq if len(self.keys) else np.zeros(len(uniq), bool)
        total = np.bincount(which, minlength=len(uniq)) + np.where(found, self.pushes[at] if len(self.keys) else 0, 0)
        if len(self.keys):
            last = np.where(found, np.maximum(last, self.last[at]), last)
        seqs, by_seq = np.unique(uniq >> _SEQ_SHIFT, return_inverse=True)
        ready = total >= np.array([self.needed(int(q)) for q in seqs.tolist()], np.int64)[by_seq.reshape(-1)]
        keep = np.ones(len(self.keys), bool)
        keep[at[found]] = False  # those found leave, and come back below unless complete
        back = ~ready
        order = np.argsort(np.concatenate([self.keys[keep], uniq[back]]), kind="stable")
        self.keys = np.concatenate([self.keys[keep], uniq[back]])[order]
        self.pushes = np.concatenate([self.pushes[keep], total[back]])[order]
        self.last = np.concatenate([self.last[keep], last[back]])[order]
        for li, tl in zip(link[ready].tolist(), last[ready].tolist(), strict=True):
            heapq.heappush(self.ready.setdefault(li, []), tl)

    def passed(self, bound: float) -> None:
        """The host's downlinks ran to ``bound``: every push before it crossed."""
        self._passed = max(self._passed, bound)

    def earliest(self, into: np.ndarray) -> None:
        """Into ``into`` (per link): the least of its own and the earliest its shard can be made to
        send by a push still to arrive."""
        for li in list(self.ready):
            heap = self.ready[li]
            while heap and heap[0] < self._passed:
                heapq.heappop(heap)
            if heap:
                into[li] = min(into[li], heap[0])
            else:
                del self.ready[li]


_SEGMENT_BITS, _SHARD_BITS, _SEQ_BITS = 22, 20, 21
_SEQ_SHIFT = _SEGMENT_BITS + _SHARD_BITS


def _code(keys: np.ndarray) -> np.ndarray:
    """(shard, collective, segment) rows as one sortable int64 each."""
    shard, seq, segment = keys[:, 0], keys[:, 1], keys[:, 2]
    if shard.max() >> _SHARD_BITS or segment.max() >> _SEGMENT_BITS or seq.max() >> _SEQ_BITS:
        raise RunFailed(f"a parameter-server push names shard {int(shard.max())}, collective {int(seq.max())} or "
                        f"segment {int(segment.max())}: past the {_SHARD_BITS}, {_SEQ_BITS} and {_SEGMENT_BITS} "
                        "bits the clock's count of a shard's sums keys them by (emu.replay.host.p2p.ShardWakes); "
                        "replay fewer iterations or workers, or a smaller gradient, or please report it")
    return (seq << _SEQ_SHIFT) | (shard << _SEGMENT_BITS) | segment


@lru_cache(maxsize=4096)
def _wire(emu_bytes: float) -> tuple[int, float]:
    """A segment's packets and bytes on a link (asked at both ends of every hand-off; a
    collective's segments share a few sizes)."""
    packets = wire.p2p_packets(int(math.ceil(emu_bytes)))
    return packets, emu_bytes + packets * (wire.FRAME_OVERHEAD + wire.P2P_HEADER.itemsize)


class _Timed:
    """Events in a heap keyed by time, and per uplink the times of those that concern it, so that
    the earliest per link (asked of every link each window: ``link_events``) needs no scan of the
    heap, which can hold a shard's M answers. The heap pops its least time, which is then the
    least of each of its links' times too: they pop with it."""

    def __init__(self, links_of: Callable[[tuple], tuple[int, ...]]) -> None:
        self.heap: list[tuple] = []
        self.by_link: dict[int, list[float]] = {}
        self._links_of = links_of

    def first(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def push(self, entry: tuple) -> None:
        heapq.heappush(self.heap, entry)
        for i in self._links_of(entry):
            heapq.heappush(self.by_link.setdefault(i, []), entry[0])

    def due(self, bound: float, inclusive: bool) -> list:
        """The entries due before the bound (at or before it, ``inclusive``), in order."""
        heap, out = self.heap, []
        while heap and (heap[0][0] <= bound if inclusive else heap[0][0] < bound):
            entry = heapq.heappop(heap)
            out.append(entry)
            for i in self._links_of(entry):
                times = self.by_link[i]
                heapq.heappop(times)
                if not times:
                    del self.by_link[i]
        return out

    def earliest(self, nxt: np.ndarray) -> None:
        """Into ``nxt`` (per link): the least of its own time and its links' first events."""
        for i, times in self.by_link.items():
            if times[0] < nxt[i]:
                nxt[i] = times[0]
