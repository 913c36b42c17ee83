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
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

import numpy as np
import zmq

from emu.capture.launcher import free_port, run_ranks
from emu.capture.run import _interpreter_and_target
from emu.emulator.payload.recorded import payload_arrays
from emu.errors import ConfigError, EmuError, RunFailed, TraceError
from emu.files import Content, write_together
from emu.lifetime import current
from emu.replay import ReplayConfig, ReplayReport, choose_payload_scale, replay, scale_for
from emu.run.compress import live_compressor
from emu.run.coordinator import Coordinator
from emu.run.protocol import Checked, ComputeClock
from emu.run.training import Curve, TrainingReport, curve, training_report
from emu.traces.io import encoded
from emu.traces.model import Source, Trace, TraceMeta
from emu.traces.noise import assess
from emu.traces.validate import validate_trace

DEFAULT_WARMUP = 2  # optimizer steps: DDP builds, then rebuilds, its buckets in the first two


@dataclass(frozen=True)
class RunConfig:
    """What ``emu run`` was asked: the real ranks, how their compute is measured, and the replay
    of the job (``replay.workers`` is M)."""

    replay: ReplayConfig
    real: int = 1
    clock: ComputeClock = ComputeClock.THREAD  # how each real rank's compute is timed
    warmup: int = DEFAULT_WARMUP
    timeout_s: float = 3600.0
    compress: str = "none"  # the compressor of the real ranks' gradients (emu.run.compress)
    compress_speed: float = 1.0  # the device compresses this many times faster than the real ranks measured

    def __post_init__(self) -> None:
        if not isinstance(self.clock, ComputeClock) and self.clock in tuple(ComputeClock):
            object.__setattr__(self, "clock", ComputeClock(self.clock))  # a plain "wall": the enum, once

    def check(self, cores: int) -> None:
        m = self.replay.workers
        if m < 1:
            raise ConfigError(f"--workers must be at least 1, got {m}")
        if not 1 <= self.real <= m:
            raise ConfigError(f"--real must be 1 to --workers ({m}), got {self.real}")
        if m % self.real:
            raise ConfigError(f"--workers {m} is not a multiple of --real {self.real}: each real rank stands for "
                              f"the same number of workers (give --workers {m - m % self.real or self.real})")
        if self.real > cores:
            raise ConfigError(f"--real {self.real} is more than this machine's {cores} cores: the real ranks' "
                              "compute would be measured while they wait for a core")
        if self.clock not in tuple(ComputeClock):  # a str enum: "wall" is ComputeClock.WALL
            raise ConfigError(f"--compute-clock {self.clock!r}: {' or '.join(c.value for c in ComputeClock)}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more, got {self.warmup}")
        live_compressor(self.compress)
        if not 1e-6 <= self.compress_speed <= 1e6:
            raise ConfigError(f"--compress-speed must be in [1e-6, 1e6] (times the real ranks' measured speed), got "
                              f"{self.compress_speed}")
        if self.replay.compress.active:
            raise ConfigError("emu run compresses in the real ranks (RunConfig.compress), not in its replay: the "
                              "replay's config must not compress")
        self.replay.check()


@dataclass(frozen=True)
class RunResult:
    trace: Trace
    report: ReplayReport
    checked: Checked  # what the real ranks checked of their results, each in its own process
    payload_out: Path | None = None  # the real ranks' tensors, written beside --trace-out
    losses: tuple[tuple[int, float], ...] = ()  # what the script reported (Coordinator.losses)
    compress: str = "none"  # the compressor the real ranks' gradients went through

    def curve(self, warmup: int) -> Curve:
        """The script's loss against the replay's emulated time (``emu.run.training``)."""
        summary = self.report.summary
        return curve(self.compress, self.losses, [it.emulated_us for it in self.report.iterations],
                     None if summary is None else summary.iteration_us_median, warmup)


