"""Uneven all_to_all (per-peer split sizes) from a real gloo capture and a synthetic NCCL record, in
the trace format, in `emu inspect`, and refused by name where emu would have to make them up."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.capture import import_kineto
from emu.cli import cli
from emu.errors import ConfigError, KinetoError, TraceError
from emu.replay import ReplayConfig
from emu.replay.plan.programs import programs_for
from emu.traces import CollKind, load_trace, save_trace, summarize
from emu.traces.model import Splits
from tests.conftest import A100, GLOO_ALLTOALLV


@pytest.fixture(scope="module")
def trace():
    return import_kineto([GLOO_ALLTOALLV])


def _a2a(trace, rank: int, it: int):
    return [op for op in trace.ranks[rank].iterations[it].colls if op.kind == CollKind.ALL_TO_ALL]


def test_gloo_splits_are_what_the_script_sent(trace) -> None:
    """alltoallv.py: rank r sends [3 + r + s, 5 - r] rows of 8 floats at step s (the profiled steps
    are s = 2 and 3); the second all_to_all is even and carries no splits."""
    for it, s in enumerate((2, 3)):
        for r in (0, 1):
            uneven, even = _a2a(trace, r, it)
            send = (8 * (3 + r + s), 8 * (5 - r))
            recv = tuple(8 * (3 + p + s) if r == 0 else 8 * (5 - p) for p in (0, 1))
            assert uneven.splits == Splits(send_elements=send, recv_elements=recv)
            assert uneven.count == sum(send) and uneven.bytes == 4 * sum(send)
            assert even.splits is None and even.count == 64
        # what one rank sends a peer is what that peer receives from it
        a, b = _a2a(trace, 0, it)[0].splits, _a2a(trace, 1, it)[0].splits
        assert a.send_elements[1] == b.recv_elements[0] and b.send_elements[0] == a.recv_elements[1]


def test_splits_survive_the_file_and_inspect_shows_the_imbalance(trace, tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    save_trace(trace, path)
    back = load_trace(path)  # times are rounded in the file; the splits are kept exactly
    assert [_a2a(back, r, k)[0].splits for r in (0, 1) for k in (0, 1)] == \
        [_a2a(trace, r, k)[0].splits for r in (0, 1) for k in (0, 1)]
    # step 2: rank 1 sends 48 of its mean 38 (1.26); step 3: 56 of 40 (1.40)
    assert summarize(trace).all_to_all_imbalance == pytest.approx((48 / 38, 56 / 40))
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    assert "all_to_all imbalance" in result.output and "1.40x the mean (per step: 1.26, 1.40" in result.output
    doc = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output)
    assert doc["all_to_all_imbalance"] == pytest.approx([48 / 38, 56 / 40])


def test_scaling_uneven_all_to_all_is_refused_by_name(trace) -> None:
    programs_for(trace, ReplayConfig(workers=2), "a2a.json")  # at the trace's own size: replayed
    with pytest.raises(ConfigError) as err:
        programs_for(trace, ReplayConfig(workers=4), "a2a.json")
    assert str(err.value).startswith("a2a.json: rank 0, iteration 0: all_to_all 0 sends [40, 40] elements")
    assert "at the trace's own size only for now: replay with --workers 2 and no --mesh" in str(err.value)


@pytest.mark.parametrize("change, fragment", [
    (lambda op: op.update(kind="all_reduce"), "is given on all_reduce; it is an all_to_all's per-peer sizes"),
    (lambda op: op["splits"].update(send_elements=[80]), "lists 1 sends and 2 receives; give one of each per member"),
    (lambda op: op["splits"].update(send_elements=[40, 41]), "sends 81 elements but count is 80"),
    (lambda op: op["splits"].pop("recv_elements"), "needs both send_elements and recv_elements"),
    (lambda op: op["splits"].update(recv_elements=[40, -1]), "must be a list of integers >= 0"),
])
def test_bad_splits_in_a_trace_are_one_line(trace, tmp_path: Path, change, fragment: str) -> None:
    path = tmp_path / "t.json"
    save_trace(trace, path)
    doc = json.loads(path.read_text())
    change(doc["ranks"][0]["iterations"][0]["ops"][next(
        i for i, op in enumerate(doc["ranks"][0]["iterations"][0]["ops"]) if op.get("splits"))])
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert fragment in str(err.value) and "splits" in str(err.value)


def _nccl_all_to_all(tmp_path: Path, in_split: str, out_split: str) -> Path:
    """The real A100 trace's first all_reduce record made an all_to_all with split sizes: no NCCL
    all_to_all trace exists here, so this path is tested on this synthetic change only."""
    doc = json.loads(gzip.decompress(A100.read_bytes()))
    first = next(e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"
                 and e["args"].get("Collective name") == "allreduce")
    first["args"].update({"Collective name": "all_to_all", "In split size": in_split, "Out split size": out_split})
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    return path


def test_nccl_split_sizes_are_rows_of_the_message(tmp_path: Path) -> None:
    trace = import_kineto([_nccl_all_to_all(tmp_path, "[3, 1]", "[2, 2]")])
    op = next(op for it in trace.ranks[0].iterations for op in it.colls if op.kind == CollKind.ALL_TO_ALL)
    # 2,049,000 elements in and out: 512,250 a row
    assert op.splits == Splits(send_elements=(1_536_750, 512_250), recv_elements=(1_024_500, 1_024_500))


@pytest.mark.parametrize("in_split, fragment", [
    ("[3, x]", "the all_to_all's input split sizes are '[3, x]', not a list of sizes"),
    ("[1, 1, 1]", "the all_to_all's input split sizes [1, 1, 1] do not split its 2049000 elements over its 2 ranks"),
])
def test_nccl_garbled_split_sizes_are_refused(tmp_path: Path, in_split: str, fragment: str) -> None:
    with pytest.raises(KinetoError) as err:
        import_kineto([_nccl_all_to_all(tmp_path, in_split, "[]")])
    assert fragment in str(err.value)


def test_ranks_may_send_all_to_alls_of_different_counts(trace, tmp_path: Path) -> None:
    """A router sets each rank's input: one group's all_to_alls need not have one count."""
    path = tmp_path / "t.json"
    save_trace(trace, path)
    doc = json.loads(path.read_text())
    op = next(op for op in doc["ranks"][1]["iterations"][0]["ops"] if op.get("splits"))
    op["splits"]["send_elements"] = [64, 32]
    op["count"], op["bytes"] = 96, 384
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as err:  # rank 0 still says it receives 48 from rank 1
        load_trace(path)
    assert str(err.value).endswith("rank 0: iteration 0 (step 2): all_to_all 0: field 'splits' receives 48 elements "
                                   "from rank 1, which sends it 64: what one sends another is what that one receives")
    peer = next(op for op in doc["ranks"][0]["iterations"][0]["ops"] if op.get("splits"))
    peer["splits"]["recv_elements"] = [40, 64]
    path.write_text(json.dumps(doc))
    assert _a2a(load_trace(path), 1, 0)[0].count == 96
