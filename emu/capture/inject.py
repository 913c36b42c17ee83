"""Runs inside each rank process: wraps an unmodified training script in torch.profiler.

The script runs through runpy as ``__main__``, as if started by ``python``. The
profiler is stepped from torch.optim's global step post-hook, so each
``ProfilerStep#N`` spans exactly one optimizer step (zero_grad, forward,
backward, step). The first ``warmup`` steps are skipped (DDP builds and then
rebuilds its buckets there: they differ from the steady state), one more warms
the profiler up, and the next ``steps`` are recorded and exported as
``rank<R>.json``. A sidecar ``rank<R>.meta.json`` says how far the script got, and
which DDP communication hook the script registered, if any (``register_comm_hook`` is
wrapped to note its name: PyTorch's fp16, bf16 and PowerSGD hooks compress the buckets,
so the trace's all_reduces are then the compressed ones). A third, ``rank<R>.comms.json``,
gives the process group of every collective of the window and the script's device meshes
(``emu.capture.commlog``: gloo's profiler events do not say which group a collective ran on).
The steps past the window run without the profiler, and each one's wall time goes into the
sidecar (``unprofiled_step_us``): against them the profiled steps show the profiler's overhead
(``meta.noise``, docs/capture.md "Noise").
With ``steps`` 0 the script runs without the profiler and writes no sidecar
(``emu validate``'s real runs, whose step times must not carry its overhead).

Only the first optimizer that steps is followed; others (a GAN's second
optimizer, say) do not advance the profiler.

The rank ends without finalizing the interpreter (``end``). gloo's worker thread
releases a collective only after the rank waiting for it has resumed; when that
release needs the GIL (the work holds Python objects of its thread-local state)
while the main thread is already finalizing the interpreter, Python ends the
worker thread with ``pthread_exit`` in the middle of a C++ destructor, and the
process aborts with "terminate called without an active exception" (a core of
the cnn's real run under ``emu validate`` shows exactly that stack). DDP keeps
the process group alive past ``destroy_process_group``, so its threads cannot be
joined first; ending with ``os._exit`` after what a normal exit does for the
script (non-daemon threads joined, atexit handlers run, output flushed) leaves no
window for that race.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn


@dataclass
class RankReport:
    """What a rank process writes beside its Kineto file."""

    rank: int
    optimizer_steps: int
    needed_steps: int
    trace_written: bool
    params: int | None
    torch_version: str
    device: str
    comm_hook: str | None = None  # the DDP communication hook the script registered (its name)
    threads: int | None = None  # torch's intra-op threads in the rank (at the end of the window)
    cpu_cores: int | None = None  # the cores the rank could run on
    # over the profiled window (emu.traces.noise): the rank's CPU-seconds (every thread) and wall
    # seconds, and the machine's busy, stolen and total CPU-seconds (None: no /proc/stat)
    window_cpu_s: float | None = None
    window_wall_s: float | None = None
    machine_busy_s: float | None = None
    machine_steal_s: float | None = None
    machine_total_s: float | None = None
    # the steps after the window, without the profiler: each one's wall time, from the end of one
    # optimizer step's hook to the start of the next (the export between them not counted)
    unprofiled_step_us: list[float] = field(default_factory=list)


def _load_now() -> tuple[float, float, tuple[float, float, float] | None]:
    from emu.traces.noise import cpu_ticks

    t = os.times()
    return t.user + t.system, time.perf_counter(), cpu_ticks()


def _window_load(report: RankReport, opened: list) -> None:
    """The rank's and the machine's CPU over the profiled window, into the report."""
    if not opened:
        return
    (cpu0, wall0, m0), (cpu1, wall1, m1) = opened[0], _load_now()
    report.window_cpu_s, report.window_wall_s = cpu1 - cpu0, wall1 - wall0
    if m0 is not None and m1 is not None:
        report.machine_busy_s, report.machine_steal_s, report.machine_total_s = (b - a for a, b in zip(m0, m1, strict=True))


def _run_target(target: list[str]) -> int:
    """Run target as ``python`` would and return the exit status it would give."""
    # This runs only in a rank process emu started for the script (never in emu's own
    # process): the script reads its arguments from sys.argv, so they are set as
    # `python script.py args` would.
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path.insert(0, str(Path(target[0]).resolve().parent))
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter would print before exiting with 1
        traceback.print_exc()
        return 1
    return 0


def end(code: int) -> NoReturn:
    """End the rank as a normal exit would, but without finalizing the interpreter (see above)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the script
            pass
    os._exit(code)


