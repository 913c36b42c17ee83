"""Capturing a real run: the built-in workloads and users' unmodified scripts.

Both paths start the ranks through ``launcher`` with the profiler injected by
``inject`` (``python -m emu.capture``), then merge the ranks' Kineto files into one
emu trace. A built-in workload can also measure its gradients' block sparsity
(``emu.capture.sparsity``), which is attached to the merged trace's all_reduces;
a user's script has no such hook, and its trace has no sparsity. torch is imported
only inside the rank processes and the built-in workloads: importing this module
stays cheap.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from emu.capture.kineto import read_kineto
from emu.capture.launcher import RankNetwork, run_ranks
from emu.capture.merge import merge_ranks
from emu.capture.sparsity import attach_sparsity, mask_path, read_masks
from emu.errors import CaptureError, ConfigError, EmuError
from emu.files import make_folder
from emu.lifetime import current
from emu.traces.model import Experts, GroupRole, Source, Trace
from emu.traces.noise import STEP_CV, MachineLoad, assess
from emu.traces.samples import BUILT_IN, MODELS, PARALLEL_MODELS
from emu.traces.validate import validate_trace

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class CaptureConfig:
    """How a capture runs, whatever it runs."""

    world_size: int = 2
    """Rank processes to start on this machine (gloo on 127.0.0.1)."""
    profile_steps: int = 5
    """Optimizer steps recorded, after the warm-up."""
    warmup: int = 3
    """Steps skipped first: DDP's first steps differ from the steady state."""
    timeout_s: float = 1800.0
    """Bound on the whole run; the ranks are stopped when it passes."""
    keep_kineto: Path | None = None
    """Where to keep the ranks' Kineto files and logs (default: a temporary folder)."""
    network: RankNetwork | None = None
    """Run each rank in its own network namespace (emu validate); default: loopback."""
    windows: int = 1
    """Profiled windows to take at most: while the kept one's steps vary past ``STEP_CV``, the ranks
    run again and the steadiest window is kept (``emu capture --windows``, docs/capture.md)."""

    def check(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"--world-size must be at least 1, got {self.world_size}")
        if self.profile_steps < 1:
            raise ConfigError(f"the number of profiled steps must be at least 1, got {self.profile_steps}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout_s}")
        if not 1 <= self.windows <= MAX_WINDOWS:
            raise ConfigError(f"--windows must be in 1..{MAX_WINDOWS}, got {self.windows}")


MAX_WINDOWS = 10

# Steps the built-in workloads run past the profiled window, without the profiler, each timed: the
# capture's own unprofiled step time (``meta.noise.unprofiled_step_us``; the first of them is left
# out, emu.traces.noise.unprofiled), against which its profiled steps show the profiler's overhead
# (docs/capture.md, "Noise"). The window's export runs in the last profiled step's hook. At least
# this many, and one more than the profiled steps: the two medians compared then rest on as many steps.
AFTER_STEPS = 6


def built_in_steps(config: CaptureConfig) -> int:
    """Optimizer steps a built-in workload runs: the warm-up, one for the profiler's own warm-up,
    the profiled ones, and as many without the profiler plus one (``AFTER_STEPS`` at least)."""
    return config.warmup + 1 + config.profile_steps + max(AFTER_STEPS, config.profile_steps + 1)


def _steadiest(config: CaptureConfig, take: Callable[[CaptureConfig], Trace]) -> Trace:
    """Captures taken while the steadiest so far has steps varying past ``STEP_CV``, at most
    ``config.windows`` in all; the steadiest kept (its noise says how many were taken). The whole
    window is kept, not a median of ops across windows: a window is one run's steps as they ran,
    its ops' order and overlaps included, where a median would make a step no run took. With
    ``keep_kineto``, the first window keeps its files there and each later one in ``window<k>/``."""
    best: Trace | None = None
    taken = 0
    while taken < config.windows and (best is None or _cv(best) >= STEP_CV):
        keep = config.keep_kineto
        trace = take(config if keep is None or taken == 0 else
                     replace(config, keep_kineto=keep / f"window{taken + 1}"))
        taken += 1
        if best is None or _cv(trace) < _cv(best):
            best = trace
    assert best is not None and best.meta.noise is not None
    return replace(best, meta=replace(best.meta, noise=replace(best.meta.noise, windows=taken)))


