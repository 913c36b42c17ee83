"""emu run's recorded trace and payload written as a pair (issue 37: a full disk left a new trace
without its payload and no report)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from emu.errors import RunFailed
from emu.run.session import payload_path, save_recorded
from emu.traces import load_trace, sample_path


def test_the_pair_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    trace = load_trace(sample_path("mlp"))
    out = tmp_path / "live.json.gz"
    assert save_recorded(trace, out, lambda f: f.write(b"old payload")) == payload_path(out)
    before = (out.read_bytes(), payload_path(out).read_bytes())

    def full(f) -> None:
        f.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(RunFailed) as info:
        save_recorded(load_trace(sample_path("cnn")), out, full)
    assert str(info.value) == (f"{payload_path(out)}: cannot write the recorded trace and its payload (No space left "
                               "on device); "
                               "the files there were left as they were: free space or pick another --trace-out")
    assert info.value.exit_code == 1
    assert (out.read_bytes(), payload_path(out).read_bytes()) == before  # the old pair, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json.gz", "live.payload.npz"]  # no fragment
    assert save_recorded(trace, tmp_path / "t.json", None) is None and load_trace(tmp_path / "t.json") == trace


def test_sigterm_mid_run_stops_the_ranks_and_keeps_the_old_pair(tmp_path: Path) -> None:
    """`emu run` terminated while its real ranks train: exit 143, no rank left, and the trace and
    payload an earlier run wrote to --trace-out stay as they were (docs/reliability.md)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import processes_mentioning

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "live.json.gz"
    out.write_bytes(b"old trace")
    payload_path(out).write_bytes(b"old payload")
    script = tmp_path / "train.py"  # the shipped example under a name only this test's ranks have
    script.write_text((root / "examples" / "ddp_train.py").read_text())
    proc = subprocess.Popen([sys.executable, "-m", "emu", "run", "--workers", "4", "--trace-out", str(out), "--",
                             "python", str(script), "--steps", "400"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + 60
        while len(processes_mentioning(str(script))) < 2 and time.monotonic() < deadline:  # emu and a rank
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err.decode()[-2000:]
    deadline = time.monotonic() + 10
    while processes_mentioning(str(script)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(script)) == []
    assert (out.read_bytes(), payload_path(out).read_bytes()) == (b"old trace", b"old payload")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json.gz", "live.payload.npz", "train.py"]
