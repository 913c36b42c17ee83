"""Files written whole or not at all, for every part of emu (docs/design.md, "Working rules").

A file is written to a new temporary file beside its target (so that the rename stays within one
filesystem), flushed to the disk, then renamed over the target: a full disk, a crash, Ctrl-C or
SIGTERM leave either the old file or the new one, never a truncated one, and the temporary file
goes on any failure. Like ``emu.errors``, this module imports nothing else of emu, so that every
package (and the code emu injects into a user's ranks) may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from emu.errors import ConfigError, EmuError, RunFailed

Content = bytes | str | Callable[[BinaryIO], object]  # the bytes, a text, or what writes them


def write_atomic(path: str | os.PathLike[str], content: Content, what: str,
                 error: type[EmuError] = RunFailed) -> Path:
    """Write ``content`` to ``path`` whole or not at all (module docstring). A new file gets the
    umask's mode, a replaced one keeps its own. An OSError becomes ``error`` naming the file and
    ``what`` it is, saying that nothing changed there."""
    path = Path(path)
    staged: list[tuple[Path, Path]] = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _stage(path, content, staged)
        os.replace(staged[0][0], path)
        staged.clear()
    except OSError as exc:
        raise error(f"{path}: cannot write {what} ({exc.strerror or exc}); the file was left as it was: free "
                    "space or pick another path") from None
    finally:
        for tmp, _ in staged:  # on any failure, KeyboardInterrupt included
            tmp.unlink(missing_ok=True)
    sync_dir(path.parent)
    return path


def _stage(path: Path, content: Content, staged: list[tuple[Path, Path]]) -> None:
    """``content`` in a new temporary file beside ``path`` (noted in ``staged`` first, so that a
    failure removes it), flushed to the disk, with the mode of the file it will replace."""
    tmp, fd = _create_beside(path)
    staged.append((tmp, path))
    with os.fdopen(fd, "wb") as f:
        if callable(content):
            content(f)
        else:
            f.write(content.encode() if isinstance(content, str) else content)
        f.flush()
        os.fsync(f.fileno())
    with contextlib.suppress(FileNotFoundError):
        os.chmod(tmp, path.stat().st_mode & 0o7777)


def write_together(files: Sequence[tuple[Path, Content]], what: str, fix: str = "pick another path",
                   error: type[EmuError] = RunFailed) -> None:
    """Write several files as one set (a trace and its payload, a Chakra export's ranks): each to a
    new temporary file beside its target, flushed to the disk, and only when every one is whole,
    all renamed over their targets, the first last (the file that names the others): a full disk
    or an error while writing leaves the old set whole, never a mix of old and new files (only a
    rename failing partway could, and the error then says how many were replaced). ``error``
    names the file or folder that failed and ``what`` the set is."""
    if not files:
        return
    staged: list[tuple[Path, Path]] = []
    current, renamed = files[0][0], 0
    try:
        for path, content in files:
            current = path
            make_folder(path.parent, what, error)
            _stage(path, content, staged)
        while staged:  # the first file last: it names the others
            tmp, current = staged[-1]
            os.replace(tmp, current)
            staged.pop()
            renamed += 1
        for folder in dict.fromkeys(path.parent for path, _ in files):
            sync_dir(folder)
    except OSError as exc:
        kept = ("the files there were left as they were" if renamed == 0 else
                f"{renamed} of the {len(files)} files were replaced before it failed")
        raise error(f"{current}: cannot write {what} ({exc.strerror or exc}); {kept}: free space or {fix}") from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def hold_folder(folder: Path, lock_name: str, refusal: str) -> BinaryIO:
    """The folder's lock (``folder/lock_name``, an exclusive flock held while the returned file is
    open, released by the kernel however the holder ends), for a command writing a set of files
    there that a second writer would mix with its own; a second one gets ConfigError ``refusal``."""
    import fcntl

    try:
        fh = open(folder / lock_name, "a+b")  # noqa: SIM115 (held open for the writer's life, closed by the caller)
    except OSError as exc:
        raise _full_or(ConfigError, exc)(f"{folder / lock_name}: cannot make the folder's lock "
                                         f"({exc.strerror or exc}): free space or pick another folder") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise ConfigError(refusal) from None
    return fh


def make_folder(folder: Path, what: str, error: type[EmuError] = RunFailed) -> Path:
    """``folder`` and its missing parents; an OSError (a full disk: a new folder needs a block where
    an empty file does not) becomes ``error`` naming the folder and what it is for."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _full_or(error, exc)(f"{folder}: cannot make the folder for {what} ({exc.strerror or exc}): free "
                                   "space or pick another path") from None
    return folder


FULL = (errno.ENOSPC, errno.EDQUOT)


def _full_or(error: type[EmuError], exc: OSError) -> type[EmuError]:
    """A full disk is a run that could not finish (RunFailed, exit 1) whenever it is found, before
    the work or after; any other cause of an unwritable path is ``error``'s."""
    return RunFailed if exc.errno in FULL else error


def _create_beside(path: Path) -> tuple[Path, int]:
    """A new, exclusively created file in the target's folder, mode 0666 less the umask (mkstemp's
    0600 would make every file emu writes private)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def sync_dir(folder: Path) -> None:
    """Make a rename durable; best effort (not every OS or filesystem can)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_writable(path: str | os.PathLike[str], option: str) -> None:
    """Refuse, before any work, an output path that cannot be written: ConfigError (exit code 2)
    for a path that never can be, RunFailed (exit 1) for a full disk."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file name")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # write_atomic creates the missing folders below the first that exists
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: {folder} is not a folder; choose another path")
    try:  # the real test (permission bits say nothing to root, nor of a read-only mount)
        with tempfile.NamedTemporaryFile(prefix=".emu-check-", dir=folder):
            pass
        if disk_full(folder):  # an empty file needs no block: the work would run, then fail to write
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        raise _full_or(ConfigError, exc)(f"{option} {path}: cannot write in {folder} ({exc.strerror or exc}); "
                                         "free space or choose another path") from None


def disk_full(folder: Path) -> bool:
    """Whether the disk holding ``folder`` has no block left for this user (root may use the
    blocks kept for it)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    if st.f_blocks == 0:  # a filesystem that reports no sizes (some FUSE and network ones): not known full
        return False
    return (st.f_bfree if getattr(os, "geteuid", lambda: 1)() == 0 else st.f_bavail) == 0
