"""The link model's description: a link's bandwidth (constant or a schedule), latency, jitter and
loss (``LinkSpec``), their parsing, and the map between time and work done on a link whose rate
changes (``Capacity``). The links themselves, many endpoints' at once, are
``emu.emulator.links.array.LinkArray``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from emu.errors import ConfigError

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
# What a link can be: 1 kbit/s to 100 Tbit/s (or ideal), at most a day of latency or jitter.
MIN_BPS, MAX_BPS = 1e3, 1e14
MAX_DELAY_US = 86400e6


def parse_bandwidth(text: str) -> float:
    """'100Gbps', '400Gbit', '10G', '1.5 Gb/s' -> bits per second; bytes with a capital B ('100GBps',
    '12.5 GB/s': 8 bits each); 'ideal' (or 'inf'): infinite."""
    t = text.strip().replace(" ", "")
    if t.lower() in ("inf", "ideal", "infinite"):
        return math.inf
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)([kKmMgGtT]?)(bps|bit/s|b/s|bit|b|Bps|B/s|Byte/s|B)?", t)
    if not m:
        raise ConfigError(f"--bandwidth {text!r}: give a number with a unit, e.g. 100Gbps, 400Gbit, 10G, 12.5GB/s")
    bits = 8.0 if (m.group(3) or "").startswith("B") else 1.0
    value = float(m.group(1)) * _UNITS[m.group(2).lower()] * bits
    if not MIN_BPS <= value <= MAX_BPS:
        raise ConfigError(f"--bandwidth {text!r} is {value:g} bit/s: give 1kbps to 100Tbps, or ideal")
    return value


def format_bandwidth(bps: float | None, sep: str = "") -> str:
    """A link rate as people write it, ``parse_bandwidth`` reads back (to ``%g``'s digits):
    '25Gbps'; 'ideal' for an infinite link (None in reports)."""
    if bps is None or bps == math.inf:
        return "ideal"
    for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{sep}{unit}"
    return f"{bps:g}{sep}bps"


def parse_duration_us(text: str, option: str = "--latency") -> float:
    """'5us', '1ms', '0', '2.5 µs', '1s' -> microseconds (at most a day); a bare number other than 0
    is refused (is 5 microseconds or milliseconds? the user says)."""
    t = text.strip().lower().replace(" ", "").replace("µ", "u")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)(ns|us|ms|s)?", t)
    if not m:
        raise ConfigError(f"{option} {text!r}: give a duration with a unit, e.g. 5us, 1ms")
    if m.group(2) is None and float(m.group(1)) != 0:  # 0 needs none: it is 0 in every unit
        raise ConfigError(f"{option} {text!r} has no unit: give one, e.g. {m.group(1)}us or {m.group(1)}ms")
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, None: 1.0}[m.group(2)]
    value = float(m.group(1)) * scale
    if not value <= MAX_DELAY_US:
        raise ConfigError(f"{option} {text!r}: at most a day (86400s)")
    return value


@dataclass(frozen=True)
class LinkSpec:
    """One direction of an endpoint's link to the switch."""

    bandwidth_bps: float = 100e9
    latency_us: float = 5.0
    loss: float = 0.0
    jitter_us: float = 0.0
    # a bandwidth that changes over emulated time: (from_us, bits per second) steps, the first from
    # 0 at ``bandwidth_bps``; empty: constant (``--bandwidth-schedule``, ``parse_schedule``)
    schedule: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if not (MIN_BPS <= self.bandwidth_bps <= MAX_BPS or self.bandwidth_bps == math.inf):
            raise ConfigError(f"link bandwidth must be 1 kbit/s to 100 Tbit/s or ideal, got {self.bandwidth_bps:g}")
        if self.schedule:
            times = [t for t, _ in self.schedule]
            if times[0] != 0 or self.schedule[0][1] != self.bandwidth_bps or times != sorted(set(times)):
                raise ConfigError("--bandwidth-schedule: steps start at 0s with the link's bandwidth and go forward "
                                  "in time, e.g. 0s:100Gbps,2s:10Gbps")
            if any(not MIN_BPS <= b <= MAX_BPS for _, b in self.schedule):
                raise ConfigError("--bandwidth-schedule: every step's bandwidth must be 1 kbit/s to 100 Tbit/s")
        if not (0 <= self.latency_us <= MAX_DELAY_US and 0 <= self.jitter_us <= MAX_DELAY_US):
            raise ConfigError("link latency and jitter must be 0 to a day")
        if not 0 <= self.loss < 1:
            raise ConfigError(f"--loss must be in [0, 1), got {self.loss}")

    def serialization_us(self, wire_bytes: float | np.ndarray) -> float | np.ndarray:
        """At ``bandwidth_bps`` (with a schedule: its first step's, the links' reference rate)."""
        if math.isinf(self.bandwidth_bps):
            return wire_bytes * 0.0
        return wire_bytes * 8e6 / self.bandwidth_bps

    def bandwidth_at(self, t_us: float) -> float:
        """The bandwidth at emulated time ``t_us`` (the schedule's step then, else the constant)."""
        rate = self.bandwidth_bps
        for start, bps in self.schedule:
            if start <= t_us:
                rate = bps
        return rate

    @property
    def peak_bps(self) -> float:
        """The highest bandwidth the link ever has (what bounds how soon anything arrives)."""
        return max([self.bandwidth_bps, *(b for _, b in self.schedule)])


def parse_schedule(text: str) -> tuple[tuple[float, float], ...]:
    """'0s:100Gbps,2s:10Gbps' -> ((0, 1e11), (2e6, 1e10)): from each time on, that bandwidth."""
    steps = []
    for part in text.split(","):
        when, sep, rate = part.strip().partition(":")
        if not sep:
            raise ConfigError(f"--bandwidth-schedule {text!r}: give TIME:BANDWIDTH steps, e.g. 0s:100Gbps,2s:10Gbps")
        steps.append((parse_duration_us(when, "--bandwidth-schedule"), parse_bandwidth(rate)))
    if any(math.isinf(b) for _, b in steps):
        raise ConfigError(f"--bandwidth-schedule {text!r}: every step needs a finite bandwidth")
    return tuple(steps)


class Capacity:
    """Emulated time <-> the link's work: ``C(t)``, the microseconds of serialization at the
    reference rate the link can do by time ``t`` (the integral of its bandwidth over the
    reference). A FIFO link's recurrence ``d_i = max(r_i, d_{i-1}) + s_i`` holds in work
    coordinates whatever the bandwidth does, since ``C`` is increasing: so a link with a schedule
    maps its times in, solves as before, and maps them back, exactly. Without a schedule both
    maps are the identity."""

    def __init__(self, spec: LinkSpec) -> None:
        self.active = bool(spec.schedule) and not math.isinf(spec.bandwidth_bps)
        if self.active:
            self.t = np.array([t for t, _ in spec.schedule])
            self.rate = np.array([b for _, b in spec.schedule]) / spec.bandwidth_bps
            self.c = np.r_[0.0, np.cumsum(np.diff(self.t) * self.rate[:-1])]

    def to(self, t: np.ndarray | float) -> np.ndarray:
        if not self.active:
            return t if type(t) is float else np.asarray(t, np.float64)  # type: ignore[return-value]
        t = np.asarray(t, np.float64)
        k = np.maximum(np.searchsorted(self.t, t, side="right") - 1, 0)
        return self.c[k] + (t - self.t[k]) * self.rate[k]  # before 0: the first rate, extended

    def back(self, c: np.ndarray | float) -> np.ndarray:
        if not self.active:
            return c if type(c) is float else np.asarray(c, np.float64)  # type: ignore[return-value]
        c = np.asarray(c, np.float64)
        k = np.maximum(np.searchsorted(self.c, c, side="right") - 1, 0)
        return self.t[k] + (c - self.c[k]) / self.rate[k]
