"""Sparse against dense on the shipped ``dlrm`` sample: INA, ring and parameter server.

For every point (fabric, workers, bandwidth; latency 5 us, one iteration, payload scale auto, the
synchronized clock), replays the ``dlrm`` sample twice: with the trace's sparsity (the default,
``SparsityOption()``) and dense (``SparsityOption.parse("none")``), and compares the median
iteration (emulated) and the bytes on the wire (``summary.bytes_sent``). Each replay is also
compared with the closed form,
``emu.study.predict.predict``. Prints a markdown table (docs/sparse.md, "Measured: dlrm, sparse
against dense").

The ring's wall time grows as M^2: before the grid, one dense ring replay at 128 workers (or the
largest asked) is timed, and a point whose estimated wall time would take the total past
``--budget`` seconds is skipped (and listed).

    .venv/bin/python benchmarks/sparse.py [--workers 8,32,128,256] [--bandwidth 10,25,100]
        [--fabrics ring,ps,ina] [--payload-scale R] [--budget 900]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import SparsityOption
from emu.study.predict import predict
from emu.traces import load_trace, sample_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="8,32,128,256")
    parser.add_argument("--bandwidth", default="10,25,100", help="Gb/s")
    parser.add_argument("--fabrics", default="ring,ps,ina")
    parser.add_argument("--latency", type=float, default=5.0, help="one-way, microseconds")
    parser.add_argument("--payload-scale", type=int, default=None, help="R; default auto")
    parser.add_argument("--budget", type=float, default=900.0,
                        help="wall seconds: skip points whose estimate would take the total past it")
    args = parser.parse_args()
    workers = sorted(int(x) for x in args.workers.split(","))
    gbpss = [float(x) for x in args.bandwidth.split(",")]
    fabrics = args.fabrics.split(",")
    trace = load_trace(sample_path("dlrm"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"trace dlrm (the shipped sample), latency {args.latency:g} us, 1 iteration, "
          f"payload scale {args.payload_scale or 'auto'}, "
          f"synchronized clock")
    start = time.perf_counter()

    def run(m: int, fabric: str, gbps: float, sparsity: SparsityOption) -> tuple[object, float, float]:
        link = LinkSpec(bandwidth_bps=gbps * 1e9, latency_us=args.latency)
        cfg = ReplayConfig(workers=m, fabric=fabric, link=link, iters=1, sparsity=sparsity,
                           payload_scale=args.payload_scale)
        t0 = time.perf_counter()
        r = replay(trace, cfg)
        wall = time.perf_counter() - t0
        got = r.summary.iteration_us_median
        err = (predict(trace, cfg).iteration_us_median - got) / got
        return r, err, wall

    # The probe: one dense ring replay at the reference size; the cost of a replay of M workers is
    # then estimated as probe * (M / ref)^2 (the ring's messages grow as M^2; ps and ina less).
    ref = 128 if 128 in workers else workers[-1]
    probe = run(ref, "ring", gbpss[0], SparsityOption.parse("none"))[2]
    print(f"probe: one dense ring replay at {ref} workers, {gbpss[0]:g} Gb/s: {probe:.1f} s wall; "
          f"estimate per replay: {probe:.1f} s x (M / {ref})^2; budget {args.budget:g} s")
    print()
    print("| fabric | workers | Gb/s | sparse ms | dense ms | speedup | sparse MB | dense MB | sent_fraction "
          "| algorithm (sparse / dense collectives) | predict error (sparse, dense) | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |")
    skipped = []
    for m in workers:
        for fabric in fabrics:
            for gbps in gbpss:
                estimate = 2 * probe * (m / ref) ** 2
                if time.perf_counter() - start + estimate > args.budget:
                    skipped.append(f"{fabric} {m} workers {gbps:g} Gb/s (estimated {estimate:.0f} s)")
                    continue
                dense, dense_err, wall = run(m, fabric, gbps, SparsityOption.parse("none"))
                dense_ms = dense.summary.iteration_us_median / 1e3
                dense_mb = dense.summary.bytes_sent / 1e6
                sparse, sparse_err, sparse_wall = run(m, fabric, gbps, SparsityOption())
                wall += sparse_wall
                sparse_ms = sparse.summary.iteration_us_median / 1e3
                s = sparse.sparsity
                algorithm = "sparse" if s.sparse_collectives and not s.dense_collectives else (
                    "dense (fallback)" if s.dense_collectives and not s.sparse_collectives else "mixed")
                print(f"| {fabric} | {m} | {gbps:g} | {sparse_ms:.2f} | {dense_ms:.2f} | {dense_ms / sparse_ms:.2f}x "
                      f"| {sparse.summary.bytes_sent / 1e6:.1f} | {dense_mb:.1f} | {s.sent_fraction:.3f} "
                      f"| {algorithm} ({s.sparse_collectives} / {s.dense_collectives}) "
                      f"| {100 * sparse_err:+.1f}%, {100 * dense_err:+.1f}% | {wall:.1f} |", flush=True)
    print()
    if skipped:
        print(f"skipped (past the {args.budget:g} s budget): " + "; ".join(skipped))
    else:
        print("skipped: none")
    print(f"total wall {time.perf_counter() - start:.0f} s (probe included)")


if __name__ == "__main__":
    main()
