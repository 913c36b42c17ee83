"""``emu clean``: what a run killed with SIGKILL left, found by its record, removed; nothing else."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.lifetime import RunRecord, runtime_dir, start_time


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    return runtime_dir()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_clean_removes_what_a_dead_run_left(tmp_path: Path, runtime: Path) -> None:
    orphan = subprocess.Popen(["sleep", "60"])
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        folder = tmp_path / "emu-replay-x"
        folder.mkdir()
        (folder / "switch").write_text("")
        rec = RunRecord("emu replay", pid=_dead_pid(), started=1,
                        children=[[orphan.pid, start_time(orphan.pid) or 0],
                                  [stranger.pid, 12345]],  # the pid now names another process
                        folders=[str(folder)])
        rec.save()
        dry = CliRunner().invoke(cli, ["clean", "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert f"would remove process {orphan.pid}" in dry.stdout and folder.exists()
        result = CliRunner().invoke(cli, ["clean"])
        assert result.exit_code == 0, result.output
        assert f"removed process {orphan.pid}" in result.stdout and f"removed folder {folder}" in result.stdout
        assert orphan.wait(timeout=10) == -9
        assert not folder.exists()
        assert stranger.poll() is None  # not named by its start time: never touched
        assert not rec.path.exists()
    finally:
        orphan.kill()
        stranger.kill()


def test_clean_leaves_live_runs_alone(tmp_path: Path, runtime: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    running = subprocess.Popen(["sleep", "60"])  # stands for an emu run still in progress
    try:
        rec = RunRecord("emu replay", pid=running.pid, folders=[str(folder)])
        rec.save()
        result = CliRunner().invoke(cli, ["clean"])
        assert result.exit_code == 0 and folder.exists() and rec.path.exists()
        assert json.loads(rec.path.read_text())["pid"] == running.pid
    finally:
        running.kill()


def test_clean_touches_only_what_emu_names(tmp_path: Path, runtime: Path) -> None:
    """A record naming something that is not emu's (a folder not called emu-*) is not obeyed."""
    precious = tmp_path / "precious"
    precious.mkdir()
    RunRecord("emu replay", pid=_dead_pid(), started=1, folders=[str(precious)]).save()
    result = CliRunner().invoke(cli, ["clean"])
    assert result.exit_code == 0 and precious.exists()


def test_records_live_only_in_a_private_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "shared"
    base.mkdir()
    mine = base / f"emu-{os.getuid()}"
    mine.mkdir()
    os.chmod(mine, 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    assert runtime_dir() == mine / "runs" and mine.stat().st_mode & 0o777 == 0o700  # ours: closed
    mine.rename(base / "elsewhere")
    mine.symlink_to(base / "elsewhere")  # as another user could have planted it
    with pytest.raises(OSError, match="not a private folder"):
        runtime_dir()
    result = CliRunner().invoke(cli, ["clean"])
    assert result.exit_code == 2 and "not a private folder" in result.stderr
