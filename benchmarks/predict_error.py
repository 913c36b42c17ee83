"""How far ``emu predict`` is from a replay: the shipped samples on ina and ring.

For every point of the grid (the shipped traces, worker counts, fabrics, bandwidths; latency
5 us, payload scale auto, the synchronized clock), replays the trace for ``--iters``
iterations and compares the median iteration with ``emu.study.predict.predict`` for the same
configuration. Prints a markdown table (docs/physics.md, "Predictions") and the worst errors.

    .venv/bin/python benchmarks/predict_error.py [--models mlp,cnn,transformer] [--workers 8,64]
        [--fabrics ina,ring] [--bandwidth 10,100] [--iters 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.study.predict import predict
from emu.traces import load_trace, sample_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn,transformer")
    parser.add_argument("--workers", default="8,64")
    parser.add_argument("--fabrics", default="ina,ring")
    parser.add_argument("--bandwidth", default="10,100", help="Gb/s")
    parser.add_argument("--latency", type=float, default=5.0, help="one-way, microseconds")
    parser.add_argument("--iters", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"latency {args.latency:g} us, {args.iters} iteration(s), payload scale auto, synchronized clock")
    print()
    print("| trace | M | fabric | Gb/s | replay ms | predict ms | error | exposed comm ms (replay / predict) "
          "| replay s | predict ms |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors = []
    start = time.perf_counter()
    for model in args.models.split(","):
        trace = load_trace(sample_path(model))
        for m in (int(x) for x in args.workers.split(",")):
            for fabric in args.fabrics.split(","):
                for gbps in (float(x) for x in args.bandwidth.split(",")):
                    link = LinkSpec(bandwidth_bps=gbps * 1e9, latency_us=args.latency)
                    cfg = ReplayConfig(workers=m, fabric=fabric, link=link, iters=args.iters)
                    t0 = time.perf_counter()
                    p = predict(trace, cfg)
                    predict_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    r = replay(trace, cfg)
                    replay_s = time.perf_counter() - t0
                    got = r.summary.iteration_us_median
                    err = (p.iteration_us_median - got) / got
                    errors.append((abs(err), model, m, fabric, gbps))
                    mid = sorted(r.iterations, key=lambda it: it.emulated_us)[(len(r.iterations) - 1) // 2]
                    print(f"| {model} | {m} | {fabric} | {gbps:g} | {got / 1e3:.3f} | {p.iteration_us_median / 1e3:.3f} "
                          f"| {100 * err:+.2f}% | {mid.exposed_comm_us / 1e3:.2f} / {p.exposed_comm_us / 1e3:.2f} "
                          f"| {replay_s:.1f} | {1e3 * predict_s:.1f} |", flush=True)
    errors.sort(reverse=True)
    print()
    print(f"worst |error| {100 * errors[0][0]:.2f}% ({errors[0][1]}, M={errors[0][2]}, {errors[0][3]}, "
          f"{errors[0][4]:g} Gb/s); median {100 * errors[len(errors) // 2][0]:.2f}%; "
          f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
