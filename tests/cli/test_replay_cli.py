"""``emu replay`` on the command line: report contract, exit codes, Ctrl-C and crashes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from tests.cli.test_cli_errors import assert_one_line_error
from tests.conftest import as_in_a_terminal

KEYS = {"report_version", "emu_version", "config", "trace", "iterations", "summary", "verification",
        "emulator", "fabric"}


def run(*args: str):
    return CliRunner(env={"NO_COLOR": "1", "COLUMNS": "160"}).invoke(cli, list(args))


def test_report_and_chrome_trace(tmp_path: Path, no_children) -> None:
    report, chrome = tmp_path / "r.json", tmp_path / "c.json"
    result = run("replay", "mlp", "--workers", "4", "--fabric", "ina", "--iters", "2", "--payload-scale", "64",
                 "--report", str(report), "--chrome-trace", str(chrome))
    assert result.exit_code == 0, result.output
    assert "ina" in result.stdout and "verification" in result.stdout
    doc = json.loads(report.read_text())
    assert KEYS <= doc.keys()
    assert {"workers", "fabric", "bandwidth_bps", "latency_us", "tdf", "payload_scale"} <= doc["config"].keys()
    assert {"path", "model", "source", "world_size"} <= doc["trace"].keys()
    assert {"emulated_us", "compute_us", "comm_us", "exposed_comm_us"} <= doc["iterations"][0].keys()
    assert {"iteration_us_median", "iteration_us_p99", "throughput_samples_per_s", "bytes_sent"} <= doc["summary"].keys()
    assert doc["verification"]["ok"] is True and doc["verification"]["elements_checked"] > 0
    assert {"clock", "tdf", "payload_scale", "lag_us_p99", "trustworthy", "wall_s", "cpu_percent"} <= doc["emulator"].keys()
    assert doc["emulator"]["clock"] == "sync" and doc["emulator"]["trustworthy"] is True
    assert doc["emulator"]["tdf"] is None and doc["emulator"]["lag_us_p99"] is None
    assert {"packets", "retransmissions", "duplicates", "slots"} <= doc["fabric"].keys()
    assert doc["complete"] is True and doc["reason"] is None
    assert doc["fabric"]["invalid"] == doc["fabric"]["malformed"] == doc["fabric"]["stale"] == 0
    trace = json.loads(chrome.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1, 2, 3}
    assert {e["cat"] for e in spans} >= {"compute", "comm"}
    assert all(e["dur"] >= 0 for e in spans)


def test_side_by_side_and_json(tmp_path: Path, no_children) -> None:
    result = run("replay", "mlp", "--workers", "4", "--fabric", "ina,ring", "--iters", "1", "--payload-scale", "64",
                 "--json", "--report", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)
    assert [d["config"]["fabric"] for d in docs] == ["ina", "ring"]
    assert (tmp_path / "r-ina.json").is_file() and (tmp_path / "r-ring.json").is_file()


def test_bad_input_exits_2(tmp_path: Path) -> None:
    assert_one_line_error(run("replay", str(tmp_path / "none.json")), "no such file")
    assert_one_line_error(run("replay", "mlp", "--fabric", "token-ring"), "--fabric 'token-ring'")
    assert_one_line_error(run("replay", "mlp", "--bandwidth", "fast"), "--bandwidth 'fast'")
    assert_one_line_error(run("replay", "mlp", "--workers", "0"), "--workers must be in 1..65535")
    assert_one_line_error(run("replay", "mlp", "--loss", "1.5"), "--loss 1.5", "[0, 1)")
    assert_one_line_error(run("replay", "mlp", "--tdf", "fast"), "--tdf 'fast': give a number or auto")
    assert_one_line_error(run("replay", "mlp", "--clock", "sync", "--tdf", "2"), "--tdf paces the wall clock")
    assert_one_line_error(run("replay", "mlp", "--fabric", "bmv2", "--workers", "33"), "up to 32 workers")
    assert_one_line_error(run("replay", "mlp", "--straggler", "slow"), "--straggler 'slow'")
    assert_one_line_error(run("replay", "mlp", "--straggler", "9:2", "--workers", "4"), "not in 0..3")
    assert_one_line_error(run("replay", "mlp", "--fabric", "ps", "--workers", "65535"), "analytic estimate",
                          "GB, more than half")
    # bounds: overflow and absurd values are refused with one line, never a traceback
    assert_one_line_error(run("replay", "mlp", "--latency", "1e400us"), "--latency '1e400us'", "at most a day")
    assert_one_line_error(run("replay", "mlp", "--bandwidth", "1e400"), "--bandwidth", "1kbps to 100Tbps")
    assert_one_line_error(run("replay", "mlp", "--loss", "1e400"), "--loss inf", "[0, 1)")
    assert_one_line_error(run("replay", "mlp", "--timeout", "inf"), "--timeout must be positive")
    assert_one_line_error(run("replay", "mlp", "--iters", "99999999999"), "--iters must be in 1..")
    assert_one_line_error(run("replay", "mlp", "--seed", "-1"), "--seed must be in")
    # click's own parse errors: one line too
    assert_one_line_error(run("replay", "mlp", "--workers", "abc"), "--workers 'abc': give a number of workers")
    assert_one_line_error(run("replay", "mlp", "--report", str(tmp_path)), "is a directory")
    assert_one_line_error(run("replay", "mlp", "--no-such-option"), "No such option")
    # an output path that cannot be written is found before the run, not after it
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(run("replay", "mlp", "--report", str(blocker / "r.json")), "is not a folder")
    assert_one_line_error(run("replay", "mlp", "--chrome-trace", str(blocker / "c.json")), "is not a folder")


@pytest.mark.parametrize("fabric, saw", [("ring", "a packet of a point-to-point segment on link"),
                                        ("ina", "packet on slot")])
def test_no_progress_stops_with_a_clear_line(no_children, fabric: str, saw: str) -> None:
    """At 99% loss a packet is lost again and again: the replay stops once one was resent 48 times
    in a row (emulated events, not the 30-minute wall-clock timeout), as a failed run that says
    what it saw and how likely loss alone makes it."""
    result = run("replay", "mlp", "--workers", "2", "--iters", "1", "--fabric", fabric, "--loss", "0.99",
                 "--payload-scale", "1", "--slots", "64")
    assert_one_line_error(result, "no progress: ", saw, "times in a row", "with probability", "--loss 0.99", code=1)


def test_full_disk_keeps_the_old_report(tmp_path: Path, no_children) -> None:
    """A report that does not fit is not half-written, and the one already there is kept."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        old = disk / "r.json"
        old.write_text('{"old": true}')
        filler = disk / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:  # fill the disk to the last block
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        # one block left: the check before the run passes (a full disk is refused there,
        # tests/test_files.py), the report does not fit
        os.truncate(filler, filler.stat().st_size - 4096)
        result = run("replay", "mlp", "--workers", "2", "--iters", "8", "--payload-scale", "64",  # > 4 KB
                     "--report", str(old))
        assert_one_line_error(result, "cannot write the report", "the file was left as it was", code=1)
        assert old.read_text() == '{"old": true}'
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "r.json"]  # no temporary file left
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def _replay_process(tmp_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "emu", "replay", "transformer", "--workers", "4",
                             "--iters", "500", "--payload-scale", "64", "--processes", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            env={**os.environ, "NO_COLOR": "1"})


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[1] == str(pid) and stat[0] != "Z":
                out.append(int(entry.name))
    return out