def _cv(trace: Trace) -> float:
    return trace.meta.noise.step_cv if trace.meta.noise is not None else 0.0


def _interpreter_and_target(argv: Sequence[str], command: str = "emu capture -o t.json.gz") -> tuple[str, list[str]]:
    """Split ``python train.py args`` (or ``python -m pkg args``, or ``train.py args``); ``command``
    is what the user ran, for the messages."""
    if not argv:
        raise ConfigError("give the training command after --, e.g. "
                          f"'{command} -- python train.py'")
    first = argv[0]
    if first.endswith(".py"):
        return sys.executable, list(argv)
    if not _PYTHON.match(Path(first).name):
        raise ConfigError(f"{command.split(' -')[0]} runs Python training scripts; {first!r} is not python: give "
                          "'-- python train.py [args]' (torchrun is not needed: emu starts the ranks)")
    rest = list(argv[1:])
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ConfigError("give the script after python: '-- python train.py [args]' or "
                          "'-- python -m package.module [args]'")
    if rest[0].startswith("-") and rest[0] != "-m":
        fix = ("save the code to train.py and give '-- python train.py'" if rest[0] == "-c" else
               "give '-- python train.py' and set python's options in its environment (PYTHONUNBUFFERED, "
               "PYTHONOPTIMIZE, PYTHONWARNINGS, ...)")
        raise ConfigError(f"python {rest[0]}: emu runs a script file or a module (-m), not python's own "
                          f"options: {fix}")
    if rest[0] != "-m" and not Path(rest[0]).is_file():
        raise ConfigError(f"{rest[0]}: no such script")
    interpreter = sys.executable if first in ("python", "python3") else first
    return interpreter, rest


def _run(interpreter: str, target: Callable[[Path], list[str]], config: CaptureConfig, *, source_model: str,
         command: str, batch_size: int | None, on_tick: Callable[[float], None] | None,
         sparsity: bool = False) -> Trace:
    """Run ``target(workdir)`` as the ranks and merge their files; with ``sparsity``, the target
    writes the ranks' gradient masks into the work folder, and the trace's all_reduces get them."""
    config.check()
    if config.keep_kineto is None:
        workdir = Path(tempfile.mkdtemp(prefix="emu-capture-"))
        record = current()
        if record is not None:  # `emu clean` removes it if this run is killed outright
            record.add_folder(str(workdir))
    else:
        workdir = make_folder(config.keep_kineto, "--keep-kineto's files", ConfigError)
    argv = [interpreter, "-m", "emu.capture", "--out", str(workdir), "--warmup", str(config.warmup),
            "--steps", str(config.profile_steps), "--", *target(workdir)]
    failed = False
    try:
        run_ranks(argv, config.world_size, workdir, timeout_s=config.timeout_s, on_tick=on_tick,
                  network=config.network)
        reports = [json.loads((workdir / f"rank{r}.meta.json").read_text())
                   for r in range(config.world_size)]
        short = next((r for r in reports if not r["trace_written"]), None)
        if short is not None:
            raise ConfigError(
                f"rank {short['rank']} made {short['optimizer_steps']} optimizer steps, but emu needs "
                f"{short['needed_steps']} (warm-up {config.warmup}, one profiler warm-up, "
                f"{config.profile_steps} profiled, one to close the window); train longer or profile "
                f"fewer steps (logs: {workdir})")
        kts = [read_kineto(workdir / f"rank{r}.json") for r in range(config.world_size)]
        threads = {r.get("threads") for r in reports}
        trace = merge_ranks(kts, source=Source.CAPTURE, model=source_model,
                            framework=f"torch {reports[0]['torch_version']}", batch_size=batch_size,
                            params=_params(reports), command=command,
                            comm_hook=reports[0].get("comm_hook"), cpu_cores=reports[0].get("cpu_cores"),
                            threads_per_rank=threads.pop() if len(threads) == 1 else None)
        trace = replace(trace, meta=replace(trace.meta, noise=assess(trace, _machine_load(reports), _after(reports))))
        if trace.meta.mesh is not None and any(d.role in _SPLIT for d in trace.meta.mesh.dims):
            # each rank holds a part of the model: rank 0's optimizer's count is not the model's
            trace = replace(trace, meta=replace(trace.meta, params=None))
        if sparsity:
            masks = {r: read_masks(mask_path(workdir, r)) for r in range(config.world_size)}
            trace = attach_sparsity(trace, masks)
            validate_trace(trace, str(workdir))
        return trace
    except FileNotFoundError as exc:
        failed = True
        raise CaptureError(f"a rank left no output ({exc.filename}); see the logs in {workdir}") from None
    except EmuError:
        failed = True
        raise
    finally:
        # A failed capture keeps its folder: its error names a log or file in it (its fragments go).
        # A successful or interrupted one leaves nothing.
        if failed:
            _fragments_removed(workdir)
        elif config.keep_kineto is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _fragments_removed(workdir: Path) -> None:
    """What a failed rank left half-written (``*.tmp``, empty files; a full disk leaves them), gone;
    the logs the error names stay."""
    for p in workdir.glob("*"):
        try:
            if p.is_file() and not p.name.endswith(".log") and (p.name.endswith(".tmp") or p.stat().st_size == 0):
                p.unlink()
        except OSError:
            continue


