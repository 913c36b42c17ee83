"""``emu replay`` on the command line: report contract, exit codes, Ctrl-C and crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from emu.cli import cli
from tests.cli.test_cli_errors import assert_one_line_error
from tests.conftest import processes_mentioning

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
    assert_one_line_error(run("replay", "mlp", "--loss", "1.5"), "--loss must be in [0, 1)")
    assert_one_line_error(run("replay", "mlp", "--tdf", "fast"), "--tdf 'fast': give a number or auto")
    assert_one_line_error(run("replay", "mlp", "--clock", "sync", "--tdf", "2"), "--tdf paces the wall clock")
    assert_one_line_error(run("replay", "mlp", "--clock", "sync", "--fabric", "bmv2"), "use --clock wall")
    assert_one_line_error(run("replay", "mlp", "--straggler", "slow"), "--straggler 'slow'")
    assert_one_line_error(run("replay", "mlp", "--straggler", "9:2", "--workers", "4"), "not in 0..3")
    assert_one_line_error(run("replay", "mlp", "--fabric", "ring", "--workers", "600"), "analytic estimate")


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


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc = _replay_process(tmp_path)
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    time.sleep(0.2)
    assert not [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1][:3]]


def test_dead_process_is_reported_and_the_rest_stopped(tmp_path: Path) -> None:
    proc = _replay_process(tmp_path)
    try:
        kids = _wait_children(proc.pid, 3)
        time.sleep(0.5)
        os.kill(kids[-1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("emu: error: the replay process emu-") and "died" in lines[-1]
    time.sleep(0.2)
    assert processes_mentioning("emu replay transformer") == []
