"""How fast each compressor compresses and decompresses here: the cost model replay charges.

For every compressor of ``emu.emulator.compression.compressors``, at each parameter of ``GRID``
(a ratio, levels, a rank; the one there is for the compressors that take none), compresses and
decompresses a float32 gradient of 2^20 elements (PowerSGD: a 1024 x 1024 matrix, both passes of
one worker) five times and keeps the median. Writes ``emu/emulator/compression/speed.json``:
elements per second for each direction and parameter, with the machine and the date, which
replays apply deterministically, interpolated between the parameters measured
(``compressors.cost_us``; docs/compression.md, "The cost model"); ``--compress-speed X`` scales it
for a device X times faster.

    .venv/bin/python benchmarks/compress_speed.py [--out emu/emulator/compression/speed.json] [--anchor FILE]

``--anchor FILE`` keeps each compressor's rate at its default parameter from an earlier speed
file and scales the curve measured now to it: on a shared machine the level of every rate moves
from day to day (2.5 to 3x between 2026-11-30 and 2026-12-02 here), the ratios between the
parameters, measured in one run, do not, and replays keep the costs they had where the parameter
is the default.
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
RATIOS = (0.001, 0.01, 0.1, 0.5)
GRID = {"topk": RATIOS, "randomk": RATIOS, "dgc": RATIOS, "qsgd": (1, 4, 16, 64, 256, 4096),
        "powersgd": (1, 4, 16, 64)}


def timed(fn) -> float:
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def anchor(speeds: dict[str, list[dict]], path: Path) -> tuple[dict[str, list[dict]], str]:
    """``speeds`` scaled, per compressor and direction, so that the default parameter's rate is
    the one in ``path`` (a speed file of version 1, one rate per compressor, or 2)."""
    old = json.loads(path.read_text())
    out = {}
    for name, rows in speeds.items():
        ref = old["elements_per_s"][name]
        default = COMPRESSORS[name].default
        if isinstance(ref, list):
            ref = next(r for r in ref if r["param"] == default)
        here = next(r for r in rows if r["param"] == default)
        out[name] = [{"param": r["param"], **{k: round(r[k] * ref[k] / here[k], -3) for k in ("compress", "decompress")}}
                     for r in rows]
    return out, (f"the default parameter's rates from {path.name} (measured {old.get('measured')}), the others "
                 "scaled by their ratio to it as measured now")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "emu" / "emulator"
                                             / "compression" / "speed.json"))
    parser.add_argument("--anchor", help="an earlier speed file whose default-parameter rates to keep")
    args = parser.parse_args()
    x = (np.random.default_rng(0).standard_normal(N) * 2.0**-8).astype(np.float32)
    speeds: dict[str, list[dict[str, float | None]]] = {}
    for name in COMPRESSORS:
        speeds[name] = []
        for param in GRID.get(name, (None,)):
            text = name if param is None else f"{name}:{param:g}"
            if name == "powersgd":
                comp = PowerSgd(param=float(param), shapes=((1024, 1024),))
                both = timed(lambda comp=comp: comp.aggregate([x], 0))
                c = d = both / 2
            else:
                comp = parse_compress(text)
                data = comp.compress(x, 0)
                c = timed(lambda comp=comp: comp.compress(x, 0))
                d = timed(lambda comp=comp, data=data: comp.decompress(data, N, 0))
            speeds[name].append({"param": param, "compress": round(N / c, -3), "decompress": round(N / d, -3)})
            print(f"{text:15s} compress {N / c / 1e6:8.1f} M elements/s   decompress {N / d / 1e6:8.1f} M elements/s",
                  flush=True)
    anchored = None
    if args.anchor:
        speeds, anchored = anchor(speeds, Path(args.anchor))
    doc = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                      f"numpy {np.__version__}",
           "measured": datetime.date.today().isoformat(), "elements": N, "runs": RUNS,
           "command": "python benchmarks/compress_speed.py" + (" --anchor speed.json (the file it replaced)" if args.anchor else ""),
           "version": 2, "elements_per_s": speeds,
           **({"anchored": anchored} if anchored else {})}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
