"""Replaying traces on GPU-free fake workers through an emulated fabric.

``replay(trace, ReplayConfig(...))`` starts the switch and the host processes,
runs every worker's program in emulated time, stops every process, and returns
a ``ReplayReport`` (``.to_dict()`` is the JSON of docs/design.md's report contract).

The package is laid out by stage (docs/design.md, "Package layout"): ``config`` (options and
design files), ``plan`` (the workers' programs and everything decided before a process starts),
``host`` and ``switch`` (the processes' runtimes), ``control`` (starting, driving and stopping
them), ``machines`` (several machines) and ``report``. The names below are what the layers above
(``emu.run``, ``emu.study``, the CLI) and notebooks use; the modules inside may change.
"""

from emu.replay.config.design import FLAG_KEYS, NetworkDesign, load_design, topology_from_flags
from emu.replay.config.design import apply as apply_design
from emu.replay.config.keys import KEYS as DESIGN_KEYS
from emu.replay.config.keys import parse_packet_rate
from emu.replay.config.options import Clock, CompressOption, ReplayConfig, SparsityOption, Straggler
from emu.replay.control.processes import ReplayError
from emu.replay.host.worker import CollRun, FakeWorker, IterationRecord, WorkerState, union_us
from emu.replay.jobs import Jobs, replay_jobs
from emu.replay.machines.cluster import JOIN_TIMEOUT_S, from_environment, join, spread
from emu.replay.orchestrator import replay
from emu.replay.plan.layout import has_subgroups, parse_mesh, plan_mesh
from emu.replay.plan.programs import WorkerProgram, laid_out, plan_programs, programs_for, straggling
from emu.replay.plan.scale import choose_payload_scale, scale_for
from emu.replay.report.model import (
    REPORT_VERSION,
    AdaptiveReport,
    CompressionReport,
    FabricReport,
    ReplayReport,
    Verification,
    write_chrome_trace,
)

__all__ = [
    "DESIGN_KEYS", "REPORT_VERSION", "FLAG_KEYS", "JOIN_TIMEOUT_S", "AdaptiveReport", "Clock", "CollRun", "CompressOption", "CompressionReport",
    "FabricReport", "FakeWorker", "IterationRecord", "WorkerState",
    "Jobs", "NetworkDesign", "ReplayConfig", "ReplayError", "ReplayReport", "SparsityOption", "Straggler",
    "Verification", "WorkerProgram", "apply_design", "choose_payload_scale", "from_environment", "has_subgroups", "join", "laid_out", "load_design",
    "parse_mesh", "parse_packet_rate", "plan_mesh", "plan_programs", "programs_for", "replay", "replay_jobs",
    "scale_for", "spread", "straggling", "topology_from_flags", "union_us", "write_chrome_trace",
]
