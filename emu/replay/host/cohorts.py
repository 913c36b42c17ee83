"""Cohorts: a host's fake workers that run one program in step, run as one.

Workers given the same program (replicas of one rank, whose ops name no peer), the same straggling
factor and no compute noise do the same thing at the same emulated times until something reaches
them at different times. A host runs each such set as one ``FakeWorker`` whose ``members`` are
their ids: its program runs once for all of them, each of its collectives starts on every member's
endpoint (the rows, links and checks stay each worker's), and its records are theirs.

- **Completions** of a cohort's members are gathered (``arrive``) and settled where the host's
  phase ends (``settle``): a collective that completed for every member at the same time completes
  the cohort once; otherwise the cohort splits, one part per completion time and one for the
  members still waiting, each with its own copy of the state (``emu.replay.host.worker.copy_state``)
  and its pending resumptions.
- **Merges**: with cohorts, a worker stops where an iteration ended (``FakeWorker.pause``); the
  host goes on with the cohorts stopped at one emulated time once its other resumptions at that
  time ran (``resume_paused``), merging those whose state is the same (the same program, time,
  counts and pending resumptions: ``_key``). Their earlier iterations' records stay each
  member's (``FakeWorker.history``).

What this changes is only how many times the same Python runs: the emulated numbers are those of
workers run one by one, since a worker's program acts on nothing but its own state and its
endpoints, whose outcome does not depend on the order in which workers call them at one time
(docs/design-notes.md, "Cohorts"; the golden set and the layout tests hold it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from emu.replay.host.worker import CollRun, FakeWorker, copy_state, groups
from emu.replay.plan.programs import WorkerProgram

if TYPE_CHECKING:
    from emu.replay.host.runtime import HostSetup


def cohorts_allowed(setup: HostSetup, split_inside: bool) -> bool:
    """Whether a host's workers may run as cohorts: not where a report keeps each worker's spans or
    collectives' times (a Chrome trace, adaptive compression), nor where a node's segments cross
    inside the host within a window (``Host._node_passes``, whose events stop part way)."""
    return setup.role == "workers" and not setup.spans and not setup.config.compress.adaptive and not split_inside


def cohorts_of(programs: tuple[WorkerProgram, ...] | list[WorkerProgram], factor: np.ndarray, sigma: np.ndarray,
               together: bool) -> dict[object, list[WorkerProgram]]:
    """The programs by cohort, each's workers in order: one program (the same iterations), the same
    straggling factor and no noise; every worker alone where ``together`` is False."""
    groups: dict[object, list[WorkerProgram]] = {}
    for prog in sorted(programs, key=lambda p: p.worker):
        w = prog.worker
        same = together and not sigma[w]
        kind = ((id(prog.iterations), prog.colls_per_iteration, prog.seq_offsets, float(factor[w])) if same
                else ("alone", w))
        groups.setdefault(kind, []).append(prog)
    return groups


class Cohorts:
    """The cohorts of a host: ``of`` maps each worker to its cohort, ``live`` each cohort's token to it."""

    def __init__(self, of: dict[int, FakeWorker], push: Callable[[FakeWorker, float], None],
                 pending: Callable[[FakeWorker], list[float]], forget: Callable[[FakeWorker], None]) -> None:
        """``push``: the host's resumption of a cohort at a time; ``pending``: a cohort's
        resumptions not yet run, in time order; ``forget``: drop a merged cohort's."""
        self.of = of
        self.live = {fw.token: fw for fw in of.values()}
        ids = np.fromiter(of.keys(), np.int64, len(of))
        self._token = np.full(int(ids.max(initial=-1)) + 1, -1, np.int64)  # per worker id, its cohort's token
        self._token[ids] = np.fromiter((fw.token for fw in of.values()), np.int64, len(of))
        self._push, self._pending, self._forget = push, pending, forget
        # completions to settle: workers (ids), the run they completed (one: a cohort's), their times
        self.arrived: list[tuple[np.ndarray, CollRun, np.ndarray]] = []
        self.paused: list[FakeWorker] = []
        self._tokens = itertools.count(max(self.live, default=0) + 1)

    def arrive(self, ws: np.ndarray, run: CollRun, ts: np.ndarray) -> None:
        """Workers ``ws`` completed ``run`` at ``ts``: those alone at once, in order, a cohort's
        members settled later."""
        tokens = self._token[ws]
        if (tokens == tokens[0]).all() and self.live[int(tokens[0])].size > 1:  # one cohort's
            self.arrived.append((ws, run, ts))
            return
        cohort = np.fromiter((self.live[t].size > 1 for t in tokens.tolist()), bool, len(ws))
        for w, t in zip(ws[~cohort].tolist(), ts[~cohort].tolist(), strict=True):
            self.of[w].completed(run, t)
        if cohort.any():
            self.arrived.append((ws[cohort], run, ts[cohort]))

    def settle(self) -> None:
        """Complete what arrived: per collective, each cohort as one, or split by completion time;
        collectives, and cohorts within one, in the order their first completion arrived."""
        while self.arrived:
            arrived, self.arrived = self.arrived, []
            by_seq: dict[int, list[tuple[np.ndarray, CollRun, np.ndarray]]] = {}
            for a in arrived:
                by_seq.setdefault(a[1].seq, []).append(a)
            for got in by_seq.values():
                ws = np.concatenate([g[0] for g in got])
                ts = np.concatenate([g[2] for g in got])
                block = np.repeat(np.arange(len(got)), [len(g[0]) for g in got])
                # the cohorts as they are now: an earlier collective may have split them
                for sel in groups(self._token[ws]):
                    self._complete(self.live[int(self._token[ws[sel[0]]])], got[block[sel[0]]][1], ws[sel], ts[sel])

    def _complete(self, fw: FakeWorker, run: CollRun, ws: np.ndarray, ts: np.ndarray) -> None:
        """Members ``ws`` of ``fw`` completed ``run`` at ``ts``: the cohort at once where every
        member did at one time, else split, one part per time in the order the times arrived."""
        if len(ws) == fw.size and (ts == ts[0]).all():
            fw.completed(run, float(ts[0]))
            return
        by_time = groups(ts)
        parts = [sorted(ws[sel].tolist()) for sel in by_time]
        rest = fw.ids[~np.isin(fw.ids, ws, kind="table")].tolist()  # in the members' order, as one array step
        pieces = self.split(fw, parts + ([rest] if rest else []))
        for piece, sel in zip(pieces, by_time, strict=False):  # the members still waiting: the last, left out
            piece.completed(run, float(ts[sel[0]]))

    def split(self, fw: FakeWorker, parts: list[list[int]]) -> list[FakeWorker]:
        """``fw`` as one cohort per part, in their order, each resuming when it would have. The
        largest keeps ``fw``: a parameter server's answers peel one member off at a time, and
        moving the rest each time would cost the members squared."""
        pending = list(self._pending(fw))
        largest = max(range(len(parts)), key=lambda i: len(parts[i]))
        pieces = []
        for i, members in enumerate(parts):
            if i == largest:
                pieces.append(fw)
                continue
            new = FakeWorker(copy_state(fw.s), fw._start_coll, fw._resume_at, members=members,
                             token=next(self._tokens), pause=fw._pause, kind=fw.kind)
            new.history = {w: fw.history.pop(w) for w in members if w in fw.history}
            self.live[new.token] = new
            for w in members:
                self.of[w] = new
            self._token[members] = new.token
            for t in pending:
                self._push(new, t)
            pieces.append(new)
        fw.set_members(parts[largest])
        return pieces

    def pause(self, fw: FakeWorker) -> None:
        self.paused.append(fw)

    def resume_paused(self) -> None:
        """Run on the cohorts stopped between iterations, those in the same state merged first."""
        paused, self.paused = self.paused, []
        groups: dict[tuple, list[FakeWorker]] = {}
        for fw in {fw.token: fw for fw in paused}.values():  # once each, though it stopped twice
            if fw.paused and fw.token in self.live:  # not run on since, nor merged
                groups.setdefault(self._key(fw), []).append(fw)
        for group in groups.values():
            (self._merge(group) if len(group) > 1 else group[0]).run()

    def _key(self, fw: FakeWorker) -> tuple:
        s = fw.s
        assert not s.colls and s.waiting is None and s.op == 0  # an iteration's start
        return (fw.kind, s.it, s.t, s.ops_run, tuple(sorted(s.stream_free_us.items())),
                tuple(sorted((k, len(v)) for k, v in s.streams.items())),
                tuple(sorted(((r.value if r is not None else ""), n) for r, n in s.completed.items())),
                tuple(self._pending(fw)))

    def _merge(self, group: list[FakeWorker]) -> FakeWorker:
        keep = group[0]
        members: list[int] = []
        for fw in group:
            done = fw.s.records[:-1]  # the iterations each ran before: its members' own
            for w in fw.members:  # each member's list is its own: extended, not copied
                keep.history[w] = fw.history.get(w) or []
                keep.history[w].extend(done)
            members += fw.members
            if fw is not keep:
                del self.live[fw.token]
                self._forget(fw)
                for w in fw.members:
                    self.of[w] = keep
                self._token[fw.members] = keep.token
        keep.s.records = keep.s.records[-1:]
        keep.set_members(sorted(members))
        return keep
