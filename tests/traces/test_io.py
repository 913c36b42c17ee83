"""Loading and saving emu traces, and the errors bad files get."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from emu.errors import TraceError
from emu.traces import (
    LOADERS,
    Coll,
    CollKind,
    Compute,
    Dtype,
    Iteration,
    RankProgram,
    Source,
    Trace,
    TraceMeta,
    Wait,
    load_trace,
    save_trace,
    trace_to_dict,
)
from tests.conftest import A100


def small_trace(world: int = 2) -> Trace:
    meta = TraceMeta(source=Source.CAPTURE, world_size=world, backend="gloo", device="cpu",
                     framework="torch 2.13.0", dtype="float32", captured_at="2026-11-29T15:00:00Z",
                     model="mlp", batch_size=32, params=30)
    ops = (Compute("forward", 100.0), Compute("backward", 50.0),
           Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=20, bytes=80,
                group_size=world, observed_us=40.0, tensors=((4, 5),)),
           Compute("backward", 30.0),
           Coll(id=1, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=10, bytes=40,
                group_size=world, observed_us=60.0),
           Wait(ids=(0, 1), blocked_us=25.0), Compute("optimizer", 10.0))
    it = Iteration(step=3, measured_us=215.0, ops=ops)
    return Trace(meta=meta, ranks=tuple(RankProgram(rank=r, iterations=(it,)) for r in range(world)))


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_round_trip_keeps_every_field(tmp_path: Path, name: str) -> None:
    trace = small_trace()
    path = save_trace(trace, tmp_path / name)
    assert load_trace(path) == trace
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_document_shape_matches_design(tmp_path: Path) -> None:
    doc = trace_to_dict(small_trace())
    assert doc["schema"] == "emu-trace" and doc["schema_version"] == 1
    op = doc["ranks"][0]["iterations"][0]["ops"][2]
    assert op == {"op": "coll", "id": 0, "kind": "all_reduce", "dtype": "float32", "count": 20,
                  "bytes": 80, "group_size": 2, "observed_us": 40.0, "tensors": [[4, 5]]}


def write_doc(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


def test_unknown_version_lists_supported(tmp_path: Path) -> None:
    doc = trace_to_dict(small_trace())
    doc["schema_version"] = 99
    with pytest.raises(TraceError) as err:
        load_trace(write_doc(tmp_path, doc))
    msg = str(err.value)
    assert "bad.json" in msg and "schema_version" in msg and "99" in msg
    assert "supported versions: " + ", ".join(str(v) for v in sorted(LOADERS)) in msg


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["ranks"][1]["iterations"][0]["ops"][2].update(count=-1),
     "rank 1: iteration 0 (step 3): op 2: field 'count' must be an integer >= 0, got -1"),
    (lambda d: d["ranks"][0]["iterations"][0]["ops"][2].update(kind="allreduce"),
     "rank 0: iteration 0 (step 3): op 2: field 'kind' is 'allreduce'; it must be one of: all_reduce"),
    (lambda d: d["ranks"][0]["iterations"][0]["ops"][0].pop("dur_us"),
     "rank 0: iteration 0 (step 3): op 0: field 'dur_us' is missing"),
    (lambda d: d["ranks"][0]["iterations"][0]["ops"][5].update(ids=[0, 7]),
     "rank 0: iteration 0 (step 3): op 5: field 'ids' names collectives [7] not issued earlier"),
    (lambda d: d["ranks"][0]["iterations"][0]["ops"][2].update(bytes=81),
     "rank 0: iteration 0 (step 3): op 2: field 'bytes' is 81 but count x size of float32 is 80"),
    (lambda d: d["ranks"][1]["iterations"][0]["ops"][4].update(count=12, bytes=48),
     "rank 1: iteration 0 (step 3): field 'ops' issues collectives that do not match rank 0's"),
    (lambda d: d["meta"].update(world_size=1),
     "field 'group_size' is 2, larger than the world size 1"),
    (lambda d: d["ranks"][0]["iterations"][0].update(ops=[]),
     "rank 0: iteration 0 (step 3): field 'ops' is empty"),
    (lambda d: d["ranks"][0]["iterations"][0].update(measured_us="fast"),
     "field 'measured_us' must be an integer or a number, got str 'fast'"),
])
def test_errors_name_file_rank_iteration_field(tmp_path: Path, mutate, expected: str) -> None:
    doc = trace_to_dict(small_trace())
    mutate(doc)
    with pytest.raises(TraceError) as err:
        load_trace(write_doc(tmp_path, doc))
    assert str(err.value).startswith(str(tmp_path / "bad.json"))
    assert expected in str(err.value)


def test_missing_file_and_not_json_and_kineto(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TraceError, match="not a JSON file"):
        load_trace(tmp_path / "x.json")
    with pytest.raises(TraceError, match="looks like a Kineto trace: import it with 'emu capture --kineto"):
        load_trace(A100)


def test_save_refuses_invalid_and_leaves_nothing(tmp_path: Path) -> None:
    bad = small_trace()
    it = bad.ranks[0].iterations[0]
    broken = Iteration(step=it.step, measured_us=it.measured_us, ops=it.ops[:2] + (Wait(ids=(5,)),))
    bad = Trace(meta=bad.meta, ranks=(RankProgram(0, (broken,)),))
    with pytest.raises(TraceError, match="names collectives"):
        save_trace(bad, tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    data = json.dumps(trace_to_dict(small_trace())).encode()
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(data))
    assert load_trace(path) == small_trace()
