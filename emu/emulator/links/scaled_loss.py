"""Loss under payload scale: what the emulated packets a real row stands for lose, and what it costs.

With payload scale ``R`` a real aggregation row stands for ``R`` emulated packets, and in
the emulated pool those packets sit in ``G`` different slots (the emulated slots a real
slot stands for), each a self-clocking chain of its own. A lost packet delays its own
chain by a timeout; the other chains go on. Losing the real row instead (with
probability ``1 - (1 - p) ** R``) and stalling all ``G`` chains for a timeout made loss
cost about ``R`` times what it does (docs/physics.md, "Loss").

So at ``R > 1`` real rows are never dropped (every real element still crosses and is
checked), and the emulated packets' fate is drawn here, per chunk, for every worker of
the job, from a generator keyed by (seed, chunk): every host computes the same numbers
whatever the process layout. For each chunk:

- ``k_up[w]``, ``k_down[w]``: the emulated packets worker ``w``'s uplink and downlink lose
  (Binomial(per, p), then Binomial of those for each resend round); each is resent, so its
  bytes cross the link again;
- which positions of the row were hit (a position is lost if any worker's packet or
  result there was), hence which sub-chains; each hit costs a timeout per round until a
  retry goes through the worker's two link directions (geometric, success ``(1-p)**2``);
- ``D``: per real slot, how far each of its ``G`` sub-chains is behind the row (a timeout
  per loss, accumulated along the chain). The row's results reach the workers when its
  slowest sub-chain's do: ``delay(chunk)`` is the growth of ``max(D)`` at that chunk, so a
  chain of ``L`` steps costs the largest of its sub-chains' sums, not the sum of its
  steps' worst cases. A new collective on a slot starts its sub-chains together again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

_TAG = 0x5CA1ED  # keeps these draws apart from every other use of the seed


@dataclass(frozen=True)
class ChunkFate:
    k_up: np.ndarray  # per worker of the job: emulated packets its uplink lost (and resent)
    k_down: np.ndarray  # per worker: emulated packets of the result its downlink lost
    sub_chains: np.ndarray  # the sub-chains hit
    hits: np.ndarray  # how many timeouts each costs (distinct positions, each with its retry rounds)


class ScaledLoss:
    def __init__(self, seed: int, workers: int, loss: float, real_slots: int, sub_chains: int,
                 rto_us: float) -> None:
        self.seed, self.workers, self.loss = seed, workers, loss
        self.g = max(1, sub_chains)
        self.rto_us = rto_us
        self.round_ok = (1 - loss) ** 2  # a retry: the worker's packet, then the answer back to it
        self.behind = np.zeros((real_slots, self.g))  # D: each sub-chain's delay behind its row
        self.slot_coll = np.full(real_slots, -1, np.int64)  # the collective D belongs to
        self.slot_chunk = np.full(real_slots, -1, np.int64)  # the last chunk applied to D
        self._fates: OrderedDict[int, ChunkFate] = OrderedDict()
        self._delays: OrderedDict[int, float] = OrderedDict()
        self._cap = 4 * real_slots + 64  # chunks in flight span at most two passes of the pool
        self.rounds = 0  # timeouts the emulated packets needed, over the chunks applied
        self.positions = 0  # emulated packet positions of the chunks applied

    def fate(self, chunk: int, per: float) -> ChunkFate:
        """The fate of chunk ``chunk``'s ``per`` emulated packets (the same on every host)."""
        got = self._fates.get(chunk)
        if got is not None:
            return got
        n = max(1, int(round(per)))
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, _TAG, chunk])
        first = rng.binomial(n, self.loss, size=2 * self.workers)
        total = int(first.sum())
        k = first.copy()
        again = first
        while again.any():  # a resent packet is lost again with the same probability
            again = rng.binomial(again, self.loss)
            k += again
        if total:
            # each lost packet sits at a uniform position of the row; positions hit by several
            # workers are one loss of that position (their retransmissions go out together)
            pos = np.unique(rng.integers(0, n, size=total))
            # a position's retry round fails if any of the 2N link directions loses it again
            rounds = rng.geometric(self.round_ok, size=len(pos))
            sub, where = np.unique(pos % self.g, return_inverse=True)
            hits = np.bincount(where, weights=rounds)
        else:
            sub, hits = np.zeros(0, np.int64), np.zeros(0)
        got = ChunkFate(k[: self.workers], k[self.workers:], sub, hits)
        self._fates[chunk] = got
        if len(self._fates) > self._cap:
            self._fates.popitem(last=False)
        return got

    def delay(self, chunk: int, slot: int, coll: int, per: float, last: bool = False) -> float:
        """How much later than its row the slowest of its sub-chains gets chunk ``chunk``'s result.

        Applied to D once per chunk, in each slot's chunk order (a slot's next chunk is sent
        only after this one's result is back, so that is the order results reach a host)."""
        got = self._delays.get(chunk)
        if got is not None:
            return got
        if chunk <= self.slot_chunk[slot]:  # a late copy of a result already applied
            return 0.0
        d = self.behind[slot]
        if self.slot_coll[slot] != coll:  # a new collective: its sub-chains start together
            d[:] = 0.0
            self.slot_coll[slot] = coll
        before = float(d.max())
        f = self.fate(chunk, per)
        self.positions += max(1, int(round(per)))
        if len(f.sub_chains):
            d[f.sub_chains] += self.rto_us * f.hits
            self.rounds += int(f.hits.sum())
        got = float(d.max()) - before
        if last and len(f.sub_chains):
            # the collective's last row on this slot: nothing follows on the link to absorb
            # the timeout, whatever the chain's history
            got = max(got, self.rto_us * float(f.hits.max()))
        self.slot_chunk[slot] = chunk
        self._delays[chunk] = got
        if len(self._delays) > self._cap:
            self._delays.popitem(last=False)
        return got
