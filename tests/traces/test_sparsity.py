"""The optional ``sparsity`` key of all_reduce ops: hand-made traces load, and bad values are refused
with the file, rank, iteration, op and field named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from emu.errors import TraceError
from emu.traces import CollKind, Sparsity, load_trace, sample_path, summarize

GOOD = {"block_elements": 256, "nonzero": 0.12, "union": 0.3}


def doc(sparsity: Any = None, kind: str = "all_reduce") -> dict[str, Any]:
    coll: dict[str, Any] = {"op": "coll", "id": 0, "kind": kind, "dtype": "float32", "count": 512, "bytes": 2048,
                            "group_size": 2, "observed_us": 40.0}
    if sparsity is not None:
        coll["sparsity"] = sparsity
    ops = [{"op": "compute", "name": "backward", "dur_us": 100.0}, coll, {"op": "wait", "ids": [0]}]
    meta = {"source": "capture", "model": "dlrm", "world_size": 2, "backend": "gloo", "device": "cpu",
            "framework": "torch 2.13.0", "dtype": "float32", "captured_at": "2026-11-30T00:00:00Z"}
    return {"schema": "emu-trace", "schema_version": 1, "meta": meta,
            "ranks": [{"rank": r, "iterations": [{"step": 3, "measured_us": 100.0, "ops": copy.deepcopy(ops)}]}
                      for r in range(2)]}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return path


def test_sparsity_loads(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, doc(GOOD)))
    op = trace.ranks[0].iterations[0].colls[0]
    assert op.sparsity == Sparsity(block_elements=256, nonzero=0.12, union=0.3)
    stats = summarize(trace).sparsity
    assert stats is not None and stats.block_elements == 256 and stats.all_reduces == 2
    assert stats.nonzero_median == pytest.approx(0.12) and stats.union_weighted == pytest.approx(0.3)


def test_a_trace_without_sparsity_loads_as_before(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, doc()))
    assert trace.ranks[0].iterations[0].colls[0].sparsity is None
    assert summarize(trace).sparsity is None


@pytest.mark.parametrize("sparsity, fld, says", [
    ({"block_elements": 256, "nonzero": 0.5, "union": 0.3}, "sparsity", "nonzero <= union"),
    ({"block_elements": 256, "nonzero": 0.2, "union": 1.5}, "sparsity.union", "a number in [0, 1]"),
    ({"block_elements": 256, "nonzero": "0.2", "union": 0.3}, "sparsity.nonzero", "a number in [0, 1]"),
    ({"block_elements": 256, "nonzero": -0.1, "union": 0.3}, "sparsity.nonzero", "a number in [0, 1]"),
    ({"block_elements": 256, "nonzero": True, "union": 0.3}, "sparsity.nonzero", "a number in [0, 1]"),
    ({"block_elements": 256, "union": 0.3}, "sparsity.nonzero", "a number in [0, 1]"),
    ({"block_elements": 0, "nonzero": 0.2, "union": 0.3}, "sparsity.block_elements", "an integer in 1.."),
    ({"block_elements": 2.5, "nonzero": 0.2, "union": 0.3}, "sparsity.block_elements", "an integer in 1.."),
    ({"block_elements": 1 << 21, "nonzero": 0.2, "union": 0.3}, "sparsity.block_elements", "an integer in 1.."),
    ("dense", "sparsity", "must be an object"),
])
def test_bad_sparsity_is_refused(tmp_path: Path, sparsity: Any, fld: str, says: str) -> None:
    path = write(tmp_path, doc(sparsity))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}: rank 0: iteration 0 (step 3): op 1: field '{fld}'")
    assert says in message


def test_sparsity_on_an_all_gather_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, doc(GOOD, kind="all_gather"))
    with pytest.raises(TraceError, match=r"op 1: field 'sparsity' is given on all_gather; it is measured on "
                                         r"all_reduce only: drop it"):
        load_trace(path)


def test_shipped_dlrm_sample_has_sparsity() -> None:
    trace = load_trace(sample_path("dlrm"))
    assert trace.meta.model == "dlrm" and trace.meta.world_size == 2 and trace.iterations == 5
    reduces = [op for p in trace.ranks for it in p.iterations for op in it.colls if op.kind == CollKind.ALL_REDUCE]
    assert reduces
    for op in reduces:
        s = op.sparsity
        assert s is not None and s.block_elements == 256
        assert 0.05 <= s.nonzero < s.union <= 0.3
    assert sample_path("dlrm").stat().st_size < 100_000
