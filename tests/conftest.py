"""Shared fixtures: the checked-in real traces and process-leak checks."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
A100 = DATA / "a100-ddp-nccl-world2" / "rank0.json.gz"
GLOO_MLP = DATA / "gloo-ddp-mlp-world2"
GLOO_COLLECTIVES = DATA / "gloo-collectives-world2"
GLOO_SPARSE = DATA / "gloo-sparse-embedding-world2"
GLOO_ALLTOALLV = DATA / "gloo-alltoallv-world2"


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains text."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def no_leftovers(tmp_path: Path):
    """A work folder; after the test, no process may still name it."""
    yield tmp_path
    assert processes_mentioning(str(tmp_path)) == [], "processes were left running"


def children() -> list[int]:
    """Live (non-zombie) processes whose parent is this test process."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[1] == me and stat[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def no_children():
    """After the test, every process the replay forked is gone."""
    yield
    deadline = time.monotonic() + 5
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    multiprocessing.active_children()  # reaps
    assert children() == [], "replay left child processes behind"


def as_in_a_terminal() -> None:
    """``preexec_fn`` of a child a test sends Ctrl-C: SIGINT back to its default, as a foreground
    process in a terminal has it. A test runner started in the background (``cmd &`` in a
    non-interactive shell, ``nohup``) ignores SIGINT and SIGQUIT, and every process it starts
    inherits that: Ctrl-C would never reach emu (found 2026-12-04: the Ctrl-C tests hung 30 s
    under `.ci/run &`, on every commit)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
