"""Hierarchical in-network aggregation: a leaf switch's role under a spine (docs/protocol.md,
"Leaf and spine"), as a reference for its conformance vectors (tests/data/conformance/leaf/).

A test model, not part of emu: the replay's leaves are emu.replay.host.leaves. It stays
importable (``tests.emulator.leaf_switch``) for the P4 conformance tests a P4 leaf would run.

As ATP and multi-rack SwitchML split it, a job's workers hang off leaves and the leaves off a
spine. The **spine** is the one-switch data plane (``emu.emulator.protocol.switch``) whose "workers" are
the job's leaves: a leaf's contribution names the leaf (``worker`` = its number among the job's
``L`` leaves, ``num_workers`` = ``L``). The **leaf** runs the same data plane over its own ports
(its workers' bits) and differs in what it does with a complete copy:

1. A worker's CONTRIB (``worker`` = its rank in the job, ``num_workers`` = the job's ``M``) is
   checked (its job, ``M``, a worker this leaf holds) and applied to the leaf's copy as on one
   switch, the worker's rank mapped to its port's bit.
2. When the copy is complete, the leaf sends **one CONTRIB up**: the copy's int32 sums and largest
   exponent, ``worker`` = the leaf, ``num_workers`` = ``L``, the same slot, copy, chunk and size.
   Nothing goes to the workers yet.
3. A RESULT from the spine for a copy the leaf completed (same slot, copy and chunk) is the
   final sum: the leaf keeps it and multicasts it to its workers (``worker`` = MULTICAST,
   ``num_workers`` = ``M``); a RESULT unicast to the leaf (the spine answering a resent partial)
   goes to the workers that asked, each alone. A RESULT for a copy the leaf does not hold
   complete for that chunk is dropped as ``stale``; a second RESULT for a sum it keeps goes to the
   workers that asked since and, where it is the multicast, to those the first one missed (the
   spine's answer to a resent partial can overtake its multicast): every worker gets a round's
   result once, unless it asks again.
4. A worker's duplicate of a complete copy: answered with the final sum where the leaf has it;
   else the partial goes up again (the spine drops it while its own copy is incomplete, and
   answers the leaf once it is complete) and the worker waits among the askers. A duplicate of an
   incomplete copy is dropped, as on one switch.

Recycling is the one switch's: a worker's packet to one copy clears its bit in the other, so a
copy is reused once every worker moved on, and its final sum with it. Exactness is the one
switch's: int32 sums are the same in any grouping, so the spine's sum of the leaves' partial sums
is bit for bit the one switch's sum of all contributions (the tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.protocol.fixedpoint import EXP_NONE
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from emu.emulator.protocol.wire import AGG_HEADER, FLAG_COPY, MsgType


@dataclass
class LeafStats:
    up: int = 0  # partial sums sent to the spine (first sends)
    resent_up: int = 0  # partial sums sent again for a worker's duplicate
    from_spine: int = 0  # results from the spine kept
    duplicates: int = 0  # results from the spine for a sum already kept (only askers get them)
    answered: int = 0  # duplicates answered with the kept final sum
    stale: int = 0  # spine results for a copy the leaf no longer holds complete
    invalid: int = 0  # packets of another job, worker count or leaf

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Frames:
    """Packets a leaf sends: headers (AGG_HEADER) and their int32 payload rows (zeros where none)."""

    headers: np.ndarray
    payload: np.ndarray

    def __len__(self) -> int:
        return len(self.headers)


class LeafSwitch:
    """One job's pool on a leaf: ``slots`` x 2 copies for the job's workers ``ranks`` on this leaf."""

    def __init__(self, slots: int, elements: int, job: int, ranks: list[int], job_workers: int, leaf: int,
                 leaves: int) -> None:
        if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < job_workers for r in ranks):
            raise ValueError("a leaf holds distinct ranks of the job, at least one")
        if not 0 <= leaf < leaves:
            raise ValueError("the leaf's number is one of the job's leaves")
        self.inner = AggregationSwitch(slots, len(ranks), elements, job)
        self.ranks = np.asarray(ranks, np.int64)
        self.bit = np.full(job_workers, -1, np.int64)
        self.bit[self.ranks] = np.arange(len(ranks))
        self.job, self.m, self.leaf, self.leaves, self.k = job, job_workers, leaf, leaves, elements
        n = 2 * slots
        self.final_chunk = np.full(n, -1, np.int64)  # the chunk whose final sum each copy keeps
        self.final = np.zeros((n, elements), np.int32)
        self.final_exp = np.full(n, EXP_NONE, np.int64)
        self.askers: dict[int, list[int]] = {}  # copy -> ranks waiting for the final sum
        self.served: dict[int, set[int]] = {}  # copy -> ranks the final sum went to from the spine's results
        self.stats = LeafStats()

    # -- from the workers ---------------------------------------------------------------
    def from_workers(self, headers: np.ndarray, payload: np.ndarray) -> tuple[Frames, Frames]:
        """Workers' contributions, in order: (what goes up to the spine, what goes down to workers)."""
        headers = np.asarray(headers).astype(AGG_HEADER)
        worker = headers["worker"].astype(np.int64)
        # the leaf role is dense: the sparse stream aggregates in one switch (docs/protocol.md)
        ours = ((headers["msg_type"] == MsgType.CONTRIB) & (headers["job"] == self.job)
                & (headers["num_workers"] == self.m) & (worker < self.m))
        ours &= np.where(worker < self.m, self.bit[np.minimum(worker, self.m - 1)] >= 0, False)
        self.stats.invalid += int((~ours).sum())
        up: list[tuple[np.ndarray, np.ndarray]] = []
        down: list[tuple[np.ndarray, np.ndarray]] = []
        for i in np.flatnonzero(ours):  # one at a time: a duplicate's answer depends on what came before
            h = headers[i:i + 1].copy()
            h["worker"] = self.bit[worker[i]]
            h["num_workers"] = len(self.ranks)
            res = self.inner.process(h, np.asarray(payload)[i:i + 1])
            for r in range(len(res)):
                rh = res.headers[r]
                idx = int(rh["slot"]) * 2 + (int(rh["flags"]) & FLAG_COPY)
                if int(rh["worker"]) == MULTICAST:  # the copy is complete: its partial sum goes up
                    self.final_chunk[idx] = -1
                    self.askers.pop(idx, None)
                    self.served.pop(idx, None)
                    self.stats.up += 1
                    up.append(self._partial(rh, res.payload[r]))
                elif self.final_chunk[idx] == int(rh["chunk"]):  # a duplicate, and the final sum is here
                    self.stats.answered += 1
                    down.append(self._result(idx, int(rh["chunk"]), rh, self.ranks[int(rh["worker"])]))
                else:  # a duplicate before the final sum came: the partial goes up again
                    self.stats.resent_up += 1
                    waiting = self.askers.setdefault(idx, [])
                    rank = int(self.ranks[int(rh["worker"])])
                    if rank not in waiting:
                        waiting.append(rank)
                    up.append(self._partial(rh, res.payload[r]))
        return self._frames(up), self._frames(down)

    def _partial(self, rh: np.void, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.zeros(1, AGG_HEADER)
        h["msg_type"] = MsgType.CONTRIB
        h["flags"] = rh["flags"]
        h["job"] = self.job
        h["worker"] = self.leaf
        h["num_workers"] = self.leaves
        for name in ("slot", "exponent", "size", "chunk"):
            h[name] = rh[name]
        return h, np.asarray(values, np.int32).reshape(1, self.k)

    # -- from the spine -----------------------------------------------------------------
    def from_spine(self, headers: np.ndarray, payload: np.ndarray) -> Frames:
        """The spine's results, in order: what goes down to the workers."""
        headers = np.asarray(headers).astype(AGG_HEADER)
        down: list[tuple[np.ndarray, np.ndarray]] = []
        inner = self.inner
        for i in range(len(headers)):
            h = headers[i]
            slot, dest = int(h["slot"]), int(h["worker"])
            if (h["msg_type"] != MsgType.RESULT or h["job"] != self.job or h["num_workers"] != self.leaves
                    or slot >= inner.slots or dest not in (MULTICAST, self.leaf)):
                self.stats.invalid += 1
                continue
            idx = slot * 2 + (int(h["flags"]) & FLAG_COPY)
            chunk = int(h["chunk"])
            if inner.count[idx] != len(self.ranks) or inner.chunk[idx] != chunk:
                self.stats.stale += 1
                continue
            waiting = self.askers.pop(idx, [])
            if self.final_chunk[idx] == chunk:  # a second result for a sum the leaf keeps
                self.stats.duplicates += 1
                # the askers since, and where it is the multicast, the workers the first one missed
                missed = [int(r) for r in self.ranks if int(r) not in self.served.get(idx, set())]
                dests = list(dict.fromkeys(waiting + (missed if dest == MULTICAST else [])))
                self.served.setdefault(idx, set()).update(dests)
                down += [self._result(idx, chunk, h, rank) for rank in dests]
                continue
            self.stats.from_spine += 1
            self.final_chunk[idx] = chunk
            self.final[idx] = np.asarray(payload)[i]
            self.final_exp[idx] = int(h["exponent"])
            if dest == MULTICAST:
                self.served[idx] = {int(r) for r in self.ranks}
                down.append(self._result(idx, chunk, h, MULTICAST))
            else:
                self.served[idx] = set(waiting)
                down += [self._result(idx, chunk, h, rank) for rank in waiting]
        return self._frames(down)

    def _result(self, idx: int, chunk: int, like: np.void, dest: int) -> tuple[np.ndarray, np.ndarray]:
        h = np.zeros(1, AGG_HEADER)
        h["msg_type"] = MsgType.RESULT
        h["flags"] = idx & 1
        h["job"] = self.job
        h["worker"] = dest
        h["num_workers"] = self.m
        h["slot"] = idx >> 1
        h["exponent"] = self.final_exp[idx]
        h["size"] = like["size"]
        h["chunk"] = chunk
        return h, self.final[idx:idx + 1].copy()

    def _frames(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> Frames:
        if not parts:
            return Frames(np.zeros(0, AGG_HEADER), np.zeros((0, self.k), np.int32))
        return Frames(np.concatenate([h for h, _ in parts]), np.concatenate([p for _, p in parts]))


__all__ = ["Frames", "LeafStats", "LeafSwitch"]