_SPLIT = (GroupRole.TP, GroupRole.PP, GroupRole.EP)


def _machine_load(reports: list[dict]) -> MachineLoad | None:
    """The machine over the profiled window (``emu.traces.noise``): its figures as the ranks saw
    them (the median rank's: their windows nearly coincide), against all the ranks' CPU time."""
    keys = ("window_cpu_s", "window_wall_s", "machine_busy_s", "machine_steal_s", "machine_total_s")
    if any(r.get(k) is None for r in reports for k in keys):
        return None
    med = {k: statistics.median(r[k] for r in reports) for k in keys}
    return MachineLoad(busy_s=med["machine_busy_s"], steal_s=med["machine_steal_s"], total_s=med["machine_total_s"],
                       ranks_cpu_s=sum(r["window_cpu_s"] for r in reports), wall_s=med["window_wall_s"])


def _after(reports: list[dict]) -> list[list[float]]:
    """Each rank's unprofiled steps past the window (``RankReport.unprofiled_step_us``), in us."""
    return [[float(x) for x in r.get("unprofiled_step_us") or ()] for r in reports]


def _params(reports: list[dict]) -> int | None:
    """The model's parameters: what the ranks' optimizers step, where they agree (FSDP's sharded
    parameters count whole); None where ranks hold different parts (pipeline stages)."""
    counts = {r["params"] for r in reports}
    return counts.pop() if len(counts) == 1 else None


SCRIPTS = Path(__file__).parent / "scripts"
PARALLEL_WORLD = 4  # the built-in sharded and split workloads' default world size (dp=2 x tp=2, ...)

# The built-in moe's experts, given to its script: 16 of width 256, each an MLP of Linear(256, 512)
# and Linear(512, 256) with biases (moe_train.py's Expert), whose parameters a replay's expert
# gradients count
MOE_WIDTH = 256
MOE_EXPERTS = Experts(count=16, params_per_expert=2 * (MOE_WIDTH * 2 * MOE_WIDTH) + 2 * MOE_WIDTH + MOE_WIDTH)


