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
    assert str(info.value) == (f"{out}: cannot write the recorded trace and its payload (No space left on device); "
                               "the files there were left as they were: free space or pick another --trace-out")
    assert info.value.exit_code == 1
    assert (out.read_bytes(), payload_path(out).read_bytes()) == before  # the old pair, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json.gz", "live.payload.npz"]  # no fragment
    assert save_recorded(trace, tmp_path / "t.json", None) is None and load_trace(tmp_path / "t.json") == trace