def _wait_children(pid: int, n: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = _children_of(pid)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError("the replay did not start its processes")


def _alive(pids: list[int]) -> list[int]:
    out = []
    for k in pids:
        try:
            state = Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(k)
    return out


def _socket_folders(pids: list[int]) -> set[str]:
    """The private folders of the replay's Unix sockets, from the processes' open files (their socket
    inodes, looked up in the namespace's table, which lists every other process's sockets too)."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = str(fd.readlink())
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {str(Path(f[-1]).parent) for f in (line.split() for line in lines)
            if len(f) >= 8 and f[6] in inodes and "emu-replay-" in f[-1]}


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the whole process group: the children ignore it and the parent
    stops them, so one line is printed."""
    proc = subprocess.Popen([sys.executable, "-m", "emu", "replay", "transformer", "--workers", "4", "--iters", "500",
                             "--payload-scale", "64", "--processes", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
                            start_new_session=True, preexec_fn=as_in_a_terminal)
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines() == ["emu: interrupted"]  # no child tracebacks
    time.sleep(0.2)
    assert not [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1][:3]]


def _switch_of(kids: list[int]) -> int:
    """The child that bound the replay's switch socket (the hosts only connect to it)."""
    bound = {}
    for pid in kids:
        for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) == 8 and fields[-1].endswith("/switch"):
                bound[fields[6]] = fields[-1]
    for pid in kids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd)[8:-1] in bound:
                    return pid
    raise AssertionError("no child holds the switch socket")


