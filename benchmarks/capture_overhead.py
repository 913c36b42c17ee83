"""Profiler overhead and capture time, measured in one run.

Two ranks train emu's MLP with DDP on gloo (as ``emu capture --model mlp`` does)
and alternate blocks of steps without and with torch.profiler (record_shapes=True,
as emu records), so that both modes see the same machine state. The step times
exclude the profiler's post-processing when a window closes (a cost paid once
per capture, reported separately). Then ``emu capture --model mlp`` is timed
end to end, a few times.

    .venv/bin/python benchmarks/capture_overhead.py [--blocks 4] [--steps 10] [--captures 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rank_main(out: Path, blocks: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from emu.capture.models import WORKLOADS

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    work = WORKLOADS["mlp"]
    torch.manual_seed(0)
    ddp = DistributedDataParallel(work.build(), bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())

    def step() -> float:
        x, y = work.batch(32, gen)
        start = time.perf_counter()
        opt.zero_grad()
        work.loss(ddp(x), y).backward()
        opt.step()
        return (time.perf_counter() - start) * 1e6

    for _ in range(5):
        step()
    times: dict[str, list[float]] = {"off": [], "on": []}
    close_s = []
    for _ in range(blocks):
        dist.barrier()
        times["off"] += [step() for _ in range(steps)]
        dist.barrier()
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        prof.start()
        for _ in range(steps):
            times["on"].append(step())
            prof.step()
        t0 = time.perf_counter()
        prof.stop()
        prof.export_chrome_trace(str(out.with_suffix(f".{dist.get_rank()}.json")))
        close_s.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"times": times, "close_s": close_s}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--captures", type=int, default=3)
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_out:
        rank_main(args.rank_out, args.blocks, args.steps)
        return
    from emu.capture.launcher import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        run_ranks([sys.executable, __file__, "--rank-out", str(out), "--blocks", str(args.blocks),
                   "--steps", str(args.steps)], 2, Path(tmp), timeout_s=1800)
        data = json.loads(out.read_text())
        walls = []
        emu = Path(sys.executable).with_name("emu")
        for _ in range(args.captures):
            t0 = time.perf_counter()
            subprocess.run([str(emu), "capture", "--model", "mlp", "-o", str(Path(tmp) / "m.json.gz")],
                           check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
    off, on = statistics.median(data["times"]["off"]), statistics.median(data["times"]["on"])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"DDP mlp step, world 2, {args.blocks} blocks x {args.steps} steps per mode, interleaved:")
    print(f"  median step without profiler: {off / 1000:.2f} ms")
    print(f"  median step with profiler:    {on / 1000:.2f} ms  (ratio {on / off:.3f})")
    print(f"  window close + export (median): {statistics.median(data['close_s']) * 1000:.0f} ms")
    print(f"emu capture --model mlp (defaults), {args.captures} runs: median "
          f"{statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f})")


if __name__ == "__main__":
    main()
