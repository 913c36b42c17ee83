"""emu sweep: a real small grid into a folder (tables, reports, plots), resume, retries, estimates."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.errors import RunFailed
from emu.study import sweep as sweep_mod
from emu.traces import sample_path

# mlp at payload scale 64: one iteration replays in about a second per point
FAST = ["--iters", "1", "--payload-scale", "64", "--bandwidth", "10Gbps"]


def run(*args: str):
    return CliRunner().invoke(cli, ["sweep", *args], catch_exceptions=False)


def rows(out: Path) -> list[dict]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("study")
    result = run("mlp", "--workers", "2,4", "--fabric", "ina,ring", *FAST, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_sweep_writes_tables_reports_and_plots(study: Path) -> None:
    table = rows(study)
    assert [(r["fabric"], r["workers"]) for r in table] == [("ina", "2"), ("ina", "4"), ("ring", "2"), ("ring", "4")]
    for r in table:
        assert r["status"] == "replayed" and r["verification_ok"] == "True" and r["trustworthy"] == "True"
        report = json.loads((study / r["report"]).read_text())
        assert report["summary"]["iteration_us_median"] == pytest.approx(float(r["iteration_us_median"]))
        assert report["config"]["workers"] == int(r["workers"]) and report["config"]["fabric"] == r["fabric"]
        assert float(r["predicted_us"]) > 0  # the closed form beside every replayed point
        assert float(r["predict_error"]) == pytest.approx(
            (float(r["predicted_us"]) - float(r["iteration_us_median"])) / float(r["iteration_us_median"]))
    by = {(r["fabric"], r["workers"]): float(r["iteration_us_median"]) for r in table}
    ina4 = next(r for r in table if r["fabric"] == "ina" and r["workers"] == "4")
    assert ina4["speedup_over"] == "ring"
    assert float(ina4["speedup"]) == pytest.approx(by[("ring", "4")] / by[("ina", "4")])
    assert float(ina4["scaling_efficiency"]) == pytest.approx(by[("ina", "2")] / by[("ina", "4")])
    doc = json.loads((study / "results.json").read_text())
    assert doc["results_version"] == 1 and len(doc["points"]) == 4
    for name in ("iteration", "speedup", "efficiency", "breakdown"):
        png = study / "plots" / f"mlp-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def _counted_replays(monkeypatch) -> list[str]:
    """The slugs of the points the sweep replays from now on (not resumes), in order."""
    calls: list[str] = []
    real = sweep_mod._replay_point

    def counted(replay, trace, point, *args):
        calls.append(point.slug)
        return real(replay, trace, point, *args)

    monkeypatch.setattr(sweep_mod, "_replay_point", counted)
    return calls


def test_sweep_resumes_finished_points(study: Path, monkeypatch) -> None:
    before = rows(study)
    victim = study / before[1]["report"]
    victim.unlink()
    calls = _counted_replays(monkeypatch)
    result = run("mlp", "--workers", "2,4", "--fabric", "ina,ring", *FAST, "--out", str(study))
    assert result.exit_code == 0, result.output
    assert calls == [victim.stem]  # only the missing point ran again
    after = rows(study)
    assert [r["iteration_us_median"] for r in after] == [r["iteration_us_median"] for r in before]
    assert "(resumed)" in result.output


@pytest.mark.parametrize("edit", ["empty summary", "median as text", "iterations without compute",
                                  "report_version 99", "report_version 5 (spans)"])
def test_a_bad_point_is_replayed_again_and_says_so(study: Path, monkeypatch, edit: str) -> None:
    """A point report edited or from elsewhere is read by the replay's own reader: never a traceback,
    never "(resumed)", replayed again with a line saying why (issue 37)."""
    before = rows(study)
    victim = study / before[0]["report"]
    doc = json.loads(victim.read_text())
    if edit == "empty summary":
        doc["summary"] = {}
    elif edit == "median as text":
        doc["summary"]["iteration_us_median"] = "fast"
    elif edit == "iterations without compute":
        for it in doc["iterations"]:
            it.pop("compute_us")
    elif edit == "report_version 99":
        doc["report_version"] = 99
    else:  # a whole report of the version before, whose iterations were spans
        doc["report_version"] = 5
        for it in doc["iterations"]:
            it.pop("span_us")
    victim.write_text(json.dumps(doc))
    calls = _counted_replays(monkeypatch)
    result = run("mlp", "--workers", "2,4", "--fabric", "ina,ring", *FAST, "--out", str(study))
    assert result.exit_code == 0, result.output
    assert calls == [victim.stem]
    assert f"{victim}" in result.output and "replaying the point again" in result.output
    if edit == "report_version 5 (spans)":
        assert "report_version 5, where this emu writes 6" in " ".join(result.output.split())
    assert [r["iteration_us_median"] for r in rows(study)] == [r["iteration_us_median"] for r in before]
    checked = CliRunner().invoke(cli, ["check", str(study / "points"), "--baseline", str(study / "points")])
    assert checked.exit_code == 0, checked.output  # and emu check reads the folder the sweep left


def test_point_past_the_limit_is_an_estimate_labelled_as_such(tmp_path: Path, monkeypatch) -> None:
    from emu.emulator import fabric

    monkeypatch.setattr(fabric, "available_memory_bytes", lambda: 3 * 2 * fabric.P2P_RING_BYTES_PER_WORKER)
    result = run("mlp", "--workers", "2,4", "--fabric", "ring", *FAST, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    table = rows(tmp_path)
    assert [r["status"] for r in table] == ["replayed", "estimate"]
    est = table[1]
    assert est["report"] == "" and "analytic estimate" in est["reason"]
    assert float(est["iteration_us_median"]) == pytest.approx(float(est["predicted_us"]))
    assert "estimate" in result.output
    assert not list((tmp_path / "points").glob("*w4*.json"))  # nothing pretends to be a replay


def test_crashed_point_is_retried_once_then_recorded_failed(tmp_path: Path, monkeypatch) -> None:
    import emu.replay

    attempts = []

    def crash(trace, config, **kw):
        attempts.append(config.workers)
        raise RunFailed("worker host 0 died (exit code -9)")

    monkeypatch.setattr(emu.replay, "replay", crash)
    result = run("mlp", "--workers", "2", *FAST, "--out", str(tmp_path))
    assert result.exit_code == 1
    assert attempts == [2, 2]
    (row,) = rows(tmp_path)
    assert row["status"] == "failed" and row["attempts"] == "2" and "died" in row["reason"]
    log = (tmp_path / row["log"]).read_text()
    assert log.count("died (exit code -9)") == 2 and "attempt 2" in log


@pytest.mark.slow
def test_flaky_point_succeeds_on_its_retry(tmp_path: Path, monkeypatch) -> None:
    import emu.replay

    real = emu.replay.replay
    attempts = []

    def flaky(trace, config, **kw):
        attempts.append(1)
        if len(attempts) == 1:
            raise RunFailed("the switch process died")
        return real(trace, config, **kw)

    monkeypatch.setattr(emu.replay, "replay", flaky)
    result = run("mlp", "--workers", "2", *FAST, "--out", str(tmp_path), "--no-plots")
    assert result.exit_code == 0, result.output
    (row,) = rows(tmp_path)
    assert row["status"] == "replayed" and row["attempts"] == "2"
    assert not list((tmp_path / "points").glob("*.log"))


@pytest.mark.slow
def test_interrupted_sweep_keeps_the_finished_points(tmp_path: Path, monkeypatch) -> None:
    import emu.replay

    real = emu.replay.replay
    done = []

    def interrupted(trace, config, **kw):
        if done:
            raise KeyboardInterrupt
        done.append(1)
        return real(trace, config, **kw)

    monkeypatch.setattr(emu.replay, "replay", interrupted)
    result = CliRunner().invoke(cli, ["sweep", "mlp", "--workers", "2,4", *FAST, "--out", str(tmp_path)])
    assert result.exit_code == 130
    (row,) = rows(tmp_path)
    assert row["workers"] == "2" and row["status"] == "replayed"


@pytest.mark.slow
def test_design_files_are_an_axis_and_typed_flags_win(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text('name = "fast"\nfabric = "ina"\n[link]\nbandwidth = "100Gbps"\n')
    b = tmp_path / "b.toml"
    b.write_text('name = "slow-ring"\nfabric = "ring"\n[link]\nbandwidth = "10Gbps"\nlatency = "20us"\n')
    out = tmp_path / "out"
    result = run("mlp", "--network", str(a), "--network", str(b), "--workers", "2", "--latency", "1us",
                 "--iters", "1", "--payload-scale", "64", "--out", str(out), "--no-plots")
    assert result.exit_code == 0, result.output
    table = rows(out)
    assert [(r["design"], r["fabric"], float(r["bandwidth_bps"]), float(r["latency_us"])) for r in table] == [
        ("fast", "ina", 100e9, 1.0), ("slow-ring", "ring", 10e9, 1.0)]
    design = json.loads((out / table[1]["report"]).read_text())["config"]["design"]
    assert design["file"] == str(b) and design["name"] == "slow-ring" and design["link"]["latency_us"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--workers", "8,,64"], "--workers"),
    (["--workers", "8,x"], "not a whole number"),
    (["--fabric", "ina,nope"], "nope"),
    (["--loss", "0,2"], "--loss"),
    (["--bandwidth", "10Gbps,fast"], "fast"),
])
def test_bad_grid_is_refused_before_anything_runs(tmp_path: Path, args: list[str], message: str) -> None:
    result = run("mlp", *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sweep_of_two_traces_labels_them(tmp_path: Path) -> None:
    result = run("mlp", str(sample_path("cnn")), "--workers", "2", "--iters", "1", "--payload-scale", "64",
                 "--out", str(tmp_path), "--no-plots", "--no-predict")
    assert result.exit_code == 0, result.output
    assert [r["trace"] for r in rows(tmp_path)] == ["mlp", "cnn"]


def test_changed_trace_content_is_replayed_again(tmp_path: Path) -> None:
    import shutil

    trace = tmp_path / "t" / "job.json.gz"
    trace.parent.mkdir()
    shutil.copy(sample_path("mlp"), trace)
    out = tmp_path / "out"
    args = [str(trace), "--workers", "2", "--iters", "1", "--payload-scale", "64", "--out", str(out), "--no-plots"]
    assert run(*args).exit_code == 0
    first = rows(out)[0]
    shutil.copy(sample_path("cnn"), trace)  # same path, other content
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "(resumed)" not in result.output
    second = rows(out)[0]
    assert second["iteration_us_median"] != first["iteration_us_median"]
    report = json.loads((out / second["report"]).read_text())
    assert report["trace"]["model"] == "cnn"


def test_missing_second_trace_is_refused_before_the_first_runs(tmp_path: Path, monkeypatch) -> None:
    import emu.replay

    monkeypatch.setattr(emu.replay, "replay", lambda *a, **k: pytest.fail("a replay ran"))
    result = run("mlp", str(tmp_path / "absent.json"), "--workers", "2", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "absent.json" in result.output


@pytest.mark.slow
def test_stragglers_are_an_axis(tmp_path: Path) -> None:
    result = run("mlp", "--workers", "2", "--straggler", "0:2", "--straggler", "random:0.5:1.5", *FAST,
                 "--out", str(tmp_path), "--no-plots")
    assert result.exit_code == 0, result.output
    table = rows(tmp_path)
    assert [r["stragglers"] for r in table] == ["0:2.0", "random:0.5:1.5"]
    for r in table:
        report = json.loads((tmp_path / r["report"]).read_text())
        assert report["config"]["stragglers"] == [r["stragglers"]]


@pytest.mark.slow
def test_designs_of_one_name_in_two_folders_stay_apart(tmp_path: Path) -> None:
    paths = []
    for folder, bw in (("a", "10Gbps"), ("b", "100Gbps")):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "net.toml"
        path.write_text(f'fabric = "ina"\n[link]\nbandwidth = "{bw}"\n')
        paths.append(path)
    result = run("mlp", "--network", str(paths[0]), "--network", str(paths[1]), "--network", str(paths[0]),
                 "--workers", "2", "--iters", "1", "--payload-scale", "64", "--out", str(tmp_path / "out"),
                 "--no-plots")
    assert result.exit_code == 0, result.output
    table = rows(tmp_path / "out")
    assert [r["design"] for r in table] == ["a-net", "b-net"]  # the repeated file is one point
    assert float(table[0]["bandwidth_bps"]) == 10e9 and float(table[1]["bandwidth_bps"]) == 100e9


@pytest.mark.slow
def test_unverified_report_is_not_resumed(study: Path) -> None:
    table = rows(study)
    path = study / table[0]["report"]
    doc = json.loads(path.read_text())
    doc["verification"]["ok"] = False
    path.write_text(json.dumps(doc))
    result = run("mlp", "--workers", "2,4", "--fabric", "ina,ring", *FAST, "--out", str(study), "--no-plots")
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text())["verification"]["ok"] is True  # replayed again


def test_sigterm_mid_sweep_stops_every_process_and_keeps_whole_tables(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from tests.cli.test_replay_cli import _alive, _children_of

    out = tmp_path / "out"
    # points of a few seconds each: replays up to ONE_PROCESS_WORKERS run in the sweep's own process,
    # so the second point is caught mid-replay by time, or by its host processes where it has them
    proc = subprocess.Popen([sys.executable, "-m", "emu", "sweep", "mlp", "--workers", "2,3,4,5", "--fabric", "ring",
                             "--bandwidth", "1Gbps", "--iters", "4", "--out", str(out), "--no-plots"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 120
        while not (out / "results.csv").exists() and time.monotonic() < deadline:  # the first point is done
            time.sleep(0.1)
        kids: list[int] = []
        started = time.monotonic()
        while not kids and time.monotonic() < min(deadline, started + 1.0):  # the second point is running
            kids = _children_of(proc.pid)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    time.sleep(0.2)
    assert _alive(kids) == []
    assert not list(tmp_path.glob("emu-replay-*"))
    table = rows(out)
    assert table and all(r["status"] == "replayed" for r in table)
    assert json.loads((out / "results.json").read_text())["points"][0]["workers"] == 2


def test_a_second_sweep_into_the_same_folder_is_refused(tmp_path: Path) -> None:
    """Two sweeps sharing --out would each write results.csv with their own points (issue 37): while
    one holds the folder (another process here), the second gets one line and exit 2."""
    import subprocess
    import sys
    import time

    from emu.study.sweep import LOCK_NAME

    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+b'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)"), str(tmp_path / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = CliRunner().invoke(cli, ["sweep", "mlp", "--workers", "2", "--fabric", "ring", *FAST, "--no-plots",
                                          "--out", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert "another emu sweep is writing this folder now" in result.stderr
        assert not (tmp_path / "results.csv").exists()
    finally:
        holder.kill()
        holder.wait(10)
    time.sleep(0.1)  # the holder gone, the kernel released its lock: the folder is free again
    assert run("mlp", "--workers", "2", "--fabric", "ring", *FAST, "--no-plots", "--out", str(tmp_path)).exit_code == 0


def test_plots_that_cannot_be_written_leave_the_tables_shown(study: Path, monkeypatch) -> None:
    """The plots are written last, under the folder's lock; where they cannot be (a full disk),
    the table is still printed and the tables kept, then one line and exit 1."""
    from emu.study import plots

    def full(out, rows):
        raise RunFailed(f"{out / 'plots' / 'mlp-iteration.png'}: cannot write the plots (No space left on device)")

    monkeypatch.setattr(plots, "write_plots", full)
    result = CliRunner().invoke(cli, ["sweep", "mlp", "--workers", "2,4", "--fabric", "ina,ring", *FAST,
                                      "--out", str(study)])
    assert result.exit_code == 1, result.output
    assert "ina" in result.stdout and "(resumed)" in result.stderr  # the table, of the finished points
    assert result.stderr.strip().splitlines()[-1].startswith(
        "emu: error: the tables were written; the plots were not: ") and "No space left" in result.stderr
    assert len(rows(study)) == 4