def hook_name(hook: object, depth: int = 0) -> str:
    """A communication hook's name: PyTorch's own by their function names (fp16_compress_hook,
    bf16_compress_hook, powerSGD_hook, batched_powerSGD_hook, allreduce_hook); a wrapper's with
    what it wraps (``fp16_compress_wrapper(powerSGD_hook)``: the closure's callable cells, a
    ``functools.partial``'s function, ``__wrapped__``)."""
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or type(hook).__name__
    name = str(name).replace(".<locals>.", ":")
    inner = getattr(hook, "__wrapped__", None) or getattr(hook, "func", None)
    cells = [inner] if callable(inner) else [
        c.cell_contents for c in (getattr(hook, "__closure__", None) or ()) if callable(getattr(c, "cell_contents", None))]
    if cells and depth < 3:
        outer = name.split(":", 1)[0]
        name = f"{outer}({', '.join(hook_name(c, depth + 1) for c in cells)})"
    return name[:200]


TIMED_AFTER = 1000  # steps past the window a rank times at most (a long run's need not all be kept)


def _time_step(report: RankReport, ended: list[float]) -> None:
    """A step past the window, from the end of the last hook (``ended``) to now, into the report."""
    began = time.perf_counter()
    if len(report.unprofiled_step_us) < TIMED_AFTER:
        report.unprofiled_step_us.append((began - ended[-1]) * 1e6)
    ended[-1] = time.perf_counter()


def run(out: Path, warmup: int, steps: int, target: list[str]) -> int:
    """Run target (``script.py args`` or ``-m module args``) under the profiler (none if steps
    is 0); the script's exit status, for the entry point to ``end`` the rank with."""
    if steps == 0:
        return _run_target(target)

    from emu.capture import commlog

    commlog.enable()  # before torch.distributed builds a process group
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    rank = int(os.environ.get("RANK", "0"))
    report = RankReport(rank=rank, optimizer_steps=0, needed_steps=warmup + 1 + steps + 1,
                        trace_written=False, params=None, torch_version=torch.__version__,
                        device="cpu")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        report.device = torch.cuda.get_device_name()

    window = [time.time_ns()]  # when the profiler's window opened (wall clock, ns)
    opened: list[tuple[float, float, tuple[float, float, float] | None]] = []  # cpu, wall, machine

    def export(prof: torch.profiler.profile) -> None:
        _window_load(report, opened)
        report.threads = torch.get_num_threads()
        report.cpu_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))
        commlog.dump(out / f"rank{rank}.comms.json", window[0])
        report.trace_written = True

    prof = torch.profiler.profile(
        activities=activities, record_shapes=True, on_trace_ready=export,
        schedule=torch.profiler.schedule(skip_first=warmup, wait=0, warmup=1, active=steps, repeat=1))
    followed: list[int] = []
    after: list[float] = []  # when the last hook past the window ended (perf_counter)

    def on_step(optimizer: torch.optim.Optimizer, *_: object) -> None:
        if not followed:
            followed.append(id(optimizer))
            params = {id(p): p.numel() for g in optimizer.param_groups for p in g["params"]
                      if p.requires_grad}
            report.params = sum(params.values())
        if followed[0] != id(optimizer):
            return
        if report.trace_written:  # past the window: the profiler is off
            _time_step(report, after)
            return
        report.optimizer_steps += 1
        if report.optimizer_steps == warmup:  # the profiler warms up next: its window opens
            window[0] = time.time_ns()
        if report.optimizer_steps == warmup + 1:  # the profiled steps begin
            opened.append(_load_now())
        prof.step()
        if report.trace_written:  # the window just closed (and exported): unprofiled steps follow
            after.append(time.perf_counter())

    handle = register_optimizer_step_post_hook(on_step)
    ddp = torch.nn.parallel.DistributedDataParallel
    register = ddp.register_comm_hook

    def noting(self: object, state: object, hook: object) -> object:
        report.comm_hook = hook_name(hook)
        return register(self, state, hook)

    ddp.register_comm_hook = noting  # type: ignore[method-assign]
    prof.start()
    try:
        code = _run_target(target)
    finally:
        handle.remove()
        if not report.trace_written:
            # A partial window would end mid-step; emu reports the shortfall instead.
            prof.on_trace_ready = None
        prof.stop()
        (out / f"rank{rank}.meta.json").write_text(json.dumps(asdict(report)))
    return code
