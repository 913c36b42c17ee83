"""Importing real CPU/gloo traces: DDP buckets, every collective kind, waits."""

from __future__ import annotations

import gzip
import json

import pytest

from emu.capture import import_kineto
from emu.errors import KinetoError
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


# Capture never invents: a gloo file that lacks a size or a dtype is refused, naming the file,
# rank, step and event; what the conversion reads is checked before it is read.

def _raw(path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _event(doc: dict, name: str) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == name)


def _write(tmp_path, docs: list[dict]) -> list:
    paths = []
    for rank, doc in enumerate(docs):
        paths.append(tmp_path / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(doc))
    return paths


RECORD_SHAPES = "re-record with torch.profiler.profile(record_shapes=True)"


@pytest.mark.parametrize("change, expected", [
    (lambda d: _event(d, "gloo:all_reduce")["args"].pop("Input type"),
     "rank 0: step 2: event 'gloo:all_reduce' at ts 5111905414368.316: argument 'Input type' is missing: the "
     f"element type, and so the bytes, of the c10d::allreduce_ are unknown, and emu will not guess them; {RECORD_SHAPES}"),
    (lambda d: _event(d, "gloo:all_reduce")["args"].update({"Input type": ["complex"]}),
     "rank 0: step 2: event 'gloo:all_reduce' at ts 5111905414368.316: argument 'Input type' is 'complex', a "
     "dtype emu does not know; known: BFloat16,"),
    (lambda d: _event(d, "c10d::allreduce_")["args"].pop("Input Dims"),
     "rank 0: step 2: event 'c10d::allreduce_' at ts 5111905406028.791: argument 'Input Dims' is missing: its "
     f"size is unknown, and emu will not invent it; {RECORD_SHAPES}"),
    (lambda d: _event(d, "c10d::allreduce_")["args"].update({"Input Dims": [[[-1]]]}),
     "rank 0: event 'c10d::allreduce_' at ts 5111905406028.791: field 'args.Input Dims' is [[[-1]]], not a list "
     "of shapes (lists of sizes >= 0) as this event records them; the file is corrupted"),
    (lambda d: _event(d, "c10d::allreduce_")["args"].update({"Input Dims": [7]}),
     "rank 0: event 'c10d::allreduce_' at ts 5111905406028.791: field 'args.Input Dims' is [7], not a list"),
    (lambda d: _event(d, "c10d::allreduce_").update(tid=[1]),
     "rank 0: event 'c10d::allreduce_' at ts 5111905406028.791: fields 'pid' and 'tid' must be integers or "
     "strings, got 3577 and [1]; the file is corrupted"),
    (lambda d: _event(d, "c10d::allreduce_").update(args=["x"]),
     "rank 0: event 'c10d::allreduce_' at ts 5111905406028.791: field 'args' must be an object, got ['x']; the "
     "file is corrupted"),
    (lambda d: _event(d, "c10d::allreduce_").update(ts=True),
     "rank 0: event 'c10d::allreduce_' at ts True: field 'ts' is True, not a time in microseconds in "
     "-10000000000000000..10000000000000000; the file is corrupted"),
    (lambda d: d["distributedInfo"].update(pg_config=[{"pg_name": "0", "ranks": [0, 5]}]),
     "field 'distributedInfo.pg_config' lists ranks [0, 5] of group '0'; ranks are integers below the world "
     "size 2"),
])
def test_what_a_gloo_file_lacks_or_garbles_is_refused(tmp_path, change, expected: str) -> None:
    doc = _raw(GLOO_COLLECTIVES / "rank0.json.gz")
    change(doc)
    (path,) = _write(tmp_path, [doc])
    with pytest.raises(KinetoError) as err:
        import_kineto([path])
    assert str(err.value).startswith(f"{path}: {expected}"), str(err.value)


def test_a_bucket_copy_whose_shape_is_not_one_tensor_is_refused(tmp_path) -> None:
    # the conversion reads it as the bucket's parameter shapes; a list of shapes once crashed it
    doc = _raw(GLOO_MLP / "rank0.json.gz")
    _event(doc, "torch.distributed.ddp.reducer::copy_bucket_to_grad")["args"]["Input Dims"] = [[[2048, 1024]], []]
    (path,) = _write(tmp_path, [doc])
    with pytest.raises(KinetoError) as err:
        import_kineto([path])
    assert str(err.value) == (
        f"{path}: rank 0: event 'torch.distributed.ddp.reducer::copy_bucket_to_grad' at ts 5111911773880.961: "
        "field 'args.Input Dims' is [[[2048, 1024]], []], not a list of shapes (lists of sizes >= 0) as this "
        "event records them; the file is corrupted")


def test_files_without_process_groups_still_import(tmp_path, collectives) -> None:
    # older PyTorch records no pg_config: nothing the conversion needs
    docs = [_raw(GLOO_COLLECTIVES / f"rank{r}.json.gz") for r in (0, 1)]
    for doc in docs:
        del doc["distributedInfo"]["pg_config"]
    trace = import_kineto(_write(tmp_path, docs))
    assert trace.ranks == collectives.ranks and trace.meta.gaps == ()


def test_gloo_imports_record_no_gaps(collectives) -> None:
    # gloo's executions give every completion: nothing is missing
    assert collectives.meta.gaps == () and import_kineto([GLOO_MLP]).meta.gaps == ()


def test_a_capture_times_as_many_steps_without_the_profiler_as_with_it() -> None:
    """The steps past the window: AFTER_STEPS, or one more than the profiled steps (the first is
    left out), so the two medians that show the profiler's overhead rest on as many steps. (Here,
    not in test_capture_live: it needs no torch.)"""
    from emu.capture.run import AFTER_STEPS, CaptureConfig, built_in_steps

    assert built_in_steps(CaptureConfig(profile_steps=5, warmup=3)) == 3 + 1 + 5 + AFTER_STEPS
    assert built_in_steps(CaptureConfig(profile_steps=20, warmup=3)) == 3 + 1 + 20 + 21
