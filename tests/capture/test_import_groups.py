"""Importing gloo traces of sharded and split jobs: each collective's group, role and stream.

tests/data/gloo-{fsdp,tp,pp}-world4 hold the Kineto files of the four ranks of the examples'
scripts and the record emu capture writes beside each (``rank<R>.comms.json``), from which the
import learns the process group of every gloo launch (docs/capture.md, "Process groups").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from emu.capture import import_kineto
from emu.errors import KinetoError
from emu.traces import CollKind, Wait
from emu.traces.model import GroupRole
from tests.conftest import DATA


def _copy(tmp_path: Path, scenario: str, comms: bool = True) -> Path:
    out = tmp_path / scenario
    out.mkdir()
    for f in (DATA / scenario).iterdir():
        if comms or not f.name.endswith(".comms.json"):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def tp():
    return import_kineto([DATA / "gloo-tp-world4"])


@pytest.fixture(scope="module")
def pp():
    return import_kineto([DATA / "gloo-pp-world4"])


def test_dp_x_tp_collectives_run_on_their_groups_and_streams(tp) -> None:
    assert tp.meta.mesh.text() == "dp=2,tp=2" and len(tp.ranks) == 4
    for program in tp.ranks:
        r = program.rank
        tp_pair, dp_pair = (r - r % 2, r - r % 2 + 1), (r % 2, r % 2 + 2)
        for it in program.iterations:
            by_role = {}
            for op in it.colls:
                assert op.kind == CollKind.ALL_REDUCE
                by_role.setdefault(op.group_role, set()).add((op.group, op.stream))
            # the tensor-parallel activations on the pair, the DDP buckets on the replicas, each on its stream
            assert by_role == {GroupRole.TP: {(tp_pair, 0)}, GroupRole.DP: {(dp_pair, 1)}}
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.05)


def test_a_functional_collective_waits_in_wait_tensor(tp) -> None:
    """DTensor waits for each tensor-parallel all_reduce in ``wait_tensor``: the wait is there,
    blocked for at most the collective's observed time."""
    it = tp.ranks[0].iterations[0]
    colls = {op.id: op for op in it.colls}
    for op in it.ops:
        if isinstance(op, Wait) and colls[op.ids[0]].group_role == GroupRole.TP:
            assert len(op.ids) == 1 and 0 <= op.blocked_us <= colls[op.ids[0]].observed_us + 1
    tp_waits = [op for op in it.ops if isinstance(op, Wait) and colls[op.ids[0]].group_role == GroupRole.TP]
    assert len(tp_waits) == sum(op.group_role == GroupRole.TP for op in it.colls)


def test_pipeline_sends_name_global_peers(pp) -> None:
    assert pp.meta.mesh.text() == "pp=2,dp=2"
    for program in pp.ranks:
        r = program.rank
        stage, other = divmod(r, 2)[0], (r + 2) % 4
        for it in program.iterations:
            p2p = [op for op in it.colls if op.kind in (CollKind.SEND, CollKind.RECV)]
            assert p2p and {op.peer for op in p2p} == {other}
            assert {op.group for op in p2p} == {tuple(sorted((r, other)))}
            assert {op.group_role for op in p2p} == {GroupRole.PP}
            # GPipe: stage 0 sends activations first and receives gradients; stage 1 the other way round
            first = CollKind.SEND if stage == 0 else CollKind.RECV
            assert p2p[0].kind == first and sum(op.kind == CollKind.SEND for op in p2p) == len(p2p) // 2
            (dp,) = [op for op in it.colls if op.kind == CollKind.ALL_REDUCE]
            assert dp.group == (r - r % 2, r - r % 2 + 1) and dp.group_role == GroupRole.DP and dp.stream == 1


def test_fsdp_gathers_and_scatters_on_the_whole_job_with_its_waits() -> None:
    trace = import_kineto([DATA / "gloo-fsdp-world4"])
    assert trace.meta.mesh.text() == "fsdp=4"
    for program in trace.ranks:
        for it in program.iterations:
            kinds = {op.kind for op in it.colls}
            assert kinds == {CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER}
            assert all(op.group is None and op.group_role == GroupRole.FSDP and op.stream is None for op in it.colls)
            # FSDP's backward waits inside autograd functions' spans: the waits are found, not counted as compute
            waited = {i for op in it.ops if isinstance(op, Wait) for i in op.ids}
            assert waited == {op.id for op in it.colls}
            assert it.blocked_us > 0.1 * it.measured_us


def test_subgroups_without_the_record_are_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "gloo-tp-world4", comms=False)
    with pytest.raises(KinetoError, match="rank0.json.gz: rank 0 belongs to process groups of \\[2\\] ranks besides "
                                          "the whole job, and gloo's events do not say which group each collective "
                                          "ran on; emu will not read them all as the whole job's: capture the script "
                                          "with 'emu capture -- python SCRIPT'"):
        import_kineto([folder])


def test_a_launch_missing_from_the_record_is_refused(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "gloo-tp-world4")
    path = folder / "rank1.comms.json"
    doc = json.loads(path.read_text())
    doc["collectives"] = doc["collectives"][:2]  # the recorder's ring overflowed
    path.write_text(json.dumps(doc))
    with pytest.raises(KinetoError, match="rank1.json.gz: rank 1: step \\d+: event 'c10d::allreduce_' at ts [0-9.]+: "
                                          "no entry of .*rank1.comms.json was issued during it, so its group is "
                                          "unknown; the flight recorder may have run out of room: set "
                                          "TORCH_FR_BUFFER_SIZE higher"):
        import_kineto([folder])


@pytest.mark.parametrize("text, expected", [
    ("{", "it cannot be read as JSON"),
    ('{"version": 2}', "field 'version' is not 1"),
    ('{"version": 1, "collectives": [{"group": "1"}]}', "an entry lacks a field or has a wrong one (KeyError"),
])
def test_a_broken_record_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    folder = _copy(tmp_path, "gloo-pp-world4")
    (folder / "rank2.comms.json").write_text(text)
    with pytest.raises(KinetoError) as err:
        import_kineto([folder])
    assert str(err.value).startswith(f"{folder / 'rank2.comms.json'}: {expected}"), str(err.value)


def test_files_whose_groups_disagree_are_not_one_job(tmp_path: Path) -> None:
    import gzip

    folder = _copy(tmp_path, "gloo-pp-world4")
    path = folder / "rank1.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for pg in doc["distributedInfo"]["pg_config"]:
        if pg["pg_name"] == "3":
            pg["ranks"] = [1, 2]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(KinetoError, match="rank1.json.gz: rank files of different jobs: process group '3' holds "
                                          "ranks \\[1, 2\\] here but \\[0, 1\\] in"):
        import_kineto([folder])
