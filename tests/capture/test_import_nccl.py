"""Importing the real A100/NCCL trace: sizes, steps and compute as docs/design.md defines them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from emu.capture import import_kineto
from emu.errors import KinetoError
from emu.traces import Coll, CollKind, Compute, Wait, load_trace, save_trace
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


# Capture never invents: what the file lacks is refused, naming file, rank, step and event,
# except completion times, which are recorded as gaps (docs/trace-format.md).

AT = "rank 0: step 4: event 'record_param_comms' at ts 4458676524648.797"  # the first all_reduce
RERECORD = "re-record the trace with PyTorch 2.1 or newer"


def _first_allreduce(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"
                and e["args"].get("Collective name") == "allreduce")


@pytest.fixture(scope="module")
def lean(raw) -> dict:
    """The events the refusals below concern: 10 MB less JSON to write and read per case."""
    keep = [e for e in raw["traceEvents"] if e.get("ph") == "X" and (
        e.get("name") == "record_param_comms" or e.get("name", "").startswith("ProfilerStep#")
        or e.get("name") == "autograd::engine::evaluate_function: DivBackward1")]
    return {**raw, "traceEvents": keep}


def _import_changed(tmp_path: Path, raw: dict, change) -> tuple[Path, object]:
    doc = json.loads(json.dumps(raw))
    change(doc)
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    return path, doc


@pytest.mark.parametrize("change, expected", [
    (lambda d: _first_allreduce(d)["args"].pop("dtype"),
     f"{AT}: argument 'dtype' is missing: the allreduce's element type, and so its bytes, are unknown, and emu "
     f"will not guess them (read as bytes, float32 would be 4x too small); {RERECORD}"),
    (lambda d: _first_allreduce(d)["args"].update(dtype="complex"),
     f"{AT}: argument 'dtype' is 'complex', a dtype emu does not know; known: BFloat16, Bool, Byte,"),
    (lambda d: _first_allreduce(d)["args"].update({"In msg nelems": "12"}),
     f"{AT}: argument 'In msg nelems' is '12', not an element count: the collective's size is unknown, and emu "
     f"will not invent it; {RERECORD}"),
    (lambda d: _first_allreduce(d)["args"].update({"Group size": 3}),
     f"{AT}: argument 'Group size' is '3', not a group size in 1..2 (the world size); the file is corrupted"),
    (lambda d: _first_allreduce(d)["args"].update({"Process Group Ranks": "[0, x]"}),
     f"{AT}: argument 'Process Group Ranks' is '[0, x]', not a list of ranks; the file is corrupted"),
    (lambda d: [_first_allreduce(d)["args"].pop(k) for k in ("Group size", "Process Group Ranks",
                                                             "Process Group Name")],
     f"{AT}: neither 'Group size' nor 'Process Group Ranks' is recorded: the collective's group is unknown, and "
     f"emu will not assume the whole job; {RERECORD}"),
    (lambda d: _first_allreduce(d)["args"].update({"Collective name": "gather"}),
     f"{AT}: argument 'Collective name' is 'gather', a collective which emu trace v1 cannot express (supported: "
     "all_gather, all_reduce, all_to_all, barrier, broadcast, recv, reduce_scatter, send)"),
    (lambda d: next(e for e in d["traceEvents"] if e.get("cat") == "cpu_op").update(dur=-5),
     "rank 0: event 'autograd::engine::evaluate_function: DivBackward1' at ts 4458676522690.655: field 'dur' is "
     "-5, not a time in microseconds in 0..86400000000; the file is corrupted, or a profiler bug wrote an "
     "unfinished event; re-record the trace"),
    (lambda d: next(e for e in d["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")).update(
        name="ProfilerStep#" + "9" * 20),
     "rank 0: event 'ProfilerStep#99999999999999999999' at ts 4458676416788.066: the step number has 20 digits; "
     "no job runs that many steps; the file is corrupted"),
    (lambda d: d["distributedInfo"].update(rank=2),
     "field 'distributedInfo' says rank 2 of world size 2: a rank is in 0..world_size-1 and a job has 1..2**20 "
     "ranks; the file is corrupted"),
    (lambda d: d.update(baseTimeNanoseconds="now"),
     "field 'baseTimeNanoseconds' is 'now', not a time in ns since the epoch (an integer in 0..2**63); the file "
     "is corrupted"),
])
def test_what_the_file_lacks_or_garbles_is_refused(tmp_path: Path, lean, change, expected: str) -> None:
    path, _ = _import_changed(tmp_path, lean, change)
    with pytest.raises(KinetoError) as err:
        import_kineto([path])
    assert str(err.value).startswith(f"{path}: {expected}"), str(err.value)


def test_group_size_comes_from_the_group_when_not_recorded(tmp_path: Path, raw, trace) -> None:
    path, _ = _import_changed(tmp_path, raw, lambda d: _first_allreduce(d)["args"].pop("Group size"))
    assert import_kineto([path]).ranks == trace.ranks  # [0, 1] says 2: derived, not invented


def test_a_collective_without_its_kernel_is_a_recorded_gap(tmp_path: Path, raw, trace) -> None:
    def drop_kernel(d: dict) -> None:
        ext = _first_allreduce(d)["args"]["External id"]
        d["traceEvents"] = [e for e in d["traceEvents"]
                            if not (e.get("cat") == "kernel" and e["args"].get("External id") == ext)]

    path, _ = _import_changed(tmp_path, raw, drop_kernel)
    got = import_kineto([path])
    assert got.meta.gaps == (
        "rank0.json: rank 0: step 4: op 14, all_reduce of 2049000 float32 (issued at ts 4458676524648.797): no "
        "NCCL kernel with its External id in the file (the profiling window ended before it ran, or the GPU "
        "events were dropped): observed_us is null and the blocked_us of the wait on it (op 25) is a lower "
        "bound; profile a window that holds the kernel to measure it",)
    op = got.ranks[0].iterations[0].ops[14]
    assert isinstance(op, Coll) and op.observed_us is None and op.count == 2049000
    assert trace.ranks[0].iterations[0].ops[14].observed_us is not None  # it had one with its kernel
    assert got.ranks[0].iterations[1:] == trace.ranks[0].iterations[1:]  # nothing else changed
    saved = save_trace(got, tmp_path / "t.json")
    assert load_trace(saved).meta.gaps == got.meta.gaps


def test_a_trace_without_gpu_activity_records_one_gap(tmp_path: Path, raw) -> None:
    def cpu_only(d: dict) -> None:
        d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]

    path, _ = _import_changed(tmp_path, raw, cpu_only)
    got = import_kineto([path])
    assert got.meta.gaps == (
        "rank0.json: rank 0: no GPU kernels in the file (profiled without CUDA activity), so the completion of its "
        "21 collectives in steps 4..6 is unknown: their observed_us is null and the waits on them count no "
        "blocked time (compute holds it); profile with ProfilerActivity.CUDA to measure them",)
    assert all(op.observed_us is None for it in got.ranks[0].iterations for op in it.colls)


def test_a_collective_without_external_id_takes_no_kernel(tmp_path: Path, raw) -> None:
    # None matched None: a launch without an External id took any such kernel's completion
    def unlink(d: dict) -> None:
        comm = _first_allreduce(d)
        ext = comm["args"].pop("External id")
        next(e for e in d["traceEvents"] if e.get("cat") == "kernel"
             and e["args"].get("External id") == ext)["args"].pop("External id")

    path, _ = _import_changed(tmp_path, raw, unlink)
    got = import_kineto([path])
    assert got.ranks[0].iterations[0].ops[14].observed_us is None and len(got.meta.gaps) == 1


def test_inspect_shows_the_gaps(tmp_path: Path, raw) -> None:
    """What the source lacked is said where users look, not only kept in the file."""
    from click.testing import CliRunner

    from emu.cli import cli

    def cpu_only(d: dict) -> None:
        d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]

    path, _ = _import_changed(tmp_path, raw, cpu_only)
    saved = save_trace(import_kineto([path]), tmp_path / "t.json")
    result = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(cli, ["inspect", str(saved)])
    assert result.exit_code == 0, result.output
    assert "gap" in result.stdout and "no GPU kernels in the file" in result.stdout
    doc = CliRunner().invoke(cli, ["inspect", str(saved), "--json"])
    assert json.loads(doc.stdout)["gaps"][0].startswith("rank0.json: rank 0: no GPU kernels")


def _as_subgroup_job(doc: dict, keep: tuple[str, ...]) -> None:
    """The A100 file as rank 0 of a 4-rank job whose all_reduces ran on a 2-rank group [0, 2],
    recording only the ``keep`` keys of the group (the trace's pg_config lists both groups of 2
    that hold rank 0)."""
    doc["distributedInfo"].update(world_size=4, pg_config=[
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
        {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1]}])
    for e in doc["traceEvents"]:
        if e.get("name") == "record_param_comms":
            args = e["args"]
            for key in ("Process Group Ranks", "Process Group Name", "Process Group Description"):
                args.pop(key, None)
            args["Group size"] = 2
            if "name" in keep:
                args["Process Group Name"] = "1"
            if "ranks" in keep:
                args["Process Group Ranks"] = "[0, 2]"


def test_a_group_named_but_not_listed_takes_its_ranks_from_distributed_info(tmp_path: Path, lean) -> None:
    path, _ = _import_changed(tmp_path, lean, lambda d: _as_subgroup_job(d, ("name",)))
    got = import_kineto([path])
    assert got.meta.mesh is not None and got.meta.mesh.text() == "dp=2,tp=2"  # from the groups' names
    ops = [op for it in got.ranks[0].iterations for op in it.colls]
    assert {op.group for op in ops} == {(0, 2)} and {op.group_role.value for op in ops} == {"dp"}


def test_a_subgroup_neither_listed_nor_named_is_refused_when_two_could_be_it(tmp_path: Path, lean) -> None:
    path, _ = _import_changed(tmp_path, lean, lambda d: _as_subgroup_job(d, ()))
    with pytest.raises(KinetoError, match="a collective of a group of 2 ranks, and the trace says neither its ranks "
                                          "nor a group name it lists \\(2 groups of that size hold this rank\\): emu "
                                          "cannot tell the groups apart"):
        import_kineto([path])
