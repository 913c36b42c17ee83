"""The replay's processes as children: forked, dying with the process that started them, recorded
for ``emu clean``, and stopped on every path (``emu.replay.control.processes`` on machine 0 and on one
machine, ``emu.replay.machines.remote`` on the others of a replay spread over several)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
import traceback
from collections.abc import Callable
from typing import Any

from emu import lifetime


def _in_child(target: Callable[[Any], None], parent: int, workdir: str, setup: Any) -> None:
    """A replay process: dies with the orchestrator, leaves Ctrl-C to it, and if the orchestrator
    was killed, removes the private socket folder on its way out."""
    lifetime.as_child(parent)
    failed = False
    try:
        target(setup)
    except Exception:
        # the process reported its failure on the control socket; the orchestrator prints it
        failed = True
        if os.environ.get("EMU_DEBUG") == "1":
            traceback.print_exc()
    finally:
        if not lifetime.parent_alive(parent):
            shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        os._exit(1)  # without multiprocessing's traceback


def start_processes(parts: list[tuple[Callable[[Any], None], Any, str]], workdir: str,
                    procs: list[multiprocessing.process.BaseProcess]) -> None:
    """Fork each (target, setup, name) as a replay process (``_in_child``) into ``procs``, each
    recorded for ``emu clean``; ``procs`` holds every one started even if a later start fails."""
    fork = multiprocessing.get_context("fork")
    parent = os.getpid()
    record = lifetime.current()
    with lifetime.signals_held():
        for target, setup, name in parts:
            p = fork.Process(target=_in_child, args=(target, parent, workdir, setup), name=name, daemon=True)
            procs.append(p)
            p.start()
            if record is not None and p.pid is not None:
                record.add_child(p.pid)


def stop_processes(procs: list) -> None:
    """Ask nothing more: terminate, then kill, every process still alive (bounded)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


__all__ = ["start_processes", "stop_processes"]
