"""Processes emu starts die with it, whatever kills it; what a killed run leaves can be found.

- ``as_child()``: called first thing in a forked child (the replay's switch and hosts): the
  kernel sends it SIGTERM when its parent dies (Linux ``PR_SET_PDEATHSIG``; elsewhere the
  child's loops call ``parent_alive``), it ignores SIGINT (Ctrl-C reaches the whole process
  group; the parent stops its children itself, so one line is printed, not one traceback per
  child), and SIGTERM ends it quietly through its ``finally`` blocks.
- ``child_preexec``: the same for a child started with ``subprocess`` (capture ranks,
  validate's real runs), as its ``preexec_fn``.
- ``terminate_as_interrupt()``: in the CLI, SIGTERM stops a run like Ctrl-C (children stopped,
  temporary files removed, partial report written), and the exit code says which (143, 130).
- ``RunRecord``: a file per run under ``runtime_dir()`` naming the run's pid, its children and
  the temporary folders and network namespaces it made, so that ``emu clean`` removes what a
  run killed with SIGKILL left behind, by emu's own records, never by a broad pattern.

A leaf module: it imports nothing of emu.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emu.errors import RunFailed
from emu.files import write_atomic

_PR_SET_PDEATHSIG = 1


class Terminated(BaseException):
    """SIGTERM reached emu: a clean stop, like KeyboardInterrupt (exit code 143)."""


def _libc() -> ctypes.CDLL | None:
    # the process's own symbols, libc's among them: no find_library, which may run ldconfig, unsafe
    # between fork and exec
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    else:  # no parent-death signal here: a liveness check does its work
        import threading
        import time

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(143)


def _quiet_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


_PARENT_DIED = False
_PARENT: int | None = None  # a replay process's orchestrator (``as_child``)


def _parent_died(signum: int, frame: object) -> None:
    global _PARENT_DIED
    _PARENT_DIED = True
    raise SystemExit(143)


def as_child(parent: int) -> None:
    """Make a forked child die with ``parent``, ignore SIGINT, and end quietly on SIGTERM.

    The parent-death signal is SIGUSR2, not SIGTERM, so that the child knows which happened: it
    comes while the dying parent may still look alive (its other threads not yet gone, the child
    not yet handed to init)."""
    global _PARENT
    _PARENT = parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _quiet_exit)
    signal.signal(signal.SIGUSR2, _parent_died)
    _die_with_parent(parent, signal.SIGUSR2)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # held by the parent across the fork


def child_preexec() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: die with emu, leave Ctrl-C to emu.

    A Python child started with SIGINT ignored keeps it ignored (no KeyboardInterrupt
    traceback); SIGTERM keeps its default action and ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(os.getppid())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


_HELD = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while starting children: one that came between a fork and the
    child's ``as_child`` or ``child_preexec`` would print a traceback from the child (or fail the
    start); held, it reaches the parent when the start is done and the child ignores it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def leave_if_orphaned(who: str) -> None:
    """Raise ``RunFailed`` where ``orphaned``: a replay process's loops call it when a poll comes
    back empty."""
    if orphaned():
        raise RunFailed(f"{who}: the orchestrator is gone")


def orphaned() -> bool:
    """Whether this replay process's orchestrator is gone (``as_child``; False elsewhere): its
    loops ask whenever a poll comes back empty, behind the parent-death signal. A host was found
    polling on, an hour after its orchestrator was killed with SIGKILL as it started it
    (2026-12-04), the signal never acted on."""
    return _PARENT is not None and os.getppid() != _PARENT  # handed to another process: its parent died


def parent_alive(parent: int) -> bool:
    """Whether ``parent`` still runs: not if its death signal came (``as_child``), if the child was
    handed to another process, or if the parent's main thread is a zombie."""
    if _PARENT_DIED or os.getppid() != parent:
        return False
    try:
        state = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return not sys.platform.startswith("linux")
    return state not in ("Z", "X", "x")


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises ``Terminated`` in the main thread (a clean stop)."""
    try:
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# -- records of runs, for emu clean -------------------------------------------------------------

def runtime_dir() -> Path:
    """Where runs record themselves: private to the user (mode 0700, owned by the user, not a
    link: in a shared temporary folder another user must not be able to plant records)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    top = Path(base) / f"emu-{os.getuid()}"
    for path in (top, top / "runs"):
        path.mkdir(exist_ok=True, mode=0o700, parents=path is top)
        st = os.lstat(path)
        if path.is_symlink() or st.st_uid != os.getuid():
            raise OSError(f"{path} is not a private folder of this user")
        if st.st_mode & 0o077:  # ours, but open to others (an older emu made it so): close it
            os.chmod(path, 0o700)
    return top / "runs"


