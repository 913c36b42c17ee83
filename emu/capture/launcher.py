"""Starting the rank processes of a capture with torchrun's environment, and stopping them.

Each rank is its own process session, so that the whole tree of a rank (gloo
threads, data-loader workers) can be signalled at once. Every path out of
``run_ranks`` (success, a failing rank, a timeout, Ctrl-C) leaves no process
behind: the survivors get SIGTERM, then SIGKILL after a grace period. Where emu
itself is killed (SIGKILL included), the kernel sends each rank SIGTERM
(``emu.lifetime.child_preexec``); ranks ignore SIGINT, since emu stops them itself
and prints one line. Each rank's pid goes into the run record (``emu clean``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import emu
from emu.errors import CaptureError, ConfigError
from emu.lifetime import child_preexec, current

GRACE_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on host a moment ago (the ranks bind it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, world_size: int, port: int, base: dict[str, str], local_world_size: int | None = None,
             run_id: str = "emu-capture") -> dict[str, str]:
    """torchrun's environment for one rank on one host (of ``local_world_size`` ranks there)."""
    env = dict(base)
    package_root = str(Path(emu.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size or world_size), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": run_id,
    })
    # torchrun's default too: N ranks sharing the cores must not each spawn N threads.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass(frozen=True)
class RankNetwork:
    """Where the ranks run when not on loopback: each in its own network namespace, reaching
    rank 0 at ``master_addr`` through its interface (``emu validate`` builds these)."""

    namespaces: tuple[str, ...]
    interfaces: tuple[str, ...]
    master_addr: str

    def prefix(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def env(self, rank: int) -> dict[str, str]:
        return {"MASTER_ADDR": self.master_addr, "GLOO_SOCKET_IFNAME": self.interfaces[rank]}


@dataclass(frozen=True)
class RankProcess:
    rank: int
    proc: subprocess.Popen[bytes]
    log: Path


def _stop(ranks: Sequence[RankProcess]) -> None:
    live = [r for r in ranks if r.proc.poll() is None]
    for r in live:
        try:
            os.killpg(r.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_S
    for r in live:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for r in ranks:
        # The rank's own process may be gone while its children live on.
        try:
            os.killpg(r.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if r.proc.poll() is None:
            r.proc.wait()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    useful = [ln for ln in lines if not ln.startswith(("USDT:", "[W", "warnings.warn"))]
    return (useful or lines or [""])[-1][:300]


FULL_BYTES = 4 << 20  # a disk with less free is full for a rank's profiler and logs


def _full_disk(workdir: Path) -> str:
    """Where the ranks' folder's disk is full (its logs empty, its traces cut), the words that say so:
    a rank that cannot write dies with a message it could not write either."""
    import shutil

    try:
        free = shutil.disk_usage(workdir).free
    except OSError:
        return ""
    return (f"; the disk holding {workdir} is full ({free:,} bytes free): free space or keep the ranks' files "
            "elsewhere (--keep-kineto)") if free < FULL_BYTES else ""


def _first_failure(ranks: Sequence[RankProcess]) -> RankProcess | None:
    failed = [r for r in ranks if r.proc.poll() not in (None, 0)]
    # A rank killed by a signal crashed; its peers then often exit with a gloo error of
    # their own, which is the consequence, not the cause.
    return min(failed, key=lambda r: (r.proc.returncode >= 0, r.rank), default=None)


def run_ranks(argv: Sequence[str], world_size: int, workdir: Path, *, timeout_s: float,
              env: dict[str, str] | None = None, on_tick: Callable[[float], None] | None = None,
              network: RankNetwork | None = None, processes: int | None = None, port: int | None = None,
              run_id: str = "emu-capture", timeout_hint: str = "raise --timeout or profile fewer steps") -> None:
    """Run argv as world_size ranks (the first ``processes`` of them, where fewer are real: emu
    run); return when all exited 0. A rank that fails (or a run past ``timeout_s``) raises
    CaptureError (exit code 1) naming the rank and its log, which stays in ``workdir``."""
    if world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {world_size}")
    port = port or free_port()
    base = dict(os.environ if env is None else env)
    ranks: list[RankProcess] = []
    started = world_size if processes is None else processes
    try:
        for rank in range(started):
            log = workdir / f"rank{rank}.log"
            cmd, renv = list(argv), rank_env(rank, world_size, port, base, started, run_id)
            if network is not None:
                cmd = network.prefix(rank) + cmd
                renv.update(network.env(rank))
            with open(log, "wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=os.getcwd(), env=renv,
                                        start_new_session=True, preexec_fn=child_preexec)
            ranks.append(RankProcess(rank, proc, log))
            record = current()
            if record is not None:
                record.add_child(proc.pid)
        start = time.monotonic()
        while True:
            failed = _first_failure(ranks)
            if failed is not None:
                last = _last_line(failed.log)
                raise CaptureError(f"rank {failed.rank} {_how(failed.proc.returncode)}{': ' + last if last else ''} "
                                   f"(log: {failed.log}){_full_disk(workdir)}")
            if all(r.proc.returncode == 0 for r in ranks):
                return
            elapsed = time.monotonic() - start
            if elapsed > timeout_s:
                raise CaptureError(f"the ranks did not finish within {timeout_s:.0f} s; {timeout_hint} "
                                   f"(logs: {workdir})")
            if on_tick is not None:
                on_tick(elapsed)
            time.sleep(0.05)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot start {exc.filename or argv[0]!r}: {exc.strerror}") from None
    finally:
        _stop(ranks)
