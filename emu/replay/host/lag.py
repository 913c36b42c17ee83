"""Lag on the wall clock: how far behind its emulated time each event was handled.

Every event is counted (the first wave sampled only the first 200,000 of a host):
a histogram of geometric bins (40 per decade, from 1 ns to about 3 hours) keeps it
in constant memory; quantiles are read at a bin's upper edge, so they never
understate the lag. Histograms of several hosts add up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_PER_DECADE = 40
_LOW_US = 1e-3
_BINS = 13 * _PER_DECADE  # 1 ns .. 1e10 us


def _edge(i: int) -> float:
    """The upper edge of bin i (bin 0 holds lag <= 1 ns, on time included)."""
    return _LOW_US * 10 ** (i / _PER_DECADE)


class LagHistogram:
    def __init__(self) -> None:
        self.counts = np.zeros(_BINS + 1, dtype=np.int64)
        self.max_us = 0.0
        self.n = 0

    def add_many(self, lags_us: np.ndarray) -> None:
        if not len(lags_us):
            return
        lags = np.maximum(np.asarray(lags_us, dtype=np.float64), 0.0)
        idx = np.ceil(np.log10(np.maximum(lags, _LOW_US) / _LOW_US) * _PER_DECADE).astype(np.int64)
        np.add.at(self.counts, np.minimum(idx, _BINS), 1)
        self.max_us = max(self.max_us, float(lags.max()))
        self.n += len(lags)

    def merge(self, other: LagHistogram) -> None:
        self.counts += other.counts
        self.max_us = max(self.max_us, other.max_us)
        self.n += other.n

    def quantile(self, q: float) -> float:
        if not self.n:
            return 0.0
        i = int(np.searchsorted(np.cumsum(self.counts), q * self.n))
        return min(_edge(i) if i else 0.0, self.max_us) if i < _BINS else self.max_us

    def to_dict(self) -> dict[str, Any]:
        nz = np.flatnonzero(self.counts)
        return {"n": self.n, "max_us": self.max_us, "bins": [[int(i), int(self.counts[i])] for i in nz]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> LagHistogram:
        h = cls()
        for i, c in doc.get("bins", []):
            if 0 <= int(i) <= _BINS:
                h.counts[int(i)] += int(c)
        h.n = int(doc.get("n", 0))
        h.max_us = float(doc.get("max_us", 0.0))
        return h
