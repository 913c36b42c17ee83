"""Real captures: torch runs DDP on gloo in real rank processes that emu starts and stops."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.capture import CaptureConfig, capture_model
from emu.capture.run import AFTER_STEPS
from emu.cli import cli
from emu.traces import CollKind, load_trace
from emu.traces.noise import profiled_step_us, profiler_overhead
from tests.conftest import as_in_a_terminal, processes_mentioning

torch = pytest.importorskip("torch", reason="capture needs torch (pip install 'emu[capture]')")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_train.py"


def params_of(model: str) -> int:
    from emu.capture.models import WORKLOADS
    return sum(p.numel() for p in WORKLOADS[model].build().parameters())


def profiler_steps(kineto: Path) -> list[dict]:
    raw = json.loads(kineto.read_text())
    return sorted((e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
                   and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])


def buckets(trace) -> list[list]:
    return [[op for op in it.colls if op.kind == CollKind.ALL_REDUCE]
            for p in trace.ranks for it in p.iterations]


def test_mlp_capture_sizes_steps_and_meta(no_leftovers: Path) -> None:
    trace = capture_model("mlp", CaptureConfig(profile_steps=2, warmup=2, keep_kineto=no_leftovers))
    params = params_of("mlp")
    assert trace.meta.params == params and trace.meta.model == "mlp" and trace.meta.batch_size == 32
    assert trace.meta.framework == f"torch {torch.__version__}" and trace.meta.backend == "gloo"
    assert [p.rank for p in trace.ranks] == [0, 1]
    for iteration_buckets in buckets(trace):
        assert sum(b.count for b in iteration_buckets) == params
    for program in trace.ranks:
        steps = profiler_steps(no_leftovers / f"rank{program.rank}.json")
        assert [it.measured_us for it in program.iterations] == [e["dur"] for e in steps]
        assert [it.step for it in program.iterations] == [3, 4]  # warm-up 2, profiler warm-up 1
        # the steps past the window, each timed without the profiler (emu.capture.run.AFTER_STEPS)
        after = json.loads((no_leftovers / f"rank{program.rank}.meta.json").read_text())["unprofiled_step_us"]
        assert len(after) == AFTER_STEPS and all(x > 0 for x in after)
    noise = trace.meta.noise
    assert noise.unprofiled_steps == AFTER_STEPS - 1  # each rank's first left out
    # the same workload's steps with and without the profiler: the same order of time (a factor of 4
    # either way: beside make test's other workers the profiled steps once took 2.0x the others)
    assert 0.25 < noise.unprofiled_step_us / profiled_step_us(trace) < 4 and profiler_overhead(trace) is not None


@pytest.mark.slow
def test_bucket_count_follows_bucket_cap(no_leftovers: Path) -> None:
    big = capture_model("mlp", CaptureConfig(profile_steps=1, warmup=2), bucket_cap_mb=100)
    small = capture_model("mlp", CaptureConfig(profile_steps=1, warmup=2, keep_kineto=no_leftovers),
                          bucket_cap_mb=0.05)
    assert all(len(b) == 1 for b in buckets(big))
    cap = int(0.05 * (1 << 20))
    for iteration_buckets in buckets(small):
        # DDP closes a bucket once it holds >= cap bytes, and never splits a tensor:
        # [b3, W3] (82 KB), [b2, W2] (16 MB), [b1, W1] (8 MB)
        assert len(iteration_buckets) == 3
        for k, bucket in enumerate(iteration_buckets):
            sizes = [4 * int(torch.Size(s).numel()) for s in bucket.tensors]
            assert sum(sizes) == bucket.bytes
            assert sum(sizes[:-1]) < cap  # it was still open before its last tensor
            assert k == len(iteration_buckets) - 1 or bucket.bytes >= cap


@pytest.mark.slow
def test_cnn_capture_has_buffer_broadcasts(no_leftovers: Path) -> None:
    trace = capture_model("cnn", CaptureConfig(profile_steps=1, warmup=2, keep_kineto=no_leftovers),
                          batch_size=8)
    for it in trace.ranks[0].iterations:
        kinds = {op.kind for op in it.colls}
        assert CollKind.BROADCAST in kinds  # DDP broadcasts BatchNorm buffers every forward
        reduced = sum(op.count for op in it.colls if op.kind == CollKind.ALL_REDUCE)
        assert reduced == params_of("cnn")


def test_unmodified_script_capture(no_leftovers: Path) -> None:
    out = no_leftovers / "ddp.json.gz"
    result = CliRunner().invoke(cli, [
        "capture", "--world-size", "2", "--iters", "2", "--warmup", "2", "-o", str(out),
        "--keep-kineto", str(no_leftovers / "k"), "--", "python", str(EXAMPLE), "--steps", "8"])
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    hidden = 1024
    params = 512 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10
    assert trace.meta.params == params and trace.meta.model == "ddp_train"
    assert trace.meta.command.endswith(f"-- python {EXAMPLE} --steps 8")
    for iteration_buckets in buckets(trace):
        assert sum(b.count for b in iteration_buckets) == params
    assert (no_leftovers / "k" / "rank0.json").is_file() and (no_leftovers / "k" / "rank1.json").is_file()
    # 8 steps: warm-up 2, the profiler's 1, 2 profiled; the 3 after them timed without the profiler
    assert trace.meta.noise.unprofiled_steps == 2  # 3 timed, each rank's first left out


@pytest.mark.slow
def test_a_comm_hook_is_recorded_with_its_compressed_buckets(no_leftovers: Path) -> None:
    out = no_leftovers / "fp16.json.gz"
    result = CliRunner().invoke(cli, [
        "capture", "--world-size", "2", "--iters", "2", "--warmup", "2", "-o", str(out), "--",
        "python", str(EXAMPLE), "--steps", "8", "--hidden", "256", "--comm-hook", "fp16"])
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    assert trace.meta.comm_hook == "fp16_compress_hook" and trace.meta.gaps == ()
    params = 512 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    for iteration_buckets in buckets(trace):  # the buckets cross as float16: half the bytes
        assert sum(b.count for b in iteration_buckets) == params
        assert {b.dtype.value for b in iteration_buckets} == {"float16"}
        assert sum(b.bytes for b in iteration_buckets) == 2 * params


@pytest.mark.slow
def test_script_with_too_few_steps(no_leftovers: Path) -> None:
    result = CliRunner().invoke(cli, [
        "capture", "-o", str(no_leftovers / "o.json"), "--keep-kineto", str(no_leftovers),
        "--", "python", str(EXAMPLE), "--steps", "3"])
    assert result.exit_code == 2
    assert "made 3 optimizer steps, but emu needs 10" in result.stderr


def test_failing_script_stops_every_rank(no_leftovers: Path) -> None:
    script = no_leftovers / "crash.py"
    script.write_text("import os, time\n"
                      "if os.environ['RANK'] == '1':\n    raise SystemExit('rank 1 gives up')\n"
                      "time.sleep(120)\n")
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["capture", "-o", str(no_leftovers / "o.json"),
                                      "--keep-kineto", str(no_leftovers), "--", "python", str(script)])
    assert result.exit_code == 1  # a run that failed, not bad input
    assert f"rank 1 exited with code 1: rank 1 gives up (log: {no_leftovers / 'rank1.log'})" in result.stderr
    assert time.monotonic() - start < 60  # rank 0 was stopped, not waited for


def test_crashed_rank_is_one_line_and_its_log_stays(tmp_path: Path) -> None:
    script = tmp_path / "abort.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '0':\n    print('about to abort', flush=True)\n    os.abort()\n"
                      "time.sleep(120)\n")
    proc = subprocess.run([sys.executable, "-m", "emu", "capture", "-o", str(tmp_path / "o.json"), "--", "python",
                           str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("emu: error: rank 0 was killed by SIGABRT: about to abort (log: ")
    log = Path(line.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "about to abort" in log.read_text()  # the temporary folder of a failed capture stays
    assert processes_mentioning(str(log.parent)) == []
    shutil.rmtree(log.parent)


def start_capture(script: Path, work: Path, runtime: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    """``emu capture`` of script in its own process group, once both ranks run."""
    proc = subprocess.Popen([sys.executable, "-m", "emu", "capture", "-o", str(work / "o.json"),
                             "--keep-kineto", str(work), "--", "python", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "NO_COLOR": "1", "XDG_RUNTIME_DIR": str(runtime)},
                            preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 60
    ranks = f"emu.capture --out {work}"
    while len(processes_mentioning(ranks)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = processes_mentioning(ranks)
    if len(pids) != 2:
        proc.kill()
        raise AssertionError("the ranks did not start")
    return proc, pids


def test_ctrl_c_stops_every_rank(no_leftovers: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    script = no_leftovers / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")
    proc, _ = start_capture(script, no_leftovers, tmp_path_factory.mktemp("runtime"))
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.decode().splitlines() == ["emu: interrupted"]  # one line, no traceback of any rank


def _recorded(pid: int) -> list[int]:
    """The children the live run ``pid`` has recorded so far."""
    import json

    from emu import lifetime

    found = []
    for path in lifetime.runtime_dir().glob(f"{pid}-*.json"):
        try:
            found += [child for child, _ in json.loads(path.read_text())["children"]]
        except (OSError, ValueError, KeyError):
            pass
    return sorted(found)


def test_ranks_die_with_a_killed_emu(no_leftovers: Path, tmp_path_factory: pytest.TempPathFactory,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from emu import lifetime

    script = no_leftovers / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")
    runtime = tmp_path_factory.mktemp("runtime")
    proc, ranks = start_capture(script, no_leftovers, runtime)
    # The record is saved just after each rank starts (best effort: a SIGKILL between the two cannot
    # be helped, and the parent-death signal still stops the rank); wait until it names both.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _recorded(proc.pid) != sorted(ranks):
        time.sleep(0.05)
    assert _recorded(proc.pid) == sorted(ranks), "the run's record does not name both ranks"
    proc.kill()  # SIGKILL: emu runs no code of its own
    proc.wait()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(no_leftovers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(no_leftovers)) == [], "a rank outlived emu"
    # the run's record names both ranks, for `emu clean`
    (record,) = [rec for _, rec, _ in lifetime.leftovers() if rec.pid == proc.pid]
    assert sorted(pid for pid, _ in record.children) == sorted(ranks)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tp", "fsdp", "pp"])
def test_sharded_and_split_captures_name_every_group(no_leftovers: Path, model: str) -> None:
    """The built-in FSDP, tensor-parallel and pipeline workloads at world size 4: four real ranks
    of one thread each; every collective on its group, with its role, and the job's mesh
    (docs/parallelism.md)."""
    from emu.capture.run import PARALLEL_WORLD

    trace = capture_model(model, CaptureConfig(world_size=PARALLEL_WORLD, profile_steps=2, warmup=2,
                                               keep_kineto=no_leftovers))
    meta = trace.meta
    mesh = {"fsdp": "fsdp=4", "tp": "dp=2,tp=2", "pp": "pp=2,dp=2"}[model]
    assert meta.mesh is not None and meta.mesh.text() == mesh and meta.threads_per_rank == 1 and meta.cpu_cores
    assert len(trace.ranks) == 4 and all((no_leftovers / f"rank{r}.comms.json").exists() for r in range(4))
    for program in trace.ranks:
        for it in program.iterations:
            assert it.colls and all(op.group_role is not None for op in it.colls)
            for op in it.colls:
                dim = meta.mesh.names.index(op.group_role.value)
                assert (op.group or tuple(range(4))) == meta.mesh.slice(program.rank, (dim,))
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.05)


def test_moe_capture_records_its_routers_uneven_splits(no_leftovers: Path) -> None:
    """The built-in mixture of experts at world size 4 (pure expert parallelism: 16 experts, top-2,
    capacity factor 1.25): each step's token exchanges carry the per-peer sizes its router chose,
    consistent between ranks, and the replicated parameters' all_reduce runs on the same group."""
    from emu.capture.run import PARALLEL_WORLD

    trace = capture_model("moe", CaptureConfig(world_size=PARALLEL_WORLD, profile_steps=2, warmup=1,
                                               keep_kineto=no_leftovers))
    from emu.capture.run import MOE_EXPERTS

    assert trace.meta.mesh is not None and trace.meta.mesh.text() == "ep=4"
    assert trace.meta.experts == MOE_EXPERTS  # what a replay at another ep needs
    width = 256  # moe_train.py's default: a dispatched row carries the token and its expert's index
    for k in range(2):
        uneven = [[op for op in p.iterations[k].colls if op.splits is not None] for p in trace.ranks]
        assert all(len(ops) == 4 for ops in uneven)  # dispatch and combine, forward and backward
        dispatch = [ops[0].splits for ops in uneven]
        for i in range(4):
            for j in range(4):  # what rank i sends rank j is what j receives from i
                assert dispatch[i].send_elements[j] == dispatch[j].recv_elements[i]
            tokens = sum(dispatch[i].send_elements) // (width + 1)
            assert tokens <= 2 * 256 and sum(dispatch[i].send_elements) % (width + 1) == 0  # top-2, some dropped
        assert max(s.imbalance for s in dispatch) > 1.05  # the router is not balanced
        roles = {op.group_role.value for p in trace.ranks for op in p.iterations[k].colls}
        assert roles == {"ep"}