@pytest.mark.parametrize("victim", ["host", pytest.param("switch", marks=pytest.mark.slow)])
def test_dead_process_is_reported_and_the_rest_stopped(tmp_path: Path, victim: str) -> None:
    proc = _replay_process(tmp_path)
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        switch = _switch_of(kids)
        os.kill(switch if victim == "switch" else next(k for k in kids if k != switch), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1  # a run that failed, not bad input
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, err
    assert lines[-1].startswith("emu: error: the replay process emu-") and "died" in lines[-1]
    assert ("emu-switch" in lines[-1]) == (victim == "switch")
    # its own children (the switch and the hosts, which start no processes of their own), not every
    # process of that command line: another test's replay may run beside it under pytest-xdist
    deadline = time.monotonic() + 10
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(kids) == []


def test_sigterm_is_a_clean_stop(tmp_path: Path) -> None:
    """SIGTERM stops like Ctrl-C: children stopped, sockets removed, the partial report written;
    beside a complete report of an earlier run, not over it (issue 37)."""
    from click.testing import CliRunner

    from emu.cli import cli

    done = CliRunner().invoke(cli, ["replay", "mlp", "--workers", "2", "--iters", "1", "--report", str(tmp_path / "r.json")])
    assert done.exit_code == 0, done.output
    good = (tmp_path / "r.json").read_text()
    proc = _replay_process(tmp_path, "--report", str(tmp_path / "r.json"))
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        folders = _socket_folders(kids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert err.decode().strip().splitlines()[-1] == "emu: terminated"
    time.sleep(0.2)
    assert _alive(kids) == []
    assert folders and not [f for f in folders if Path(f).exists()]
    assert (tmp_path / "r.json").read_text() == good  # the earlier complete report kept whole
    assert f"wrote {tmp_path / 'r.json.partial'} (partial: complete is false); kept the complete report" in err.decode()
    doc = json.loads((tmp_path / "r.json.partial").read_text())
    assert doc["complete"] is False and doc["reason"] == "terminated"
    assert doc["verification"]["elements_checked"] > 0 and doc["fabric"]["packets"] > 0


def test_sigkill_of_the_parent_leaves_no_orphan(tmp_path: Path) -> None:
    """Nothing can catch SIGKILL: the children get their parent-death signal and go, and the last
    one out removes the socket folder."""
    proc = _replay_process(tmp_path)
    try:
        kids = _wait_children(proc.pid, 3)
        deadline = time.monotonic() + 30  # the children bind their sockets once started: later on a busy machine
        while not (folders := _socket_folders(kids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert folders, "the replay's sockets were not found"
        proc.kill()
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(kids) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
    assert _alive(kids) == []
    assert not [f for f in folders if Path(f).exists()]


def test_sockets_are_private(tmp_path: Path) -> None:
    """A running replay listens on no network port: its sockets are Unix sockets in a folder only
    its user can enter."""
    proc = _replay_process(tmp_path)
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        pids = [proc.pid, *kids]
        inodes = set()
        for pid in pids:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        listening = []
        for table in ("tcp", "tcp6", "udp", "udp6"):
            for line in Path(f"/proc/{proc.pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    listening.append((table, fields[1]))
        folders = _socket_folders(pids)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert listening == []
    assert folders and all(Path(f).stat().st_mode & 0o077 == 0 for f in folders if Path(f).exists())


def test_concurrent_replays_do_not_collide(tmp_path: Path) -> None:
    """No port to be already in use: each replay's sockets live in its own private folder, so two at
    once both finish, with the same (exact) results. Given one --report, it holds one of the two
    reports whole (the last to finish; each is written to a file of its own and renamed)."""
    cmd = [sys.executable, "-m", "emu", "replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64",
           "--json", "--report", "r.json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    docs = [json.loads(out) for out, _ in outs]
    assert docs[0]["iterations"] == docs[1]["iterations"] and docs[0]["verification"]["ok"]
    assert json.loads((tmp_path / "r.json").read_text()) in docs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.slow
def test_mesh_on_the_command_line_and_in_a_design(tmp_path: Path, no_children) -> None:
    """--mesh lays out a sharded or split trace and sets the workers; a design's [parallelism] mesh
    does the same; the report says what was laid out (docs/parallelism.md)."""
    report = tmp_path / "r.json"
    result = run("replay", "tp", "--mesh", "dp=4,tp=2", "--fabric", "ring", "--iters", "1", "--report", str(report))
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    assert doc["config"]["workers"] == 8 and doc["parallelism"]["mesh"] == "dp=4,tp=2"
    assert doc["parallelism"]["accounted"] is True and doc["config"]["design"]["parallelism"] == {"mesh": "dp=4,tp=2"}
    design = tmp_path / "d.toml"
    design.write_text('fabric = "ring"\n[parallelism]\nmesh = "dp=3,tp=2"\n')
    result = run("replay", "tp", "--network", str(design), "--iters", "1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["workers"] == 6
    for args, words in [(["--mesh", "dp=4,tp=2", "--workers", "6"], "--mesh dp=4,tp=2 is 8 workers but --workers is 6"),
                        (["--mesh", "dp=4,tp=3"], "dimension tp (tp) splits the model and keeps its size 2"),
                        (["--mesh", "dp=4"], "the trace's mesh is dp=2,tp=2; give its dimensions"),
                        (["--mesh", "dp:4"], "give the mesh as NAME=SIZE pairs")]:
        result = run("replay", "tp", "--fabric", "ring", "--iters", "1", *args)
        assert result.exit_code == 2, result.output
        assert_one_line_error(result, words)
    result = run("replay", "mlp", "--mesh", "dp=4", "--iters", "1")
    assert result.exit_code == 2 and "records no mesh" in result.output


def test_a_mixture_of_experts_at_a_new_size(no_children) -> None:
    """--mesh grows the moe sample's ep and adds replicas, --moe-imbalance sets its routing (the
    report keeps it), and an oversubscription no spine can act on is warned about (docs/moe.md)."""
    result = run("replay", "moe", "--mesh", "dp=2,ep=8", "--moe-imbalance", "2", "--fabric", "ring", "--iters", "1",
                 "--workers-per-node", "8", "--oversubscription", "4", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["config"]["design"]["parallelism"] == {"mesh": "dp=2,ep=8", "moe_imbalance": 2.0}
    assert doc["verification"]["ok"] and any("--moe-imbalance 2" in n for n in doc["parallelism"]["notes"])
    assert "warning: oversubscription 4:1 slows the links from leaves to the spine, but the 16 workers' 2 NICs all " \
           "sit in one leaf of 32 ports: it changes nothing; give --leaf-ports 1 to split them over two leaves" \
           in " ".join(result.stderr.split())
    for args, words in [(["--moe-imbalance", "0.5"], "--moe-imbalance 0.5: give the largest split over the mean"),
                        (["--workers", "64"], "lay it out with --mesh dp=D,ep=4")]:
        result = run("replay", "moe", "--iters", "1", *args)
        assert result.exit_code == 2, result.output
        assert_one_line_error(result, words)


def test_a_coarse_payload_scale_says_which_segments_carried_no_data(tmp_path: Path, no_children) -> None:
    # at 2^22 the mlp's buckets are 2 and 1 real elements: most of a 4-worker ring's chunks are empty
    report = tmp_path / "r.json"
    coarse = run("replay", "mlp", "--workers", "4", "--fabric", "ring", "--iters", "1", "--payload-scale",
                 str(1 << 22), "--report", str(report))
    assert coarse.exit_code == 0, coarse.output
    v = json.loads(report.read_text())["verification"]
    assert v["ok"] and 0 < v["segments_without_data"] < v["segments"]
    assert f"{v['segments_without_data']:,} segments empty" in coarse.stdout
    assert "carried no real element at payload scale 4194304" in coarse.stderr
    fine = run("replay", "mlp", "--workers", "4", "--fabric", "ring", "--iters", "1", "--payload-scale", "64",
               "--report", str(report))
    v = json.loads(report.read_text())["verification"]
    assert fine.exit_code == 0 and v["segments"] > 0 and v["segments_without_data"] == 0
    assert "segments empty" not in fine.stdout and "no real element" not in fine.stderr


def test_the_progress_line_counts_the_workers_a_mesh_sets() -> None:
    """--mesh dp=8,tp=2 replays 16 workers: the progress line says x16, not --workers' default 8 (issue 37)."""
    from click.testing import CliRunner

    from emu.cli import cli

    result = CliRunner().invoke(cli, ["replay", "tp", "--mesh", "dp=8,tp=2", "--iters", "1", "--fabric", "ring"])
    assert result.exit_code == 0, result.output
    assert "ring x16" in result.stderr and "x8" not in result.stderr


def test_a_complete_report_supersedes_an_earlier_partial_one(tmp_path: Path, no_children) -> None:
    """The partial report a failed run left beside a complete one goes when the next run writes
    its complete report there (it stayed, older than the report it stood beside)."""
    report = tmp_path / "r.json"
    (tmp_path / "r.json.partial").write_text('{"complete": false}')
    result = run("replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64", "--report", str(report))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
