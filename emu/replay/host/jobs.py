"""A host process holding endpoints of several jobs that share the fabric (docs/topology.md,
"Several jobs").

Each job's endpoints here run as a ``Host`` of their own, with the job's configuration (its
workers, its share of the switch's slots), numbered as in their job: jobs never share a node, so
every NIC and node port belongs to one job. What they share is the leaves' links to the spine:
one ``LeafStage`` holds every job's rows, so a leaf's link carries them all in arrival order. This
host moves that stage's traffic (the jobs' hosts do not) and hands what comes out to the job its
header names. It speaks to the clock (``emu.replay.host.loop``) as a ``Host`` does.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from emu.emulator.protocol.transport import AggBatch, FrameError, Segment, SegmentRows
from emu.emulator.protocol.window import Departures
from emu.replay.control.messages import HostResult
from emu.replay.host.horizons import leaf_horizons
from emu.replay.host.leaves import LeafStage
from emu.replay.host.runtime import Counters, Host, HostSetup
from emu.replay.host.worker import FakeWorker


class JobsHost:
    """The endpoints of several jobs in one process (module docstring); ``setup.parts`` holds each
    job's, ``setup.jobs`` every job's configuration."""

    def __init__(self, setup: HostSetup) -> None:
        self.setup = setup
        self.cfg = setup.config  # the shared fabric's (the clock's dilation)
        self.counters = Counters()  # the real bytes this process moved
        self.measure_lag = False
        leaves = None
        layouts = [cfg.layout() for cfg in setup.jobs]  # every job's, in job order
        if setup.role == "workers" and layouts and layouts[0] is not None and layouts[0].leaves > 1:
            held = np.unique(np.concatenate([layouts[p.job].leaf[np.asarray(p.endpoints, np.int64)]
                                             for p in setup.parts]))
            # a leaf's partial sums count each job's workers on it, held here or not
            leaves = LeafStage.of(held, setup.jobs[0], *layouts)
        self.leaves = leaves
        self.hosts = {p.job: Host(p, leaves) for p in setup.parts}

    @property
    def workers(self) -> dict[tuple[int, int], FakeWorker]:
        """Every job's workers here, each's cohort (``Host.workers``: they split and merge as they run)."""
        return {(j, w): fw for j, h in self.hosts.items() for w, fw in h.workers.items()}

    def _host(self, job: int) -> Host:
        host = self.hosts.get(job)
        if host is None:
            raise FrameError(f"a message for job {job}, of which host {self.setup.index} holds no endpoint")
        return host

    def begin(self) -> None:
        for h in self.hosts.values():
            h.begin()

    def next_us(self) -> float:
        return min((h.next_us() for h in self.hosts.values()), default=math.inf)

    def advance(self, bound: float, inclusive: bool = False, now: float | None = None,
                quiet_us: tuple[float, ...] = ()) -> None:
        """The leaves' links down, every job's endpoints, the leaves' links up (``Host.advance``)."""
        leaves = self.leaves
        if leaves is not None:
            leaves.advance(1, bound, inclusive, lambda s: self._host(_seg_job(s)).p2p.receive(s),
                           lambda b, tags: self._host(_batch_job(b)).ina.receive(b, tags))
        for h in self.hosts.values():
            h.measure_lag = self.measure_lag
            h.advance(bound, inclusive, now)
        if leaves is not None:
            leaves.advance(0, bound, inclusive, lambda s: self._host(_seg_job(s)).p2p.outgoing.append(s),
                           lambda b, _: self._host(_batch_job(b)).ina.outgoing.append(b),
                           leaf_horizons(list(self.hosts.values()), leaves, bound, quiet_us))

    def take_outgoing(self) -> tuple[AggBatch | None, SegmentRows]:
        batches, segs = [], []
        for h in self.hosts.values():
            b, s = h.take_outgoing()
            if b is not None:
                batches.append(b)
            segs.append(s)
        return (AggBatch.concat(batches) if batches else None), SegmentRows.concat(segs)

    def receive_results(self, batch: AggBatch) -> None:
        jobs = batch.headers["job"].astype(np.int64)
        for job in np.unique(jobs):
            rows = jobs == job
            self._host(int(job)).receive_results(batch if rows.all() else batch.take(np.flatnonzero(rows)))

    def holds(self, job: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Per segment, whether its endpoint is held here (``Host.holds``, any job's)."""
        out = np.zeros(len(dst), bool)
        for h in self.hosts.values():
            out |= h.holds(job, dst)
        return out

    def receive_rows(self, rows: SegmentRows) -> None:
        for job in np.unique(rows.job).tolist():
            self._host(job).receive_rows(rows.take(np.flatnonzero(rows.job == job)))

    def finished(self) -> bool:
        return all(h.finished() for h in self.hosts.values())

    def departures(self) -> Departures:
        """The least of the jobs' (``Host.departures``)."""
        return Departures.least([h.departures() for h in self.hosts.values()])

    def done(self) -> bool:
        return all(h.done() for h in self.hosts.values())

    def metrics(self) -> list[HostResult]:
        """One result a job; the leaves' links, which the jobs share, counted once (in the first)."""
        out = [h.metrics() for h in self.hosts.values()]
        if self.leaves is not None and out:
            out[0] = replace(out[0], links={**out[0].links, **self.leaves.usage()})
        out[0] = replace(out[0], real_bytes=out[0].real_bytes + self.counters.real_bytes)
        return out


def _seg_job(seg: Segment) -> int:
    return seg.job


def _batch_job(batch: AggBatch) -> int:
    return int(batch.headers["job"][0])
