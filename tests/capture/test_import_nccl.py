"""Importing the real A100/NCCL trace: sizes, steps and compute as docs/design.md defines them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from emu.capture import import_kineto
from emu.errors import KinetoError
from emu.traces import Coll, CollKind, Compute, Wait
from tests.conftest import A100


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(gzip.decompress(A100.read_bytes()))


@pytest.fixture(scope="module")
def trace():
    return import_kineto([A100])


def _steps(raw: dict) -> list[dict]:
    return sorted((e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
                   and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])


def test_three_steps_with_profiler_step_durations(trace, raw) -> None:
    steps = _steps(raw)
    (program,) = trace.ranks
    assert program.rank == 0 and trace.meta.world_size == 2 and trace.meta.backend == "nccl"
    assert [it.step for it in program.iterations] == [4, 5, 6]
    assert [it.measured_us for it in program.iterations] == [e["dur"] for e in steps]


def test_all_reduce_sizes_equal_in_msg_nelems_per_step(trace, raw) -> None:
    comms = [e for e in raw["traceEvents"] if e.get("name") == "record_param_comms"
             and e["args"].get("Collective name") == "allreduce"]
    for span, it in zip(_steps(raw), trace.ranks[0].iterations, strict=False):
        inside = sorted((e for e in comms if span["ts"] <= e["ts"] < span["ts"] + span["dur"]),
                        key=lambda e: e["ts"])
        got = [op.count for op in it.colls if op.kind == CollKind.ALL_REDUCE]
        assert got == [e["args"]["In msg nelems"] for e in inside]
        assert len(got) == 5
        assert all(op.bytes == 4 * op.count and op.dtype.value == "float32"
                   for op in it.colls if op.kind == CollKind.ALL_REDUCE)


def test_compute_is_step_time_not_kernel_time(trace, raw) -> None:
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"
               and not e["name"].startswith("nccl")]
    for span, it in zip(_steps(raw), trace.ranks[0].iterations, strict=False):
        kernel_us = sum(e["dur"] for e in kernels if span["ts"] <= e["ts"] < span["ts"] + span["dur"])
        assert kernel_us < 0.25 * it.measured_us  # the GPU is mostly idle in this job
        assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.01)
        # CPU-bound: the CPU never waits for the GPU, so communication blocks nothing
        assert it.compute_us > 0.99 * it.measured_us


def test_waits_and_observed_times(trace) -> None:
    for it in trace.ranks[0].iterations:
        colls = {op.id: op for op in it.colls}
        waits = [op for op in it.ops if isinstance(op, Wait)]
        reduce_ids = sorted(i for i, c in colls.items() if c.kind == CollKind.ALL_REDUCE)
        # the explicit NCCL waits take the two buffer broadcasts; DDP's reducer the buckets
        assert [w.ids for w in waits] == [(0,), (1,), tuple(reduce_ids)]
        assert all(c.observed_us is not None and 0 < c.observed_us < 10_000 for c in colls.values())
        assert all(isinstance(op, (Coll, Compute, Wait)) for op in it.ops)


def test_sizes_missing_is_an_error_not_a_guess(tmp_path: Path, raw) -> None:
    old = json.loads(json.dumps(raw))
    for e in old["traceEvents"]:
        if e.get("name") == "record_param_comms":
            for key in ("In msg nelems", "Out msg nelems", "Group size"):
                e["args"].pop(key, None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    with pytest.raises(KinetoError, match="carry no 'In msg nelems'.*will not invent"):
        import_kineto([path])
