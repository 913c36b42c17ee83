"""Loss under payload scale: the same lossy all_reduce at R = 1 (every emulated packet a real one,
the switch's real loss recovery), R = 16 and R = 64 (emulated packets' fate drawn per packet,
``emu.emulator.links.scaled_loss``), against the tail formula of docs/physics.md
(``emu.emulator.physics.forms.ina_loss_extra_us``). Prints the mean over seeds of what loss adds to
the loss-free time.

    .venv/bin/python benchmarks/scaled_loss.py [--mb 4] [--seeds 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from emu.emulator.links.spec import LinkSpec
from emu.emulator.physics import forms as physics
from emu.replay import ReplayConfig, replay
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

CASES = ((4, 100, None), (8, 100, None), (4, 10, None), (4, 100, 512))  # workers, Gb/s, --slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--loss", default="0.001,0.01,0.05")
    args = parser.parse_args()
    count = int(args.mb * 1e6 / 4)
    trace = single_collective(CollKind.ALL_REDUCE, count)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; one "
          f"all_reduce of {args.mb:g} MB float32 on ina, latency 5 us, mean over {args.seeds} seeds")
    print(f"{'M':>3} {'Gb/s':>5} {'pool':>5} {'loss':>6} {'clean us':>9} {'+R=1':>7} {'+R=16':>7} {'+R=64':>7} "
          f"{'+formula':>9} {'R64/R1':>7}")
    def run(m: int, gbps: float, slots: int | None, loss: float, scale: int, seed: int) -> float:
        link = LinkSpec(bandwidth_bps=gbps * 1e9, latency_us=5.0, loss=loss)
        config = ReplayConfig(workers=m, fabric="ina", link=link, iters=1, payload_scale=scale, seed=seed,
                              slots=slots)
        return replay(trace, config).summary.iteration_us_median

    for m, gbps, slots in CASES:
        clean = run(m, gbps, slots, 0.0, 64, 0)
        for loss in (float(x) for x in args.loss.split(",")):
            means = {r: statistics.mean(run(m, gbps, slots, loss, r, s) for s in range(args.seeds)) for r in (1, 16, 64)}
            cfg = ReplayConfig(workers=m, fabric="ina", link=LinkSpec(bandwidth_bps=gbps * 1e9, loss=loss),
                               slots=slots)
            formula = physics.ina_loss_extra_us(count, cfg.link, m, cfg.emulated_slots, cfg.timeout_rto_us)
            print(f"{m:>3} {gbps:>5g} {cfg.emulated_slots:>5} {loss:>6g} {clean:>9.0f} "
                  + " ".join(f"{means[r] - clean:>+7.0f}" for r in (1, 16, 64))
                  + f" {formula:>+9.0f} {means[64] / means[1]:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
