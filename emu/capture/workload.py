"""The built-in training script: plain DDP on gloo, configured by torchrun's environment.

``emu capture --model`` runs it through the same launcher and profiler injection
as a user's script (``python -m emu.capture.workload --model mlp``), so both paths
are one code path. It also serves as an example of what emu can capture. With
``--sparsity-dir`` each rank also measures its gradient buckets' block sparsity
(``emu.capture.gradmask``) and writes ``rank<R>.sparsity.npz`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from emu.capture.models import WORKLOADS
from emu.files import write_atomic
from emu.traces.noise import cpu_ticks


def _ran_and_waited() -> tuple[float, float] | None:
    """Seconds this process's main thread (its compute: one intra-op thread) has run on a core and
    waited, ready, for one (Linux's /proc/self/schedstat); None where there is none."""
    try:
        with open("/proc/self/schedstat") as fh:
            ran, waited = fh.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(ran) / 1e9, int(waited) / 1e9


def _machine_busy(opened: tuple[float, float, float] | None) -> float | None:
    """The machine's busy share of all its cores' time since ``opened`` (``cpu_ticks``)."""
    closed = cpu_ticks()
    if opened is None or closed is None or closed[2] <= opened[2]:
        return None
    return (closed[0] - opened[0]) / (closed[2] - opened[2])


def _thread_times(opened: tuple[float, float] | None, steps: int) -> tuple[list[float], list[float]] | None:
    """Each rank's share of a core since ``opened``: the time its main thread ran over the time it
    was ready to run (ran or waited for a core); and that ready time a step over ``steps`` timed
    steps, microseconds: the step's compute as the thread saw it, where the rest of the step it was
    blocked (waiting for its collectives). Every rank takes part (one all_gather)."""
    closed = _ran_and_waited()
    mine = [-1.0, -1.0]
    if opened is not None and closed is not None and steps > 0:
        ran, waited = (b - a for a, b in zip(opened, closed, strict=True))
        mine = [ran / (ran + waited) if ran + waited > 0 else 1.0, (ran + waited) / steps * 1e6]
    got = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(got, torch.tensor(mine, dtype=torch.float64))
    if any(float(t[0]) < 0 for t in got):
        return None
    return [float(t[0]) for t in got], [float(t[1]) for t in got]


def train(model: str, steps: int, batch_size: int | None, bucket_cap_mb: float, seed: int,
          times_out: str | None = None, skip: int = 3, sparsity_dir: str | None = None) -> None:
    """DDP training; with ``times_out``, rank 0 writes the wall time of every step after the
    first ``skip`` as JSON (microseconds), measured from optimizer step to optimizer step, each
    rank's share of a core over those steps and its main thread's time ready a step
    (``_thread_times``), and how busy the machine's cores were meanwhile (``_machine_busy``); with
    ``sparsity_dir``, every rank writes its gradient buckets' block masks there."""
    torch.set_num_threads(1)
    work = WORKLOADS[model]
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(seed)  # identical initial weights on every rank
        ddp = DistributedDataParallel(work.build(), bucket_cap_mb=bucket_cap_mb)
        recorder = None
        if sparsity_dir is not None:
            from emu.capture.gradmask import record_sparsity

            recorder = record_sparsity(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
        batch = batch_size or work.default_batch_size
        marks = []
        opened = machine = None
        for step in range(steps):
            x, y = work.batch(batch, gen)
            if recorder is not None:
                recorder.start_step(step)  # one optimizer step a loop: the profiler's step number
            opt.zero_grad(set_to_none=True)
            out = ddp(*x) if isinstance(x, tuple) else ddp(x)
            work.loss(out, y).backward()
            opt.step()
            marks.append(time.perf_counter())
            if step == skip:
                opened, machine = _ran_and_waited(), cpu_ticks()  # where the timed steps start (their first mark)
        if recorder is not None:
            from emu.capture.sparsity import mask_path

            recorder.save(mask_path(Path(sparsity_dir), dist.get_rank()))
        busy = _machine_busy(machine)
        steps_us = [(b - a) * 1e6 for a, b in zip(marks[skip:], marks[skip + 1:], strict=False)]
        threads = _thread_times(opened, len(steps_us))  # every rank takes part (one all_gather)
        if times_out and dist.get_rank() == 0:
            shares, ready = threads or (None, None)
            write_atomic(times_out, json.dumps({"step_us": steps_us, "core_shares": shares, "machine_busy": busy,
                                                "thread_ready_us": ready}), "the step times")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--times-out", help="rank 0 writes its step times (us) here")
    parser.add_argument("--skip", type=int, default=3, help="steps not timed first")
    parser.add_argument("--sparsity-dir", help="every rank writes its gradient block masks here")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error("run me with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    train(args.model, args.steps, args.batch_size, args.bucket_cap_mb, args.seed, args.times_out, args.skip,
          args.sparsity_dir)


if __name__ == "__main__":
    main()
