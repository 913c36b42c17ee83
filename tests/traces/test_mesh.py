"""The job's mesh, process groups' roles and streams in the trace format (docs/trace-format.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu.errors import TraceError
from emu.traces import (
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
from emu.traces.mesh import Mesh
from emu.traces.model import GroupRole

MESH = Mesh.of([("dp", 2), ("tp", 2)])


def dp_tp_trace() -> Trace:
    """dp=2 x tp=2: each rank all-reduces activations in its tp pair, gradients in its dp pair."""
    meta = TraceMeta(source=Source.CAPTURE, world_size=4, backend="gloo", device="cpu", framework="torch 2.13.0",
                     dtype="float32", captured_at="2026-12-01T09:00:00Z", model="tp", mesh=MESH, cpu_cores=2,
                     threads_per_rank=1)
    ranks = []
    for r in range(4):
        tp, dp = MESH.slice(r, (1,)), MESH.slice(r, (0,))
        ops = (Compute("forward", 100.0),
               Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=64, bytes=256, group_size=2,
                    group=tp, group_role=GroupRole.TP, stream=0),
               Wait(ids=(0,), blocked_us=5.0), Compute("backward", 50.0),
               Coll(id=1, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=1000, bytes=4000, group_size=2,
                    group=dp, group_role=GroupRole.DP, stream=1),
               Wait(ids=(1,), blocked_us=20.0))
        ranks.append(RankProgram(rank=r, iterations=(Iteration(step=3, measured_us=175.0, ops=ops),)))
    return Trace(meta=meta, ranks=tuple(ranks))


def test_mesh_arithmetic_is_row_major_like_device_mesh() -> None:
    assert [MESH.coords(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert MESH.slice(2, (1,)) == (2, 3) and MESH.slice(1, (0,)) == (1, 3) and MESH.slice(0, (0, 1)) == (0, 1, 2, 3)
    assert MESH.spans((1, 3)) == (0,) and MESH.spans((0, 3)) is None
    assert MESH.role_of((0, 2)) == GroupRole.DP and MESH.role_of((2, 3)) == GroupRole.TP
    assert MESH.role_of((0, 1, 2, 3)) == GroupRole.OTHER  # the whole job spans both dimensions
    assert Mesh.of([("fsdp", 4)]).role_of((0, 1, 2, 3)) == GroupRole.FSDP
    assert Mesh.of([("dp_shard", 2), ("cp", 2)]).dims[0].role == GroupRole.FSDP  # torchtitan's name
    assert Mesh.of([("dp_shard", 2), ("cp", 2)]).dims[1].role == GroupRole.OTHER
    assert MESH.text() == "dp=2,tp=2"


def test_round_trip_keeps_mesh_roles_and_streams(tmp_path: Path) -> None:
    trace = dp_tp_trace()
    assert load_trace(save_trace(trace, tmp_path / "t.json")) == trace
    doc = trace_to_dict(trace)
    assert doc["meta"]["mesh"] == {"dp": 2, "tp": 2}
    assert list(doc["meta"]["mesh"]) == ["dp", "tp"]  # outermost first, as written
    assert doc["meta"]["cpu_cores"] == 2 and doc["meta"]["threads_per_rank"] == 1
    op = doc["ranks"][1]["iterations"][0]["ops"][4]
    assert op["group"] == [1, 3] and op["group_role"] == "dp" and op["stream"] == 1


def test_round_trip_keeps_the_experts(tmp_path: Path) -> None:
    from emu.traces.model import Experts

    trace = replace(dp_tp_trace(), meta=replace(dp_tp_trace().meta, experts=Experts(16, 262912)))
    assert load_trace(save_trace(trace, tmp_path / "t.json")) == trace
    assert trace_to_dict(trace)["meta"]["experts"] == {"count": 16, "params_per_expert": 262912}


def test_traces_without_the_keys_are_unchanged() -> None:
    """Optional keys: a v1 trace without them has none written back (digests of old traces hold)."""
    from tests.traces.test_io import small_trace

    doc = trace_to_dict(small_trace())
    assert "mesh" not in doc["meta"] and "cpu_cores" not in doc["meta"]
    assert all("group_role" not in op and "stream" not in op for op in doc["ranks"][0]["iterations"][0]["ops"])


def _write(tmp_path: Path, change) -> Path:
    doc = trace_to_dict(dp_tp_trace())
    change(doc)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


def _op(doc: dict, rank: int, k: int) -> dict:
    return doc["ranks"][rank]["iterations"][0]["ops"][k]


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["meta"].update(mesh={"dp": 2, "tp": 3}),
     "field 'meta.mesh' is dp=2,tp=3, 6 ranks, but the job has 4: the sizes multiply to the world size"),
    (lambda d: d["meta"].update(mesh={"dp": 2, "TP": 2}),
     "field 'meta.mesh' names a dimension 'TP'; names are lower-case identifiers"),
    (lambda d: d["meta"].update(mesh={"dp": 0, "tp": 2}),
     "field 'meta.mesh.dp' is 0; give the dimension's size, an integer >= 1"),
    (lambda d: d["meta"].update(mesh=[2, 2]), "field 'mesh' must be an object"),
    (lambda d: d["meta"].update(experts={"count": 0, "params_per_expert": 10}),
     "field 'meta.experts.count' is 0; give the number of experts, an integer >= 1"),
    (lambda d: d["meta"].update(experts={"count": 16}),
     "field 'meta.experts.params_per_expert' is absent; give one expert's parameter elements"),
    (lambda d: _op(d, 0, 1).update(group_role="sp"),
     "rank 0: iteration 0 (step 3): op 1: field 'group_role' is 'sp'; it must be one of: dp, fsdp, tp, pp, ep, other"),
    (lambda d: _op(d, 0, 1).update(stream=70000),
     "op 1: field 'stream' is 70000; a stream is a rank's own number in 0..65535"),
    (lambda d: _op(d, 0, 1).update(group_role="dp"),
     "op 1: field 'group_role' is dp but the group [0, 1] is not rank 0's dp slice [0, 2] of meta.mesh dp=2,tp=2"),
    (lambda d: _op(d, 2, 4).update(group=[2, 3], group_role="dp"),
     "rank 2: iteration 0 (step 3): op 4: field 'group_role' is dp but the group [2, 3]"),
])
def test_inconsistent_groups_and_meshes_are_refused(tmp_path: Path, change, expected: str) -> None:
    with pytest.raises(TraceError) as err:
        load_trace(_write(tmp_path, change))
    assert expected in str(err.value)


def test_a_peer_outside_the_group_is_refused(tmp_path: Path) -> None:
    def change(doc: dict) -> None:
        for r in range(4):
            ops = doc["ranks"][r]["iterations"][0]["ops"]
            pair = [r - r % 2, r - r % 2 + 1]
            ops[1] = {"op": "coll", "id": 0, "kind": "send" if r % 2 == 0 else "recv", "dtype": "float32",
                      "count": 64, "bytes": 256, "group_size": 2, "observed_us": None, "group": pair,
                      "peer": 3 if r == 0 else pair[1 - r % 2]}
    with pytest.raises(TraceError, match="op 1: field 'peer' is 3, not a rank of the group \\[0, 1\\] the send"):
        load_trace(_write(tmp_path, change))