def test_a_capture_beside_a_busy_process_says_so(tmp_path: Path) -> None:
    """A capture taken beside a CPU-bound process (the issue's own check) warns, records why in
    meta.noise (other processes' cores over the profiled window, from /proc/stat against the ranks'
    own CPU time), and a replay of it says so in its report; --busy-ok records without warning."""
    out = tmp_path / "busy.json.gz"
    # 8 profiled steps, about half a second: /proc/stat counts in 10 ms ticks, and over 3 steps
    # (0.2 s, 40 ticks of two cores) the spinner's share came out 0.40 once (2026-12-06)
    iters = 8
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        res = CliRunner().invoke(cli, ["capture", "--model", "mlp", "--iters", str(iters), "--warmup", "2", "--no-sparsity",
                                       "--windows", "1", "-o", str(out)])
        quiet = CliRunner().invoke(cli, ["capture", "--model", "mlp", "--iters", "3", "--warmup", "2", "--no-sparsity",
                                         "--windows", "1", "--busy-ok", "-o", str(tmp_path / "ok.json.gz")])
    finally:
        spinner.kill()
        spinner.wait()
    assert res.exit_code == 0, res.output
    noise = load_trace(out).meta.noise
    assert noise is not None and noise.other_cores is not None and noise.other_cores >= 0.5
    assert any(line.startswith("other processes kept") for line in noise.busy)
    assert "warning: other processes kept" in res.stderr and "meta.noise" in res.stderr
    assert f"without the profiler, {max(AFTER_STEPS, iters + 1) - 1} steps past the window: median " in res.stderr
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    replayed = CliRunner().invoke(cli, ["replay", str(out), "--iters", "1", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert any(line.startswith("other processes kept") for line in json.loads(replayed.stdout)["trace"]["noise"])
    assert json.loads(replayed.stdout)["trace"]["profiler_overhead"] == pytest.approx(profiler_overhead(load_trace(out)),
                                                                                     abs=1e-4)
    table = CliRunner().invoke(cli, ["replay", str(out), "--iters", "1"])
    assert table.exit_code == 0 and "the trace: other processes kept" in table.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a small tmpfs, which needs root to mount")
def test_keep_kineto_on_a_full_disk_says_so(tmp_path: Path) -> None:
    """--keep-kineto on a full disk: the error says the disk is full (it said "rank 1 exited with
    code 1" with an empty log), exit 1, and no half-written file is left (issue 37)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("mount -t tmpfs failed here")
    try:
        result = CliRunner().invoke(cli, ["capture", "--model", "mlp", "--iters", "2", "--warmup", "1",
                                          "--keep-kineto", str(disk / "kin"), "-o", str(tmp_path / "t.json")])
        assert result.exit_code == 1, result.output
        assert f"the disk holding {disk / 'kin'} is full" in result.stderr, result.stderr
        left = sorted(p.name for p in (disk / "kin").iterdir())
        assert all(name.endswith(".log") for name in left) and left, left
    finally:
        subprocess.run(["umount", str(disk)])
