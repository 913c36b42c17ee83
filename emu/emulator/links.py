"""The link model: per endpoint an uplink and a downlink to the switch.

A link serializes packets one after another at its bandwidth (FIFO, store and
forward per packet) and then delays each by its propagation latency, plus a
uniform jitter in [0, jitter]; a packet is lost with probability ``loss``.
Everything is in emulated microseconds and computed from stamps, never from the
wall clock. Serialization uses wire bytes (``emu.emulator.wire``).

``LinkQueue.transmit`` solves the FIFO recurrence ``d_i = max(r_i, d_{i-1}) + s_i``
for a whole batch with numpy: with ``S_i = s_0 + ... + s_i``,
``d_i = S_i + max(free, max_{j<=i}(r_j - S_{j-1}))``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from emu.errors import ConfigError

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str) -> float:
    """'100Gbps', '400gbit', '10G', '1.5 Gb/s', 'inf' -> bits per second."""
    t = text.strip().lower().replace(" ", "")
    if t in ("inf", "ideal", "infinite"):
        return math.inf
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)([kmgt]?)(bps|bit/s|b/s|bit|b)?", t)
    if not m:
        raise ConfigError(f"--bandwidth {text!r}: give a number with a unit, e.g. 100Gbps, 400Gbit, 10G")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0:
        raise ConfigError(f"--bandwidth {text!r} must be positive")
    return value


def parse_duration_us(text: str, option: str = "--latency") -> float:
    """'5us', '1ms', '0', '2.5 µs', '1s' -> microseconds."""
    t = text.strip().lower().replace(" ", "").replace("µ", "u")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)(ns|us|ms|s)?", t)
    if not m:
        raise ConfigError(f"{option} {text!r}: give a duration with a unit, e.g. 5us, 1ms")
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, None: 1.0}[m.group(2)]
    return float(m.group(1)) * scale


@dataclass(frozen=True)
class LinkSpec:
    """One direction of an endpoint's link to the switch."""

    bandwidth_bps: float = 100e9
    latency_us: float = 5.0
    loss: float = 0.0
    jitter_us: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0:
            raise ConfigError(f"link bandwidth must be positive, got {self.bandwidth_bps}")
        if self.latency_us < 0 or self.jitter_us < 0:
            raise ConfigError("link latency and jitter must be 0 or more")
        if not 0 <= self.loss < 1:
            raise ConfigError(f"--loss must be in [0, 1), got {self.loss}")

    def serialization_us(self, wire_bytes: float | np.ndarray) -> float | np.ndarray:
        if math.isinf(self.bandwidth_bps):
            return wire_bytes * 0.0
        return wire_bytes * 8e6 / self.bandwidth_bps


class LinkQueue:
    """The FIFO state of one link direction of one endpoint."""

    def __init__(self, spec: LinkSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.free_us = 0.0  # when the link finishes serializing what it has
        self.last_ready_us = -math.inf  # for detecting batches handed over out of order
        self.reordered = 0

    def transmit(self, ready_us: np.ndarray, wire_bytes: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Packets ready at ``ready_us`` (in FIFO order) -> (arrival at the far end, lost mask)."""
        ready = np.asarray(ready_us, dtype=np.float64)
        n = len(ready)
        if n == 0:
            return ready, np.zeros(0, dtype=bool)
        if ready[0] < self.last_ready_us - 1e-6:
            self.reordered += 1
        self.last_ready_us = float(ready[-1])
        ser = np.broadcast_to(np.asarray(self.spec.serialization_us(np.asarray(wire_bytes, dtype=np.float64))), (n,))
        total = np.cumsum(ser)
        before = total - ser
        start = np.maximum.accumulate(np.maximum(ready - before, self.free_us))
        done = total + start
        self.free_us = float(done[-1])
        arrival = done + self.spec.latency_us
        if self.spec.jitter_us:
            arrival = arrival + self.rng.uniform(0.0, self.spec.jitter_us, n)
        lost = self.rng.random(n) < self.spec.loss if self.spec.loss else np.zeros(n, dtype=bool)
        return arrival, lost


class SegmentLink:
    """Point-to-point segments over a ``LinkQueue``: many packets, pipelined through the switch.

    Sending: the segment's packets leave back to back from ``max(ready, free)``; the
    switch has the first one after one packet's serialization and the latency, the
    last one after all of them. Receiving: the downlink starts on the first packet
    and cannot finish before the last one arrived plus its own serialization.
    """

    def __init__(self, queue: LinkQueue) -> None:
        self.q = queue

    def send(self, ready_us: float, wire_bytes: float, packets: int) -> tuple[float, float]:
        q = self.q
        if ready_us < q.last_ready_us - 1e-6:
            q.reordered += 1
        q.last_ready_us = ready_us
        ser = float(q.spec.serialization_us(wire_bytes))
        start = max(ready_us, q.free_us)
        q.free_us = start + ser
        return start + ser / packets + q.spec.latency_us, q.free_us + q.spec.latency_us

    def receive(self, first_us: float, last_us: float, wire_bytes: float, packets: int) -> float:
        q = self.q
        if first_us < q.last_ready_us - 1e-6:
            q.reordered += 1
        q.last_ready_us = first_us
        ser = float(q.spec.serialization_us(wire_bytes))
        done = max(max(first_us, q.free_us) + ser, last_us + ser / packets)
        q.free_us = done
        jitter = q.rng.uniform(0.0, q.spec.jitter_us) if q.spec.jitter_us else 0.0
        return done + q.spec.latency_us + jitter
