"""What a host tells the synchronized clock besides its next event (docs/design-notes.md): when its
uplinks can next send (``Departures``), what each slot pool's members have started (``Lagging``),
and, on a topology of several leaves, the earliest a row its NICs have not handed on can reach
each leaf's link up (``leaf_horizon``). ``Horizons`` is ``emu.replay.host.runtime.Host``'s part
that answers them; every answer is a minimum over links and endpoints, so it does not depend on
how the endpoints are spread over processes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from emu.emulator.protocol.window import Departures, Lagging
from emu.replay.config.options import Clock
from emu.replay.host.p2p_batched import BatchedP2P

if TYPE_CHECKING:
    from emu.replay.host.leaves import LeafStage
    from emu.replay.host.runtime import Host

RUN, RETX = 0, 1  # a host's local event kinds (its heap), in the order they are handled at equal times


class Horizons:
    """``Host``'s answers to the clock (module docstring); the state is the host's."""

    def departures(self) -> Departures:
        """When the uplinks can next start to send (``emu.emulator.protocol.window.Departures``):
        every uplink is a FIFO (``emu.emulator.links.array.LinkArray``), busy until its free time,
        and sends only for an event of an endpoint on it. With leaves' links, a row queued for
        one up (what already left a NIC) counts as a departure at its arrival there: a leaf's
        link sends no earlier, and what its NICs send reaches it a NIC's hop later, past the
        window (one lookahead at most); a row queued down wakes a NIC no earlier than the least
        free time of its leaf's NICs (a host holds whole leaves: the same on every layout), and
        never earlier than the switch counts a segment it just forwarded (``Windows._queued``),
        so the bound does not depend on whether a forwarded segment reached its host before the
        host's report."""
        self.ina.pump()
        free = self.up.free_us
        nxt = np.full(len(free), math.inf)
        pools = self.ina.link_events(nxt)
        # per link the later of its free time and its next event, least over the links: the least
        # over the events of the later of their link's free time and their own time
        local = float(np.maximum(free, nxt).min(initial=math.inf))
        if isinstance(self.p2p, BatchedP2P):
            local = min(local, self.p2p.departs_us(free, self.down.free_us))
        else:
            nxt.fill(math.inf)
            self.p2p.link_events(nxt, self.down.free_us)
            local = min(local, float(np.maximum(free, nxt).min(initial=math.inf)))
        least = float(free.min(initial=math.inf))
        if self.heap and self.heap[0][0] < local:  # an event at or past ``local`` cannot lower it
            local = min(local, float(np.maximum(free[self._link_of], self._run_t).min()))
            if self._timers:  # a retransmission timer: on any link
                local = min(local, max(least, min(e[0] for e in self.heap if e[1] == RETX)))
        leaves = self.wiring.leaves
        if leaves is not None:
            by_leaf = np.full(len(leaves.leaves), math.inf)
            np.minimum.at(by_leaf, self._leaf_links(), free)
            local = min(local, leaves.next_us(0), leaves.down_wakes_us(by_leaf))
        waiting = [(math.inf, math.inf)] * (1 + max((p for p, _, _ in pools), default=-1))
        for p, links, results in pools:
            waiting[p] = (min(waiting[p][0], float(free[links].min(initial=math.inf))), min(waiting[p][1], results))
        return Departures(least, local, tuple(waiting), self._lagging(len(waiting)))

    def _lagging(self, pools: int) -> tuple[Lagging, ...]:
        """Per slot pool, what its members here have started (``Lagging``): a worker inside a
        collective of any kind may end it for something from outside. Only the leaves' horizons
        ask (``leaf_horizon``): none without them."""
        if self.wiring.leaves is None:
            return ()
        inside = np.zeros(len(self._run_t), bool)
        self.ina.inside(inside)
        if isinstance(self.p2p, BatchedP2P):  # its kernels' runs are not by worker: any may be inside one
            inside[:] = True
        inside[self.p2p.inside_ids()] = True
        out = [Lagging()] * pools
        for p, lag in self.ina.lagging(self._run_t, inside):
            out[p] = Lagging.least([out[p], lag])
        return tuple(out)

    def leaf_horizon(self, bound: float, into: np.ndarray, quiet_us: tuple[float, ...] = ()) -> None:
        """Into ``into`` (per leaf of ``self.wiring.leaves``, its index there): the earliest a row
        this host's NICs have not yet handed on can reach the leaf's link up, after a window's
        uplinks ran to ``bound``. A NIC (a FIFO) sends what it is given later no earlier than it
        is free, nor before something makes it send: an event of an endpoint on it (a worker's
        program, a packet or segment due, a segment inside a node, a retransmission timer: any
        link), or a wake from outside (``_outside_wakes``). The row then arrives a NIC's hop
        later. The synchronized clock only."""
        w = self.wiring
        assert w.leaves is not None and not isinstance(self.p2p, BatchedP2P)
        hop = self.cfg.nic_hop_us()
        nxt = np.full(len(w.up.free_us), math.inf)
        self.ina.link_events(nxt)
        self.p2p.link_events(nxt, self.down.free_us)
        if self.heap:
            np.minimum.at(nxt, self._link_of, self._run_t)
            if self._timers:
                nxt = np.minimum(nxt, min(e[0] for e in self.heap if e[1] == RETX))
        wake = self._outside_wakes(bound, hop, quiet_us)
        start = np.maximum(np.maximum(w.up.free_us, np.minimum(nxt, wake)), bound)
        np.minimum.at(into, self._leaf_links(), start + hop)

    def _outside_wakes(self, bound: float, hop: float, quiet_us: tuple[float, ...]) -> np.ndarray:
        """Per uplink, the earliest something from outside can make it send: a result or segment
        held here is due at or past the bound, one not yet here leaves the switch no earlier;
        either crosses a NIC's hop down. (The earliest held here would make the horizon follow
        which leaves a host holds, and whether a forwarded segment reached it before its pass.)
        Only an endpoint that waits for something receives it: a worker inside a point-to-point
        collective, a parameter-server shard, a worker with a slot sent to a pool and not back.
        And a pool whose lagging member has not started its next collective sends no result
        before that member's next resumption (``quiet_us``, the clock's where its bound counts
        the queues: no real row is lost, no result is resent; ``Lagging``). Without
        ``quiet_us``: every link at the bound."""
        w = self.wiring
        if not quiet_us:
            return np.full(len(w.up.free_us), bound + hop)
        wake = np.full(len(w.up.free_us), math.inf)
        p2p = self.p2p.inside_ids(servers=True)
        if len(p2p):
            wake[self._link_of[p2p]] = bound + hop
        for pool, links in self.ina.waiting_links():
            quiet = quiet_us[pool] if pool < len(quiet_us) else -math.inf
            wake[links] = np.minimum(wake[links], max(bound, quiet) + hop)
        return wake

    def _leaf_links(self) -> np.ndarray:
        """Per uplink, its leaf's index in the leaves' stage."""
        w = self.wiring
        if self._leaf_of_link is None:
            assert w.leaves is not None and w.layout is not None
            ends = np.fromiter(w.link.keys(), np.int64, len(w.link))
            links = np.fromiter(w.link.values(), np.int64, len(w.link))
            self._leaf_of_link = np.zeros(len(w.up.free_us), np.int64)
            self._leaf_of_link[links] = np.searchsorted(w.leaves.leaves, w.layout.leaf[ends])
        return self._leaf_of_link


def leaf_horizons(hosts: list[Host], leaves: LeafStage, bound: float,
                  quiet_us: tuple[float, ...] = ()) -> np.ndarray | None:
    """Per leaf of ``leaves``, the least of the ``hosts``' horizons (``Host.leaf_horizon``: every
    job's NICs on a leaf feed its link); None on the wall clock, whose switch answers as things
    come."""
    if not hosts or hosts[0].cfg.resolved_clock != Clock.SYNC:
        return None
    horizon = np.full(len(leaves.leaves), math.inf)
    for h in hosts:
        h.leaf_horizon(bound, horizon, quiet_us)
    return horizon


