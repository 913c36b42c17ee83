"""Replaying traces on GPU-free fake workers through an emulated fabric.

``replay(trace, ReplayConfig(...))`` starts the switch and the host processes,
runs every worker's program in emulated time, stops every process, and returns
a ``ReplayReport`` (``.to_dict()`` is the JSON of docs/design.md's report contract).
"""

from emu.replay.config import ReplayConfig, SparsityOption
from emu.replay.orchestrator import ReplayError, replay
from emu.replay.report import ReplayReport, write_chrome_trace

__all__ = ["ReplayConfig", "ReplayError", "ReplayReport", "SparsityOption", "replay", "write_chrome_trace"]
