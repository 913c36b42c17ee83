"""What recording each collective's process group costs a capture (docs/capture.md, "Process groups").

emu's rank processes turn PyTorch's flight recorder on (``TORCH_FR_BUFFER_SIZE``) so that a gloo
trace's collectives can be attributed to their groups; a script that sets the variable itself
keeps its own value (0 turns it off). This alternates captures of a built-in workload with the
recorder on (emu's default) and off, and compares the traces' median profiled step.

    .venv/bin/python benchmarks/flight_recorder.py [--model mlp] [--captures 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from emu.capture import CaptureConfig, capture_model
from emu.traces import summarize


def _capture(model: str, recorder: bool) -> tuple[float, float]:
    """(median profiled step in ms, capture seconds)."""
    old = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if recorder:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    else:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            trace = capture_model(model, CaptureConfig(world_size=4 if model in ("fsdp", "tp", "pp") else 2,
                                                       keep_kineto=Path(tmp)))
            return summarize(trace).step_us_median / 1e3, time.monotonic() - t0
    finally:
        if old is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--captures", type=int, default=4, help="captures in each mode, alternated")
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"emu capture --model {args.model}, {args.captures} captures a mode, alternated\n")
    steps: dict[bool, list[float]] = {True: [], False: []}
    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.captures):
        for recorder in (True, False):
            step, wall = _capture(args.model, recorder)
            steps[recorder].append(step)
            walls[recorder].append(wall)
    on, off = statistics.median(steps[True]), statistics.median(steps[False])
    print("| flight recorder | median of the captures' median step (ms) | capture s (median) |")
    print("| --- | --- | --- |")
    for recorder in (True, False):
        print(f"| {'on (emu default)' if recorder else 'off'} | {statistics.median(steps[recorder]):.2f} "
              f"({min(steps[recorder]):.2f} to {max(steps[recorder]):.2f}) | {statistics.median(walls[recorder]):.1f} |")
    print(f"\nratio on / off: {on / off:.3f}")


if __name__ == "__main__":
    main()
