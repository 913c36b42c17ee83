"""Calibration: fit a link (bandwidth, latency) to a trace's observed collective times.

For every all_reduce with an observed time, the ring model predicts
``t = 2 (M-1) hops x L + 2 (M-1)/M x bytes / B`` (M the group size); least squares over
(bytes, observed) gives ``1 / B`` and the per-hop latency. Observed times include waiting
for the slowest rank, so the fit uses the fastest quarter of the collectives of each size.

Collectives that ran at the same time (gloo runs two on two threads, so DDP's buckets
overlap) share the link: each one's time is not its own bytes over B, and an alpha-beta fit
over them is meaningless (it can return a latency of a hundred milliseconds). Where they
overlap, the fit is the busy-period bound instead: the wire bytes of all the all_reduces of
an iteration over the union of their intervals, at its best over iterations and ranks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Compute, Iteration, Trace, Wait


@dataclass(frozen=True)
class LinkFit:
    bandwidth_bps: float
    latency_us: float
    samples: int
    method: str  # "alpha-beta", "busy period", or "bandwidth bound" when times do not grow with size

    def link(self) -> LinkSpec:
        return LinkSpec(bandwidth_bps=self.bandwidth_bps, latency_us=max(0.0, self.latency_us))


def _intervals(it: Iteration) -> list[tuple[float, float, Coll]]:
    """(start, end, op) of the iteration's all_reduces with observed times, on its timeline."""
    t, out = 0.0, []
    for op in it.ops:
        if isinstance(op, Compute):
            t += op.dur_us
        elif isinstance(op, Wait):
            t += op.blocked_us or 0.0
        elif isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE and op.observed_us and op.bytes > 0:
            out.append((t, t + op.observed_us, op))
    return out


def _overlap(spans: list[tuple[float, float, Coll]]) -> bool:
    spans = sorted(spans, key=lambda s: s[0])
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def _busy_period(spans_by_iteration: list[list[tuple[float, float, Coll]]]) -> LinkFit:
    best = 0.0  # megabits per us
    for spans in spans_by_iteration:
        if not spans:
            continue
        busy, end = 0.0, -np.inf
        for a, b, _ in sorted(spans, key=lambda s: s[0]):
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        bits = sum(2 * (op.group_size - 1) / op.group_size * op.bytes * 8 / 1e6 for _, _, op in spans)
        best = max(best, bits / busy)
    return LinkFit(bandwidth_bps=best * 1e12, latency_us=0.0, samples=len(spans_by_iteration), method="busy period")


def fit_link(trace: Trace) -> LinkFit:
    spans_by_iteration = [_intervals(it) for program in trace.ranks for it in program.iterations]
    if not any(spans_by_iteration):
        raise ConfigError("calibration needs all_reduce collectives with observed times; this trace has none")
    if any(_overlap(spans) for spans in spans_by_iteration):
        return _busy_period(spans_by_iteration)
    by_size: dict[tuple[int, int], list[float]] = defaultdict(list)
    for spans in spans_by_iteration:
        for _, _, op in spans:
            by_size[(op.bytes, op.group_size)].append(op.observed_us)
    rows = []
    for (size, m), times in by_size.items():
        fastest = np.sort(times)[: max(1, len(times) // 4)]
        hops = 2 * (m - 1)
        for t in fastest:
            rows.append((hops, hops / m * size * 8 / 1e6, t))  # bits in megabits: t = hops L + bits / B
    a = np.array([[h, bits] for h, bits, _ in rows])
    t = np.array([r[2] for r in rows])
    (latency, inv_bw), *_ = np.linalg.lstsq(a, t, rcond=None)
    # A latency that is most of the fastest collective's time is no link latency: the
    # times are then not growing with size the way a link's would.
    plausible = latency >= 0 and max(h for h, _, _ in rows) * latency < 0.5 * t.min()
    if len(by_size) >= 2 and inv_bw > 0 and plausible:
        # t in us, size in megabits: the slope is us per megabit
        return LinkFit(bandwidth_bps=float(1e12 / inv_bw), latency_us=float(latency), samples=len(rows),
                       method="alpha-beta")
    # Times that do not grow with size are dominated by waiting for the peer: the fastest
    # collective still bounds the bandwidth from below, with no latency left to fit.
    best = max(bits / t_us for _, bits, t_us in rows)  # megabits per us
    return LinkFit(bandwidth_bps=float(best * 1e12), latency_us=0.0, samples=len(rows), method="bandwidth bound")
