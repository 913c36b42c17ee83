"""Calibration: fit a link (bandwidth, latency) to a trace's observed collective times.

For every all_reduce with an observed time, the ring model predicts
``t = 2 (M-1) hops x L + 2 (M-1)/M x bytes / B`` (M the group size); least squares over
(bytes, observed) gives ``1 / B`` and the per-hop latency. Observed times include waiting
for the slowest rank, so the fit uses the fastest quarter of the collectives of each size.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from emu.emulator.links import LinkSpec
from emu.errors import ConfigError
from emu.traces.model import CollKind, Trace


@dataclass(frozen=True)
class LinkFit:
    bandwidth_bps: float
    latency_us: float
    samples: int
    method: str  # "alpha-beta", or "bandwidth bound" when the times do not grow with size

    def link(self) -> LinkSpec:
        return LinkSpec(bandwidth_bps=self.bandwidth_bps, latency_us=max(0.0, self.latency_us))


def fit_link(trace: Trace) -> LinkFit:
    by_size: dict[tuple[int, int], list[float]] = defaultdict(list)
    for program in trace.ranks:
        for it in program.iterations:
            for op in it.colls:
                if op.kind == CollKind.ALL_REDUCE and op.observed_us and op.bytes > 0:
                    by_size[(op.bytes, op.group_size)].append(op.observed_us)
    rows = []
    for (size, m), times in by_size.items():
        fastest = np.sort(times)[: max(1, len(times) // 4)]
        hops = 2 * (m - 1)
        for t in fastest:
            rows.append((hops, hops / m * size * 8 / 1e6, t))  # bits in megabits: t = hops L + bits / B
    if not rows:
        raise ConfigError("calibration needs all_reduce collectives with observed times; this trace has none")
    a = np.array([[h, bits] for h, bits, _ in rows])
    t = np.array([r[2] for r in rows])
    (latency, inv_bw), *_ = np.linalg.lstsq(a, t, rcond=None)
    if len(by_size) >= 2 and inv_bw > 0 and latency >= 0:
        # t in us, size in megabits: the slope is us per megabit
        return LinkFit(bandwidth_bps=float(1e12 / inv_bw), latency_us=float(latency), samples=len(rows),
                       method="alpha-beta")
    # Times that do not grow with size are dominated by waiting for the peer: the fastest
    # collective still bounds the bandwidth from below, with no latency left to fit.
    best = max(bits / t_us for _, bits, t_us in rows)  # megabits per us
    return LinkFit(bandwidth_bps=float(best * 1e12), latency_us=0.0, samples=len(rows), method="bandwidth bound")
