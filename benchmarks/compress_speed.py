"""How fast each compressor compresses and decompresses here: the cost model replay charges.

For every compressor of ``emu.emulator.compression.compressors`` (its default parameter), compresses and
decompresses a float32 gradient of 2^20 elements (PowerSGD: a 1024 x 1024 matrix, both passes of
one worker) five times and keeps the median. Writes ``emu/emulator/compression/speed.json``:
elements per second for each direction, with the machine and the date, which replays apply
deterministically (docs/compression.md, "Compute cost"); ``--compress-speed X`` scales it for a
device X times faster.

    .venv/bin/python benchmarks/compress_speed.py [--out emu/emulator/compression/speed.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from emu.emulator.compression.compressors import COMPRESSORS, PowerSgd, parse_compress

N = 1 << 20
RUNS = 5


def timed(fn) -> float:
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "emu" / "emulator"
                                             / "compression" / "speed.json"))
    args = parser.parse_args()
    x = (np.random.default_rng(0).standard_normal(N) * 2.0**-8).astype(np.float32)
    speeds = {}
    for name in COMPRESSORS:
        if name == "powersgd":
            comp = PowerSgd(param=PowerSgd.default, shapes=((1024, 1024),))
            both = timed(lambda comp=comp: comp.aggregate([x], 0))
            speeds[name] = {"compress": N / (both / 2), "decompress": N / (both / 2)}
        else:
            comp = parse_compress(name)
            data = comp.compress(x, 0)
            c = timed(lambda comp=comp: comp.compress(x, 0))
            d = timed(lambda comp=comp, data=data: comp.decompress(data, N, 0))
            speeds[name] = {"compress": N / c, "decompress": N / d}
        print(f"{name:10s} compress {speeds[name]['compress'] / 1e6:8.1f} M elements/s   "
              f"decompress {speeds[name]['decompress'] / 1e6:8.1f} M elements/s", flush=True)
    doc = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                      f"numpy {np.__version__}",
           "measured": datetime.date.today().isoformat(), "elements": N, "runs": RUNS,
           "command": "python benchmarks/compress_speed.py",
           "elements_per_s": {k: {d: round(v, -3) for d, v in s.items()} for k, s in speeds.items()}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
