"""``emu run``: K real ranks of an unmodified script in a job of M workers (docs/run.md).

emu starts the K ranks with torchrun's environment (world size M, their real ranks), hosts the
rendezvous store itself (torch's would wait for M clients), and serves their collectives from
its coordinator (``emu.run.coordinator``): the script trains as a K-rank run would, with the
data a job of M workers gives it. What the ranks did, compute measured live, is recorded as an
emu trace, which is then replayed at M workers on the network asked for: the emulated step times
are the prediction at M. On the synchronized clock a replay's times follow from the programs
alone (docs/design.md, "Time and the network model"), so replaying the recorded programs gives
the times a fabric coupled live to the ranks would.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from emu.capture.launcher import free_port, run_ranks
from emu.capture.run import _interpreter_and_target
from emu.errors import ConfigError, RunFailed
from emu.lifetime import current
from emu.replay import ReplayConfig, replay
from emu.replay.report import ReplayReport
from emu.run.coordinator import Coordinator
from emu.traces.model import Source, Trace, TraceMeta

DEFAULT_WARMUP = 2  # optimizer steps: DDP builds, then rebuilds, its buckets in the first two


@dataclass(frozen=True)
class RunConfig:
    """What ``emu run`` was asked: the real ranks, how their compute is measured, and the replay
    of the job (``replay.workers`` is M)."""

    replay: ReplayConfig
    real: int = 1
    clock: str = "thread"  # thread: each rank's thread CPU time; wall: wall time
    warmup: int = DEFAULT_WARMUP
    timeout_s: float = 3600.0

    def check(self, cores: int) -> None:
        m = self.replay.workers
        if not 1 <= self.real <= m:
            raise ConfigError(f"--real must be 1 to --workers ({m}), got {self.real}")
        if m % self.real:
            raise ConfigError(f"--workers {m} is not a multiple of --real {self.real}: each real rank stands for "
                              f"the same number of workers (give --workers {m - m % self.real or self.real})")
        if self.real > cores:
            raise ConfigError(f"--real {self.real} is more than this machine's {cores} cores: the real ranks' "
                              "compute would be measured while they wait for a core")
        if self.clock not in ("thread", "wall"):
            raise ConfigError(f"--compute-clock {self.clock!r}: thread or wall")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more, got {self.warmup}")
        self.replay.check()


@dataclass(frozen=True)
class RunResult:
    trace: Trace
    report: ReplayReport
    elements_checked: int
    mismatches: int


def run_job(argv: Sequence[str], config: RunConfig, *, cores: int,
            on_status: Callable[[str], None] | None = None,
            on_progress: Callable[[float], None] | None = None) -> RunResult:
    """Run the script as the real ranks of a job of ``config.replay.workers``, then replay what
    they did at that size; the recorded trace and the report."""
    config.check(cores)
    interpreter, target = _interpreter_and_target(argv, "emu run --workers M")
    m, k = config.replay.workers, config.real
    workdir = Path(tempfile.mkdtemp(prefix="emu-run-"))
    record = current()
    if record is not None:
        record.add_folder(str(workdir))
    coordinator = Coordinator(f"ipc://{workdir}/run", m, k)
    import torch.distributed as dist  # the store the ranks' rendezvous joins (a server, no waiting)

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False)
    env_extra = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    coordinator.start()
    failed = True
    try:
        if on_status is not None:
            on_status(f"running {k} real rank{'s' if k > 1 else ''} of {m} workers")
        run_ranks([interpreter, "-m", "emu.run", "--address", coordinator.address, "--clock", config.clock, "--",
                   *target], m, workdir, timeout_s=config.timeout_s, env={**os.environ, **env_extra},
                  on_tick=lambda _: coordinator.check(), processes=k, port=port, run_id="emu-run")
        coordinator.check()
        failed = False
    finally:
        coordinator.stop()
        del store
        if not failed:
            shutil.rmtree(workdir, ignore_errors=True)
    programs = coordinator.programs(config.warmup)
    steps = min((len(p.iterations) for p in programs), default=0)
    if steps < 1:
        got = min(len(r.iterations) for r in coordinator.ranks)
        raise RunFailed(f"the script ran {got} optimizer step{'s' if got != 1 else ''}; emu run needs at least "
                        f"{config.warmup + 1} ({config.warmup} to warm up, --warmup): give it more steps")
    meta = TraceMeta(source=Source.LIVE, world_size=m, backend="emu", device="cpu",
                     framework=f"torch {_torch_version()}", dtype="float32",
                     captured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     command=shlex.join(argv), gaps=(
                         f"compute measured live on each real rank's {'thread CPU' if config.clock == 'thread' else 'wall'}"
                         f" clock between its calls into emu's backend ({k} of {m} ranks real; the rest "
                         "mirror them)",))
    trace = Trace(meta=meta, ranks=programs)
    if on_status is not None:
        on_status(f"replaying the {steps} recorded iterations at {m} workers")
    report = replay(trace, config.replay, trace_path=None, on_status=on_status, on_progress=on_progress)
    return RunResult(trace=trace, report=report, elements_checked=coordinator.checked.elements,
                     mismatches=coordinator.checked.mismatches)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)

