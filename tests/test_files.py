"""Files written whole or not at all, and full disks named as such (emu/files.py; issue 37).

The disks are real: a small tmpfs, filled to its last block or its last inode (a full disk that
still lets a folder be made is not the case a user meets on ext4). Mounting needs root; those
tests say so and skip elsewhere."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.errors import RunFailed
from emu.files import write_together
from tests.cli.test_cli_errors import assert_one_line_error


def run(*args: str):
    return CliRunner(env={"NO_COLOR": "1"}).invoke(cli, list(args))


@contextlib.contextmanager
def small_disk(tmp_path: Path, options: str) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a full disk is a small tmpfs, which needs root to mount")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Fill the disk's blocks, then free ``leave_bytes`` of them."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    if leave_bytes:
        os.truncate(filler, max(0, filler.stat().st_size - leave_bytes))


def test_a_set_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """A failure on the second of three files leaves the old three as they were, no fragment."""
    files = [tmp_path / f"t.{r}.et" for r in range(3)]
    write_together([(p, b"old") for p in files], "the set")

    def full(f) -> None:
        f.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(RunFailed) as info:
        write_together([(files[0], b"new"), (files[1], full), (files[2], b"new")], "the set")
    assert str(info.value).startswith(f"{files[1]}: cannot write the set (No space left on device)")
    assert info.value.exit_code == 1
    assert [p.read_bytes() for p in files] == [b"old"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in files]
    files[0].chmod(0o600)  # a replaced file keeps its mode
    write_together([(p, b"new") for p in files], "the set")
    assert files[0].stat().st_mode & 0o777 == 0o600 and [p.read_bytes() for p in files] == [b"new"] * 3


def test_an_export_on_a_full_disk_keeps_the_old_set(tmp_path: Path) -> None:
    """`emu export` over an earlier export on a nearly full disk: exit 1 naming the full disk, and
    every earlier file as it was (it left three new ranks beside five old ones)."""
    with small_disk(tmp_path, "size=1m") as disk:
        out = disk / "out"
        assert run("export", "mlp", "--chakra", str(out), "--workers", "8").exit_code == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        fill(disk, leave_bytes=16 * 1024)
        result = run("export", "transformer", "--chakra", str(out), "--workers", "8", "--name", "mlp")
        assert_one_line_error(result, "No space left on device", "left as they were", code=1)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_full_disk_is_refused_before_the_work(tmp_path: Path) -> None:
    """A report on a disk with no block left: said before the replay runs (an empty trial file
    fits on a full disk, so the check looked fine and the replay ran to fail at its end), exit 1."""
    with small_disk(tmp_path, "size=64k") as disk:
        fill(disk)
        result = run("replay", "mlp", "--workers", "2", "--iters", "1", "--report", str(disk / "r.json"))
        assert_one_line_error(result, "--report", "No space left on device", "free space", code=1)
        assert "iteration" not in result.stdout  # nothing ran


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """A disk out of inodes refuses a new folder where a file's trial passed: `emu sweep --out`
    into it was a Python traceback; now one line naming the folder and the full disk, exit 1."""
    with small_disk(tmp_path, "size=1m,nr_inodes=16") as disk:
        with contextlib.suppress(OSError):
            for i in range(64):
                (disk / f"f{i}").touch()
        (disk / "f0").unlink()  # room for the trial file, none for a folder and its file
        result = run("sweep", "mlp", "--workers", "8", "--iters", "1", "--no-plots", "--no-predict",
                     "--out", str(disk / "study"))
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and "No space left on device" in result.stderr, result.stderr


# Every command that writes a file, its output on a disk with no block left: one line naming the
# full disk, exit 1, before the work (nothing printed: no result was made), the file already there
# kept whole, nothing left beside it (docs/reliability.md, "Every command").
EVERY_WRITER = {
    "replay --report": ["replay", "mlp", "--workers", "2", "--iters", "1", "--report", "{disk}/out.json"],
    "replay --chrome-trace": ["replay", "mlp", "--workers", "2", "--iters", "1", "--chrome-trace", "{disk}/out.json"],
    "capture -o": ["capture", "--model", "mlp", "-o", "{disk}/out.json"],
    "run --report": ["run", "--workers", "2", "--report", "{disk}/out.json", "--", "python", "examples/ddp_train.py"],
    "run --trace-out": ["run", "--workers", "2", "--trace-out", "{disk}/out.json", "--", "python",
                        "examples/ddp_train.py"],
    "sweep --out": ["sweep", "mlp", "--workers", "2", "--iters", "1", "--out", "{disk}"],
    "check --junit": ["check", "{reports}", "--baseline", "{reports}", "--junit", "{disk}/out.json"],
    "check --markdown": ["check", "{reports}", "--baseline", "{reports}", "--markdown", "{disk}/out.json"],
    "export --chakra": ["export", "mlp", "--chakra", "{disk}"],
    "validate --report": ["validate", "--quick", "--report", "{disk}/out.json"],
}


@pytest.mark.parametrize("writer", list(EVERY_WRITER))
def test_every_command_names_a_full_disk(tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # examples/ddp_train.py
    reports = tmp_path / "reports"
    if "{reports}" in EVERY_WRITER[writer]:
        assert run("replay", "mlp", "--workers", "2", "--iters", "1", "--report", str(reports / "mlp.json")).exit_code == 0
    with small_disk(tmp_path, "size=256k") as disk:
        old = disk / ("out.json" if "{disk}/" in " ".join(EVERY_WRITER[writer]) else "results.json")
        old.write_text('{"old": true}')
        fill(disk)
        args = [a.format(disk=disk, reports=reports) for a in EVERY_WRITER[writer]]
        result = run(*args)
        assert_one_line_error(result, str(disk), "No space left on device", code=1)
        assert result.stdout == "", "refused after the work (it printed its results), not before"
        assert old.read_text() == '{"old": true}'
        assert sorted(p.name for p in disk.iterdir()) == sorted(["filler", old.name])


def test_a_second_export_into_a_folder_being_written_is_refused(tmp_path: Path) -> None:
    """Two exports into one folder at once would mix their ranks' files: the one that comes second
    (another process, holding the folder's lock here) gets one line and exit 2, and writes nothing."""
    import fcntl
    import sys

    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".emu-export.lock", "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, "-m", "emu", "export", "mlp", "--chakra", str(out)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith("emu: error: --chakra") and "another emu export" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == [".emu-export.lock"]