def save_recorded(trace: Trace, trace_out: Path, write_payload: Callable[[BinaryIO], object] | None) -> Path | None:
    """Write the recorded trace and its payload (returned: its path, or None) as a pair: both to new
    files first, then renamed over the old ones, so that a full disk or an error leaves the old pair
    whole, never a new trace beside an old payload or a trace without its payload (RunFailed, exit 1)."""
    data = encoded(trace, trace_out)  # a trace emu would refuse to read is refused here, before any file
    files: list[tuple[Path, Content]] = [(trace_out, data)]
    if write_payload is not None:
        files.append((payload_path(trace_out), write_payload))
    write_together(files, "the recorded trace and its payload", fix="pick another --trace-out")
    return files[1][0] if write_payload is not None else None


def payload_path(trace_out: Path) -> Path:
    """Where the payload of a trace written to ``trace_out`` goes: ``live.json.gz`` gives
    ``live.payload.npz``."""
    name = trace_out.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return trace_out.with_name(f"{name}.payload.npz")


def run_job(argv: Sequence[str], config: RunConfig, *, cores: int,
            on_status: Callable[[str], None] | None = None,
            on_progress: Callable[[float], None] | None = None,
            trace_out: Path | None = None) -> RunResult:
    """Run the script as the real ranks of a job of ``config.replay.workers``, then replay what
    they did at that size; the recorded trace (written to ``trace_out`` first, where given) and
    the report."""
    config.check(cores)
    interpreter, target = _interpreter_and_target(argv, "emu run --workers M")
    m, k = config.replay.workers, config.real
    coordinator = _record(interpreter, target, config, on_status)
    programs = coordinator.programs(config.warmup)
    steps = min((len(p.iterations) for p in programs), default=0)
    if steps < 1:
        got = min(len(r.iterations) for r in coordinator.ranks)
        raise ConfigError(f"the script ran {got} optimizer step{'s' if got != 1 else ''}; emu run needs at least "
                          f"{config.warmup + 1} ({config.warmup} to warm up, --warmup): give it more steps")
    clock = config.clock.label
    meta = TraceMeta(source=Source.LIVE, world_size=m, backend="emu", device="cpu",
                     framework=f"torch {_torch_version()}", dtype=_dtype(programs),
                     captured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     command=shlex.join(argv), gaps=(
                         f"compute measured live on each real rank's {clock} clock between its calls into emu's "
                         f"backend ({k} of {m} ranks real; the rest mirror them)", *_compressed_gap(config)))
    trace = Trace(meta=meta, ranks=programs)
    trace = replace(trace, meta=replace(meta, noise=assess(trace)))  # the live steps' spread
    try:
        validate_trace(trace, "the recorded program")
    except TraceError as exc:
        raise RunFailed(f"emu run recorded a program it cannot replay: {exc}") from None
    # replay refuses iterations that issue different collectives, with its own message
    counts = {len(it.colls) for it in programs[0].iterations}
    payload = coordinator.payload(programs) if len(counts) == 1 else None
    if payload is not None:  # cut to what the replay sends
        scale = config.replay.payload_scale or choose_payload_scale(trace, config.replay)
        payload = payload.trimmed([op.count for it in programs[0].iterations for op in it.colls], scale)
    payload_out = None
    if trace_out is not None:
        payload_out = save_recorded(trace, trace_out, None if payload is None else
                                    (lambda f: np.savez(f, **payload_arrays(payload))))
    if on_status is not None:
        on_status(f"replaying the {steps} recorded iterations at {m} workers")
    report = replay(trace, config.replay, trace_path=None if trace_out is None else str(trace_out),
                    on_status=on_status, on_progress=on_progress, payload=payload,
                    payload_path=None if payload_out is None else str(payload_out))
    if coordinator.payload_dropped is not None:
        report = replace(report, verification=replace(report.verification, payload_note=coordinator.payload_dropped))
    return RunResult(trace=trace, report=report, checked=coordinator.checked, payload_out=payload_out,
                     losses=coordinator.losses(), compress=live_compressor(config.compress).label)


def _compressed_gap(config: RunConfig) -> tuple[str, ...]:
    comp = live_compressor(config.compress)
    if comp.name == "none":
        return ()
    return (f"gradients compressed by the real ranks with {comp.label} (emu run --compress): the float "
            "all_reduces are the collectives of its output, compress and decompress are compute measured live"
            + (f", {config.compress_speed:g} times faster (--compress-speed)" if config.compress_speed != 1 else ""),)


