"""Replaying traces on GPU-free fake workers through an emulated fabric.

``replay(trace, ReplayConfig(...))`` starts the switch and the host processes,
runs every worker's program in emulated time, stops every process, and returns
a ``ReplayReport`` (``.to_dict()`` is the JSON of docs/design.md's report contract).

The package is laid out by stage (docs/design.md, "Package layout"): ``config`` (options and
design files), ``plan`` (the workers' programs and everything decided before a process starts),
``host`` and ``switch`` (the processes' runtimes), ``control`` (starting, driving and stopping
them), ``machines`` (several machines) and ``report``. The names below are what the layers above
(``emu.run``, ``emu.study``, the CLI) and notebooks use; the modules inside may change.

Each name is imported from its module when first asked for (``__getattr__``): a command that only
needs the design keys' table to build its options (every command's ``--help``) does not import
the switch, the hosts and zmq with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# name -> (its module, its name there)
_WHERE: dict[str, tuple[str, str]] = {
    **{n: ("emu.replay.config.design", n) for n in ("FLAG_KEYS", "NetworkDesign", "load_design", "topology_from_flags")},
    "apply_design": ("emu.replay.config.design", "apply"),
    "DESIGN_KEYS": ("emu.replay.config.keys", "KEYS"),
    "parse_packet_rate": ("emu.replay.config.keys", "parse_packet_rate"),
    **{n: ("emu.replay.config.options", n)
       for n in ("Clock", "CompressOption", "ReplayConfig", "SparsityOption", "Straggler")},
    "ReplayError": ("emu.replay.control.processes", "ReplayError"),
    **{n: ("emu.replay.host.worker", n)
       for n in ("CollRun", "FakeWorker", "IterationRecord", "WorkerState", "union_us")},
    **{n: ("emu.replay.jobs", n) for n in ("Jobs", "replay_jobs")},
    **{n: ("emu.replay.machines.cluster", n) for n in ("JOIN_TIMEOUT_S", "from_environment", "join", "spread")},
    "replay": ("emu.replay.orchestrator", "replay"),
    **{n: ("emu.replay.plan.layout", n) for n in ("has_subgroups", "parse_mesh", "plan_mesh")},
    **{n: ("emu.replay.plan.programs", n)
       for n in ("WorkerProgram", "laid_out", "plan_programs", "programs_for", "straggling")},
    **{n: ("emu.replay.plan.scale", n) for n in ("choose_payload_scale", "scale_for")},
    **{n: ("emu.replay.report.model", n)
       for n in ("REPORT_VERSION", "AdaptiveReport", "CompressionReport", "FabricReport", "ReplayReport",
                 "Verification", "write_chrome_trace")},
}

__all__ = [
    "DESIGN_KEYS", "REPORT_VERSION", "FLAG_KEYS", "JOIN_TIMEOUT_S", "AdaptiveReport", "Clock", "CollRun", "CompressOption", "CompressionReport",
    "FabricReport", "FakeWorker", "IterationRecord", "WorkerState",
    "Jobs", "NetworkDesign", "ReplayConfig", "ReplayError", "ReplayReport", "SparsityOption", "Straggler",
    "Verification", "WorkerProgram", "apply_design", "choose_payload_scale", "from_environment", "has_subgroups", "join", "laid_out", "load_design",
    "parse_mesh", "parse_packet_rate", "plan_mesh", "plan_programs", "programs_for", "replay", "replay_jobs",
    "scale_for", "spread", "straggling", "topology_from_flags", "union_us", "write_chrome_trace",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'emu.replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
