"""The one exception family of emu.

Every error a user can cause (a bad file, a bad option, a run that failed) is an
``EmuError`` whose message names the file, the field and the fix. The CLI turns
it into one line on stderr and its exit code: 2 for bad input, 1 for a run that failed
or a check that came out negative; tracebacks appear only with
``--debug``. This module is a leaf: every layer may import it, and it imports
nothing of emu.
"""

from __future__ import annotations


class EmuError(Exception):
    """Base of every error emu reports to a user."""

    exit_code: int = 2


class TraceError(EmuError):
    """An emu trace file is missing, malformed or of an unsupported version."""


class KinetoError(EmuError):
    """A Kineto (torch.profiler) trace cannot be imported."""


class RunFailed(EmuError):
    """A run started and failed: a process died, the time ran out, a result was wrong (exit 1)."""

    exit_code = 1


class CaptureError(RunFailed):
    """A capture run (the real training processes) failed."""


class ConfigError(EmuError):
    """An option or a combination of options is impossible."""


class CheckFailed(RunFailed):
    """A check ran and its result is negative (exit code 1, not 2)."""

    exit_code = 1