def train_and_compare(argv: Sequence[str], config: RunConfig, *, cores: int, baseline: bool = True,
                      target_loss: float | None = None, on_status: Callable[[str], None] | None = None,
                      on_progress: Callable[[float], None] | None = None,
                      trace_out: Path | None = None) -> tuple[RunResult, RunResult | None, TrainingReport | None]:
    """``run_job``, then (``baseline``, where ``config`` compresses) the same command again
    uncompressed; both results and their loss curves (``emu.run.training``)."""
    first = run_job(argv, config, cores=cores, on_status=on_status, on_progress=on_progress, trace_out=trace_out)
    second = None
    if baseline and live_compressor(config.compress).name != "none":
        if on_status is not None:
            on_status("the same command again, uncompressed (--no-baseline skips it)")
        second = run_job(argv, replace(config, compress="none"), cores=cores, on_status=on_status,
                         on_progress=on_progress)
    curves = tuple(r.curve(config.warmup) for r in (first, second) if r is not None)
    return first, second, training_report(curves, target_loss)


def _kept(config: ReplayConfig) -> Callable[[int, int], int]:
    """The elements of a collective's payload vectors a replay of ``config`` may send: at its
    payload scale, or where that is auto, at the finest scale auto can choose for a collective of
    that size (``choose_payload_scale`` weighs a whole iteration, so it is never finer)."""
    m = config.workers

    def kept(count: int, itemsize: int) -> int:
        r = config.payload_scale or scale_for(count * itemsize * m)
        return -(-count // r)

    return kept


def _record(interpreter: str, target: list[str], config: RunConfig,
            on_status: Callable[[str], None] | None) -> Coordinator:
    """Run the real ranks against a coordinator that serves and records them; the coordinator.
    The work folder (the ranks' logs, the socket) goes on every path but a failed run's, whose
    error names a log in it."""
    import torch.distributed as dist  # the store the ranks' rendezvous joins (a server, no waiting)

    m, k = config.replay.workers, config.real
    workdir = Path(tempfile.mkdtemp(prefix="emu-run-"))
    if len(str(workdir)) + len("/run") > getattr(zmq, "IPC_PATH_MAX_LEN", 107):
        shutil.rmtree(workdir, ignore_errors=True)  # a deep $TMPDIR: socket paths have a limit
        workdir = Path(tempfile.mkdtemp(prefix="emu-run-", dir="/tmp"))
    record = current()
    if record is not None:
        record.add_folder(str(workdir))
    coordinator = Coordinator(f"ipc://{workdir}/run", m, k, keep=_kept(config.replay), warmup=config.warmup,
                              compress_speed=config.compress_speed)
    keep = False
    store = None
    try:
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, None, True, wait_for_workers=False)
        coordinator.start()
        if on_status is not None:
            on_status(f"running {k} real rank{'s' if k > 1 else ''} of {m} workers")
        # torchrun's agent hosts the store; a barrier after init would wait for M ranks
        env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_DIST_INIT_BARRIER": "0"}
        compress = [] if live_compressor(config.compress).name == "none" else ["--compress", config.compress]
        argv = [interpreter, "-m", "emu.run", "--address", coordinator.address, "--clock", config.clock.value,
                "--timeout", str(config.timeout_s), *compress, "--", *target]
        try:
            run_ranks(argv, m, workdir, timeout_s=config.timeout_s, env=env, on_tick=lambda _: coordinator.check(),
                      processes=k, port=port, run_id="emu-run", timeout_hint="raise --timeout or run fewer steps")
            coordinator.check()
        except EmuError:
            keep = True  # the error names a rank's log in the folder
            raise
    finally:
        coordinator.stop()
        del store
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return coordinator


def _dtype(programs: tuple) -> str:
    """The dtype that carries most of the collectives' bytes."""
    weight: dict[str, int] = {}
    for p in programs:
        for it in p.iterations:
            for op in it.colls:
                weight[op.dtype.value] = weight.get(op.dtype.value, 0) + op.bytes
    return max(weight, key=lambda d: weight[d]) if weight else "float32"


def _torch_version() -> str:
    import torch

    return str(torch.__version__)

