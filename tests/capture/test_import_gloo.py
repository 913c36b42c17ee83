"""Importing real CPU/gloo traces: DDP buckets, every collective kind, waits."""

from __future__ import annotations

import gzip
import json

import pytest

from emu.capture import import_kineto
from emu.traces import CollKind, Dtype, Wait
from tests.conftest import GLOO_COLLECTIVES, GLOO_MLP

MLP_PARAMS = 6_316_042


def test_ddp_mlp_buckets_add_up_to_parameters() -> None:
    trace = import_kineto([GLOO_MLP])
    assert [p.rank for p in trace.ranks] == [0, 1] and trace.meta.world_size == 2
    for program in trace.ranks:
        for it in program.iterations:
            buckets = [op for op in it.colls if op.kind == CollKind.ALL_REDUCE]
            assert sum(b.count for b in buckets) == MLP_PARAMS
            assert len(buckets) == 2  # 4 MB cap: the 16 MB weight closes the first bucket
            for b in buckets:
                assert b.tensors is not None
                elements = sum(int.__mul__(*s) if len(s) == 2 else s[0] for s in b.tensors)
                assert elements == b.count
            waits = [op for op in it.ops if isinstance(op, Wait)]
            assert [w.ids for w in waits] == [(b.id,) for b in buckets]  # one bucket at a time
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.01)


def test_ddp_waits_are_the_idle_stretches_of_the_reducer() -> None:
    # Read off the raw events: rank 1, step 4 ran bucket 0 behind the last backward matmul
    # (no wait), copied it back, then sat idle from 57.35 ms to 64.79 ms of the step until
    # bucket 1 completed (its gloo span ends at 64.70 ms). Rank 0, step 4 waited for both.
    # The idle stretch is found even where the reducer resumes with small ops (views)
    # before its first copy and gloo's span closes after that.
    trace = import_kineto([GLOO_MLP])
    blocked = {(p.rank, it.step): [round(op.blocked_us / 1000, 2) for op in it.ops if isinstance(op, Wait)]
               for p in trace.ranks for it in p.iterations}
    assert blocked[(1, 4)] == [0.0, 7.36]
    assert blocked[(0, 4)] == [18.95, 16.28]
    assert blocked[(1, 5)][0] == 23.3


def test_measured_time_is_profiler_step_duration() -> None:
    trace = import_kineto([GLOO_MLP])
    for program in trace.ranks:
        raw = json.loads(gzip.decompress((GLOO_MLP / f"rank{program.rank}.json.gz").read_bytes()))
        steps = sorted((e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                       key=lambda e: e["ts"])
        assert [it.measured_us for it in program.iterations] == [e["dur"] for e in steps]


@pytest.fixture(scope="module")
def collectives():
    return import_kineto([GLOO_COLLECTIVES / "rank0.json.gz", GLOO_COLLECTIVES / "rank1.json.gz"])


def test_every_collective_kind_and_size(collectives) -> None:
    expected = [
        (CollKind.ALL_REDUCE, Dtype.FLOAT32, 1000), (CollKind.BROADCAST, Dtype.FLOAT32, 1000),
        (CollKind.ALL_GATHER, Dtype.FLOAT32, 2000), (CollKind.ALL_GATHER, Dtype.FLOAT32, 2000),
        (CollKind.REDUCE_SCATTER, Dtype.FLOAT32, 1000), (CollKind.ALL_TO_ALL, Dtype.FLOAT32, 1000),
        (CollKind.BARRIER, Dtype.UINT8, 0), (None, Dtype.FLOAT16, 77),
        (CollKind.ALL_REDUCE, Dtype.BFLOAT16, 10), (CollKind.ALL_REDUCE, Dtype.INT64, 10),
    ]
    for program in collectives.ranks:
        p2p = CollKind.SEND if program.rank == 0 else CollKind.RECV
        for it in program.iterations:
            got = [(op.kind, op.dtype, op.count) for op in it.colls]
            assert got == [(k or p2p, d, n) for k, d, n in expected]
            bcast = it.colls[1]
            assert bcast.root == 1
            assert it.colls[7].peer == 1 - program.rank


def test_every_blocking_collective_is_waited(collectives) -> None:
    for program in collectives.ranks:
        for it in program.iterations:
            waits = [op for op in it.ops if isinstance(op, Wait)]
            # all are synchronous or waited at once: one wait each, in issue order
            assert [w.ids for w in waits] == [(i,) for i in range(10)]
            assert all(w.blocked_us >= 0 for w in waits)
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.01)
