"""Cohorts (emu.replay.host.cohorts): workers that run one program in step run as one, and every
emulated number is the one of workers run one by one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import Straggler
from emu.replay.host import cohorts, runtime
from emu.replay.host.worker import CollRun, complete_by_run
from emu.traces import load_trace, sample_path
from emu.traces.model import Coll, CollKind, Dtype
from tests.replay.test_clock import exact_part


def _run(trace, config, monkeypatch, together: bool):
    """The replay, every worker's iterations (its hosts' results) and how many cohorts its hosts
    held at the end; ``together`` False: every worker alone."""
    results, held = [], []
    metrics = runtime.Host.metrics

    def kept(self):
        held.append(len(self.cohorts.live))
        results.append(metrics(self))
        return results[-1]
    with monkeypatch.context() as m:
        m.setattr(runtime.Host, "metrics", kept)
        if not together:
            m.setattr(runtime, "cohorts_allowed", lambda *_: False)
        report = replay(trace, config)
    return report, {w: d.iterations for r in results for w, d in r.workers.items()}, sum(held)


def _both(trace, config, monkeypatch):
    return _run(trace, config, monkeypatch, True), _run(trace, config, monkeypatch, False)


@pytest.mark.parametrize(("sample", "fabric", "workers", "extra", "fewer"), [
    # its broadcast reaches the workers down a binomial tree, at as many times as the tree has levels: the
    # cohorts split there and merge where the iteration's last all_reduce leaves them in step
    ("transformer", "ina", 64, {}, 2),
    ("mlp", "ring", 16, {}, 2),
    # the shards answer each worker in turn: cohorts split at every pull and meet at the iteration's end
    ("mlp", "ps", 8, {}, 1),
    # loss: retransmission timers beside the cohorts' events (most of them), and results lost on some
    # members' links; a slow worker: a cohort of its own
    ("mlp", "ina", 16, {"link": LinkSpec(bandwidth_bps=25e9, loss=0.01), "stragglers": (Straggler.parse("3,7:1.5"),)},
     1),
])
def test_same_numbers_as_workers_alone(sample, fabric, workers, extra, fewer, monkeypatch, no_children) -> None:
    config = ReplayConfig(workers=workers, fabric=fabric, iters=3, payload_scale=64, processes=0, **extra)
    (together, records, _), (alone, alone_records, _) = _both(load_trace(sample_path(sample)), config, monkeypatch)
    assert together.verification.ok
    assert exact_part(together) == exact_part(alone)
    assert records == alone_records and len(records) == workers  # every worker's own iterations
    assert together.emulator.events * fewer <= alone.emulator.events  # they did run as cohorts


def test_broadcast_parts_and_meets_again(monkeypatch, no_children) -> None:
    """The transformer's broadcast completes at different times: cohorts split there and merge
    where an iteration ends at one time; each worker's iterations keep their own times through
    both, and a socketed layout agrees."""
    config = ReplayConfig(workers=32, fabric="ina", iters=3, payload_scale=64, processes=0)
    trace = load_trace(sample_path("transformer"))
    seen = {"split": 0, "merge": 0}
    split, merge = cohorts.Cohorts.split, cohorts.Cohorts._merge

    def counted(name, f):
        def call(self, *args):
            seen[name] += 1
            return f(self, *args)
        return call
    monkeypatch.setattr(cohorts.Cohorts, "split", counted("split", split))
    monkeypatch.setattr(cohorts.Cohorts, "_merge", counted("merge", merge))
    (together, records, held), (_, alone_records, alone) = _both(trace, config, monkeypatch)
    assert records == alone_records
    assert seen["split"] > 3 and seen["merge"] >= 2
    assert 2 <= held < alone == 32
    # [start, end, compute, blocked, comm]: the collectives' spans differ from worker to worker
    assert len({round(its[1][4], 6) for its in records.values()}) > 8
    socketed = replay(trace, replace(config, processes=2))
    assert exact_part(socketed) == exact_part(together)


def test_completions_go_to_the_host_once_a_run_in_arrival_order() -> None:
    """Endpoints hand completions over by run (a cohort's members share one): one call for each
    run, with its workers and times, runs in the order their first worker came."""
    op = Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=4, bytes=16, group_size=1)
    a, b = CollRun(op, 1, 0.0), CollRun(op, 1, 0.0)  # equal as values, two runs all the same
    calls = []
    ids, ends = np.array([5, 2, 7, 9, 4]), np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    complete_by_run(ids, np.array([b, a, b, a, b], object), ends,
                    lambda w, r, t: calls.append((r, w.tolist(), t.tolist())))
    assert [c[0] is b for c in calls] == [True, False]
    assert [c[1:] for c in calls] == [([5, 7, 4], [1.0, 3.0, 5.0]), ([2, 9], [2.0, 4.0])]
    calls.clear()
    complete_by_run(ids, np.array([a] * 5, object), ends, lambda w, r, t: calls.append((r, w.tolist(), t.tolist())))
    assert len(calls) == 1 and calls[0][0] is a and calls[0][1] == [5, 2, 7, 9, 4]
    calls.clear()
    complete_by_run(ids[:0], np.array([], object), ends[:0], lambda w, r, t: calls.append(w))
    assert calls == []
