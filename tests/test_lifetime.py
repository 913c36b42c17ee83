"""emu.lifetime: a replay process knows when the process that started it is gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from emu import lifetime


def _grandchild(seen: Path, ready: int) -> None:
    """A replay process whose parent-death signal is lost: waits to find itself orphaned."""
    lifetime.as_child(os.getppid())
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the signal lost (its parent waits for ``ready``)
    alone = lifetime.orphaned()
    os.write(ready, b"1")  # its parent may go now
    deadline = time.monotonic() + 20
    while not lifetime.orphaned() and time.monotonic() < deadline:
        time.sleep(0.02)
    seen.write_text(f"{alone} {lifetime.orphaned()}")


def test_a_child_whose_death_signal_was_lost_finds_itself_orphaned(tmp_path: Path) -> None:
    """A forked child (``as_child``) whose parent died without the parent-death signal acting
    (ignored here, as a host that polled on after a SIGKILL of its orchestrator had it) still
    sees that its parent is gone: the loops' second line (``orphaned``, ``leave_if_orphaned``)."""
    seen = tmp_path / "orphaned"
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent to lose; neither fork returns to pytest, whatever happens
        try:
            if os.fork() == 0:
                try:
                    _grandchild(seen, write)
                finally:
                    os._exit(0)
            os.read(read, 1)  # the grandchild is a replay process now
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(middle, 0)
    deadline = time.monotonic() + 20
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.close(read)
    assert seen.read_text() == "False True"  # not orphaned while its parent ran, then orphaned
    assert not lifetime.orphaned()  # a process that is no replay child never is