def capture_parallel(model: str, config: CaptureConfig, *, batch_size: int | None = None,
                     bucket_cap_mb: float = 4.0, seed: int = 0,
                     on_tick: Callable[[float], None] | None = None) -> Trace:
    """Run a built-in sharded or split workload (``fsdp``, ``tp``, ``pp``, ``moe``: the unmodified
    scripts of ``emu/capture/scripts/``, which ``examples/`` links to) on gloo and capture it."""
    script = SCRIPTS / f"{model}_train.py"
    batch = batch_size or (256 if model == "moe" else 32)  # moe: tokens a rank
    steps = built_in_steps(config)
    args = ["--steps", str(steps), "--batch-size", str(batch), "--seed", str(seed)]
    if model == "tp":
        args += ["--bucket-cap-mb", f"{bucket_cap_mb:g}"]
    if model == "moe":
        args += ["--experts", str(MOE_EXPERTS.count), "--width", str(MOE_WIDTH)]
    command = (f"emu capture --model {model} --world-size {config.world_size} --iters {config.profile_steps} "
               f"--warmup {config.warmup} --batch-size {batch} --seed {seed}"
               + (f" --bucket-cap-mb {bucket_cap_mb:g}" if model == "tp" else ""))
    trace = _steadiest(config, lambda c: _run(sys.executable, lambda _: [str(script), *args], c,
                                            source_model=model, command=command, batch_size=batch, on_tick=on_tick))
    if model == "moe":  # what a replay at another expert-parallel size needs (emu.replay.plan.experts)
        trace = replace(trace, meta=replace(trace.meta, experts=MOE_EXPERTS))
    return trace


def capture_model(model: str, config: CaptureConfig = CaptureConfig(), *, batch_size: int | None = None,
                  bucket_cap_mb: float = 25.0, seed: int = 0, sparsity: bool = False,
                  on_tick: Callable[[float], None] | None = None) -> Trace:
    """Run a built-in workload (mlp, cnn, transformer, dlrm) with DDP on gloo and capture it; with
    ``sparsity``, measure each gradient bucket's block sparsity too. The sharded and split ones
    (fsdp, tp, pp) run as ``capture_parallel`` (no sparsity: their scripts are users' scripts).

    Measuring runs inside the measured backward pass (docs/capture.md: about 3.5 ms a step for
    6.4M gradient elements on 2 CPU cores, the mask and DDP's hook in Python), so it is off here
    unless asked for: callers that compare the trace
    with real runs made without it (``emu validate``) must not carry its cost. ``emu capture
    --model`` asks for it unless given ``--no-sparsity``."""
    if model in PARALLEL_MODELS:
        return capture_parallel(model, config, batch_size=batch_size, bucket_cap_mb=bucket_cap_mb, seed=seed,
                                on_tick=on_tick)
    if model not in MODELS:
        raise ConfigError(f"--model {model!r} is not built in; choose one of: {', '.join(BUILT_IN)}")
    if bucket_cap_mb <= 0:
        raise ConfigError(f"--bucket-cap-mb must be positive, got {bucket_cap_mb}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    from_models = {"mlp": 32, "cnn": 32, "transformer": 4, "dlrm": 128}
    batch = batch_size or from_models[model]
    steps = built_in_steps(config)

    def target(workdir: Path) -> list[str]:
        return ["-m", "emu.capture.workload", "--model", model, "--steps", str(steps), "--batch-size", str(batch),
                "--bucket-cap-mb", str(bucket_cap_mb), "--seed", str(seed),
                *(["--sparsity-dir", str(workdir)] if sparsity else [])]

    command = (f"emu capture --model {model} --world-size {config.world_size} --iters "
               f"{config.profile_steps} --warmup {config.warmup} --bucket-cap-mb {bucket_cap_mb:g} "
               f"--batch-size {batch} --seed {seed}{'' if sparsity else ' --no-sparsity'}")
    return _steadiest(config, lambda c: _run(sys.executable, target, c, source_model=model, command=command,
                                           batch_size=batch, on_tick=on_tick, sparsity=sparsity))


def capture_script(argv: Sequence[str], config: CaptureConfig = CaptureConfig(), *,
                   on_tick: Callable[[float], None] | None = None) -> Trace:
    """Capture an unmodified training script (``python train.py args``) run as N ranks."""
    interpreter, target = _interpreter_and_target(argv)
    name = target[1] if target[0] == "-m" else Path(target[0]).stem
    command = (f"emu capture --world-size {config.world_size} --profile-steps {config.profile_steps} "
               f"--warmup {config.warmup} -- {shlex.join(argv)}")
    return _steadiest(config, lambda c: _run(interpreter, lambda _: target, c, source_model=name, command=command,
                                           batch_size=None, on_tick=on_tick))