def _ours(item: Leftover) -> bool:
    """Only what emu names its own: never a broad pattern, never a path a record could aim elsewhere."""
    name = Path(item.name).name if item.what == "folder" else item.name
    return item.what == "process" or name.startswith("emu-")


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), to tell it from a later one with its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class RunRecord:
    """What one emu run started and made; removed when the run ends normally."""

    command: str
    pid: int = field(default_factory=os.getpid)
    started: int | None = None
    children: list[list[int]] = field(default_factory=list)  # [pid, start time]
    folders: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = start_time(self.pid)

    @property
    def path(self) -> Path:
        return runtime_dir() / f"{self.pid}-{self.started}.json"  # a reused pid gets its own record

    def save(self) -> None:
        write_atomic(self.path, json.dumps(asdict(self)), "emu's record of its processes")

    def add_child(self, pid: int) -> None:
        self.children.append([pid, start_time(pid) or 0])
        with contextlib.suppress(RunFailed):  # best effort: a full disk must not fail the run
            self.save()

    def add_folder(self, folder: str) -> None:
        self.folders.append(folder)
        with contextlib.suppress(RunFailed):
            self.save()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


_CURRENT: RunRecord | None = None


@contextlib.contextmanager
def recorded(command: str) -> Iterator[RunRecord]:
    """A record of this run for its lifetime (nested uses share one record)."""
    global _CURRENT
    if _CURRENT is not None:
        yield _CURRENT
        return
    try:
        _prune()
        rec = RunRecord(command)
        rec.save()
    except (OSError, RunFailed):  # no private place to record in: run without a record (emu clean cannot help)
        yield RunRecord(command, pid=-1, started=0)
        return
    _CURRENT = rec
    try:
        yield rec
    finally:
        _CURRENT = None
        rec.close()


def current() -> RunRecord | None:
    """The record of the run in progress in this process, if any."""
    return _CURRENT


@dataclass(frozen=True)
class Leftover:
    what: str  # "process", "folder", "namespace", "interface"
    name: str


def _alive(pid: int, started: int | None) -> bool:
    """The very process recorded (same start time), and not a zombie."""
    if started is None or start_time(pid) != started:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X", "x")
    except OSError:
        return False


def leftovers() -> list[tuple[Path, RunRecord, list[Leftover]]]:
    """Runs whose emu process is gone, and what they left: only what their records name."""
    out = []
    for path in sorted(runtime_dir().glob("*.json")):
        try:
            rec = RunRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if _alive(rec.pid, rec.started):
            continue  # still running: not ours to clean
        out.append((path, rec, _left(rec)))
    return out


def _left(rec: RunRecord) -> list[Leftover]:
    """What of a record's processes, folders, namespaces and interfaces is still there (and emu's)."""
    left = [Leftover("process", str(pid)) for pid, st in rec.children if _alive(pid, st)]
    left += [Leftover("folder", f) for f in rec.folders if Path(f).exists()]
    left += [Leftover("namespace", n) for n in rec.namespaces if Path(f"/run/netns/{n}").exists()]
    left += [Leftover("interface", i) for i in rec.interfaces if Path(f"/sys/class/net/{i}").exists()]
    return [item for item in left if _ours(item)]


def _prune() -> None:
    """Forget the records of dead runs that left nothing behind (the usual case: the children
    saw their parent die and went too)."""
    for path, _rec, left in leftovers():
        if not left:
            with contextlib.suppress(OSError):
                path.unlink()


KILL_WAIT_S = 2.0  # how long emu clean waits for the processes it killed to go


def clean(dry_run: bool = False) -> list[Leftover]:
    """Remove what dead runs left behind (their records say what); returns what was found."""
    import subprocess

    found: list[Leftover] = []
    for path, rec, left in leftovers():
        found += left
        if dry_run:
            continue
        for item in left:
            try:
                if item.what == "process":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(item.name), signal.SIGKILL)
                elif item.what == "folder":
                    shutil.rmtree(item.name, ignore_errors=True)
                elif item.what == "namespace":
                    subprocess.run(["ip", "netns", "del", item.name], capture_output=True, timeout=30)
                elif item.what == "interface":
                    subprocess.run(["ip", "link", "del", item.name], capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                pass  # what is still there keeps its record, for the next try
        # a killed process is gone only once the kernel has acted on the signal (on a loaded
        # machine, a moment later): wait for that, bounded, before deciding the record is done
        deadline = time.monotonic() + KILL_WAIT_S
        while any(item.what == "process" for item in _left(rec)) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not _left(rec):
            with contextlib.suppress(OSError):
                path.unlink()
    return found
