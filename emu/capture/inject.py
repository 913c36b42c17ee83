"""Runs inside each rank process: wraps an unmodified training script in torch.profiler.

The script runs through runpy as ``__main__``, as if started by ``python``. The
profiler is stepped from torch.optim's global step post-hook, so each
``ProfilerStep#N`` spans exactly one optimizer step (zero_grad, forward,
backward, step). The first ``warmup`` steps are skipped (DDP builds and then
rebuilds its buckets there: they differ from the steady state), one more warms
the profiler up, and the next ``steps`` are recorded and exported as
``rank<R>.json``. A sidecar ``rank<R>.meta.json`` says how far the script got.

Only the first optimizer that steps is followed; others (a GAN's second
optimizer, say) do not advance the profiler.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


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


def run(out: Path, warmup: int, steps: int, target: list[str]) -> None:
    """Run target (``script.py args`` or ``-m module args``) under the profiler."""
    rank = int(os.environ.get("RANK", "0"))
    report = RankReport(rank=rank, optimizer_steps=0, needed_steps=warmup + 1 + steps + 1,
                        trace_written=False, params=None, torch_version=torch.__version__,
                        device="cpu")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        report.device = torch.cuda.get_device_name()

    def export(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))
        report.trace_written = True

    prof = torch.profiler.profile(
        activities=activities, record_shapes=True, on_trace_ready=export,
        schedule=torch.profiler.schedule(skip_first=warmup, wait=0, warmup=1, active=steps, repeat=1))
    followed: list[int] = []

    def on_step(optimizer: torch.optim.Optimizer, *_: object) -> None:
        if not followed:
            followed.append(id(optimizer))
            params = {id(p): p.numel() for g in optimizer.param_groups for p in g["params"]
                      if p.requires_grad}
            report.params = sum(params.values())
        if followed[0] != id(optimizer) or report.trace_written:
            return
        report.optimizer_steps += 1
        prof.step()

    handle = register_optimizer_step_post_hook(on_step)
    prof.start()
    try:
        # This runs only in a rank process emu started for the user's script (never in emu's
        # own process): the script reads its arguments from sys.argv, so they are set as
        # `python script.py args` would. A SystemExit of the script passes through, so that
        # Python reports it as usual.
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path.insert(0, str(Path(target[0]).resolve().parent))
            runpy.run_path(target[0], run_name="__main__")
    finally:
        handle.remove()
        if not report.trace_written:
            # A partial window would end mid-step; emu reports the shortfall instead.
            prof.on_trace_ready = None
        prof.stop()
        (out / f"rank{rank}.meta.json").write_text(json.dumps(asdict(report)))
