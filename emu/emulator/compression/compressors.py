"""Gradient compressors of the GRACE family, with bit-packed wire formats (docs/compression.md).

Each compressor turns one worker's gradient (a float32 vector of ``n`` elements) into the bytes
it would put on the wire, and back. The bytes are bit-packed, so that their count is the true
compressed size, indices and scales included (GRACE's own code sends whole int32 or float32 for
each, which overstates sign and ternary methods about 8x). Each compressor says how its outputs
are combined:

- ``ALL_REDUCE``: the compressed form can be summed as it is (fp16, randomk with a seed shared by
  the workers, PowerSGD's factors), so the collective is an all_reduce of it;
- ``ALL_GATHER``: it cannot (top-k's indices differ per worker, signs with scales), so every
  worker gathers every other's bytes and sums what they decompress to; its bytes per worker
  grow with the number of workers.

Error feedback (``ErrorFeedback``) keeps, per worker, what compression dropped and adds it to the
next gradient (GRACE's residual memory), for the compressors whose ``feedback`` is set.
Everything here is numpy and deterministic given the seed: a replay's numbers do not vary.
"""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from emu.errors import ConfigError


class Aggregation(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"


# -- bit packing ------------------------------------------------------------------------------------

def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned integers below ``2**bits``, ``bits`` each, big-endian, into bytes (the last padded)."""
    v = np.asarray(values, dtype=np.uint64)
    if bits == 0 or v.size == 0:
        return np.zeros(0, np.uint8)
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    return np.packbits(((v[:, None] >> shifts) & np.uint64(1)).astype(np.uint8).ravel())


def unpack_bits(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``count`` integers ``pack_bits`` packed."""
    if bits == 0 or count == 0:
        return np.zeros(count, np.uint64)
    flat = np.unpackbits(np.asarray(data, np.uint8))[: count * bits].reshape(count, bits).astype(np.uint64)
    return flat @ (np.uint64(1) << np.arange(bits - 1, -1, -1, dtype=np.uint64))


def packed_bytes(count: int, bits: int) -> int:
    return -(-count * bits // 8)


def index_bits(n: int) -> int:
    """Bits an index into ``n`` elements needs."""
    return max(1, (n - 1).bit_length())


def _f32(data: np.ndarray) -> np.ndarray:
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), "<f4")


def _bytes(x: np.ndarray) -> np.ndarray:
    return np.frombuffer(np.asarray(x, "<f4").tobytes(), np.uint8)


# -- compressors ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compressor:
    """A compressor with its parameter (a ratio, levels, a rank; see ``COMPRESSORS``)."""

    name: ClassVar[str]
    aggregation: ClassVar[Aggregation]
    feedback: ClassVar[bool] = False  # error feedback (GRACE's residual memory)
    vote: ClassVar[bool] = False  # ``combine`` is a majority vote, not a sum (signsgd)
    values: ClassVar[str] = "float32"  # an ALL_REDUCE compressor's summed values (fp16: float16)
    default: ClassVar[float | None] = None
    param: float | None = None

    def check(self) -> None:
        """Refuse a parameter out of range (ConfigError naming ``--compress``)."""

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        """One worker's gradient to its bytes on the wire (uint8)."""
        raise NotImplementedError

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        """Bytes back to ``n`` float32 (for ALL_REDUCE compressors: of a sum of compressed forms)."""
        raise NotImplementedError

    def wire_bytes(self, n: int) -> int:
        """Bytes one worker sends for ``n`` elements (the expected count where it varies: dgc)."""
        raise NotImplementedError

    def combine(self, parts: list[np.ndarray]) -> np.ndarray:
        """The aggregate of the workers' decompressed gradients (a sum; sign methods vote)."""
        return np.sum(parts, axis=0, dtype=np.float64).astype(np.float32)

    def takes(self, is_float: bool, itemsize: int, count: int) -> bool:
        """Whether this compressor compresses an all_reduce of ``count`` elements of a dtype
        (the one rule of replay's ``--compress`` and emu run's): floats only, and fp16 leaves
        16-bit tensors alone (nothing to gain)."""
        return is_float and count > 0 and not (self.values == "float16" and itemsize <= 2)

    @property
    def label(self) -> str:
        return self.name if self.param is None else f"{self.name}:{self.param:g}"

    def _ratio(self) -> float:
        assert self.param is not None
        if not 0 < self.param <= 1:
            raise ConfigError(f"--compress {self.label}: the ratio must be in (0, 1], e.g. {self.name}:0.01")
        return self.param

    def _k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self._ratio() * n)))


class NoCompression(Compressor):
    name, aggregation = "none", Aggregation.ALL_REDUCE

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        return _bytes(x)

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        return _f32(data).copy()

    def wire_bytes(self, n: int) -> int:
        return 4 * n


class Fp16(Compressor):
    name, aggregation, values = "fp16", Aggregation.ALL_REDUCE, "float16"

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        return np.frombuffer(np.asarray(x, "<f2").tobytes(), np.uint8)

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        return np.frombuffer(np.asarray(data, np.uint8).tobytes(), "<f2").astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return 2 * n


class TopK(Compressor):
    """The ``k = ceil(r n)`` largest magnitudes: values (float32) and indices (bit-packed)."""

    name, aggregation, feedback, default = "topk", Aggregation.ALL_GATHER, True, 0.01

    def check(self) -> None:
        self._ratio()

    def _select(self, x: np.ndarray, seed: int) -> np.ndarray:
        k = self._k(len(x))
        return np.sort(np.argpartition(np.abs(x), len(x) - k)[len(x) - k:])

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        idx = self._select(x, seed)
        return np.concatenate([_bytes(x[idx]), pack_bits(idx, index_bits(len(x)))])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        k = self._k(n)
        out = np.zeros(n, np.float32)
        out[unpack_bits(data[4 * k:], index_bits(n), k).astype(np.int64)] = _f32(data[: 4 * k])
        return out

    def wire_bytes(self, n: int) -> int:
        return 4 * self._k(n) + packed_bytes(self._k(n), index_bits(n))


class RandomK(TopK):
    """``k`` elements at indices drawn from a seed every worker shares: only the values cross, and
    they can be summed (an all_reduce), as in GRACE with a shared seed."""

    name, aggregation = "randomk", Aggregation.ALL_REDUCE

    def _select(self, x: np.ndarray, seed: int) -> np.ndarray:
        n = len(x)
        return np.sort(np.random.default_rng(seed).choice(n, self._k(n), replace=False))

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        return _bytes(x[self._select(x, seed)])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        out = np.zeros(n, np.float32)
        out[np.sort(np.random.default_rng(seed).choice(n, self._k(n), replace=False))] = _f32(data)
        return out

    def wire_bytes(self, n: int) -> int:
        return 4 * self._k(n)


class Dgc(TopK):
    """Deep gradient compression: the threshold that keeps a fraction ``r`` is estimated from a
    sample (1% of the elements, at least 10,000: the tail it measures holds ``r`` of them), so the
    count varies: a 4-byte count leads the message."""

    name = "dgc"

    def _select(self, x: np.ndarray, seed: int) -> np.ndarray:
        n = len(x)
        rng = np.random.default_rng(seed)
        sample = np.abs(x[rng.integers(0, n, max(10_000, n // 100))]) if n else np.zeros(0)
        cut = np.quantile(sample, 1 - self._ratio()) if len(sample) else 0.0
        idx = np.flatnonzero(np.abs(x) >= cut)
        return idx if len(idx) else np.array([int(np.argmax(np.abs(x)))])

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        idx = self._select(x, seed)
        head = np.frombuffer(np.uint32(len(idx)).astype("<u4").tobytes(), np.uint8)
        return np.concatenate([head, _bytes(x[idx]), pack_bits(idx, index_bits(len(x)))])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        k = int(np.frombuffer(np.asarray(data[:4], np.uint8).tobytes(), "<u4")[0])
        out = np.zeros(n, np.float32)
        out[unpack_bits(data[4 + 4 * k:], index_bits(n), k).astype(np.int64)] = _f32(data[4: 4 + 4 * k])
        return out

    def wire_bytes(self, n: int) -> int:
        return 4 + super().wire_bytes(n)


class Qsgd(Compressor):
    """QSGD: the norm (float32), then per element a sign bit and a level in 0..s, rounded
    stochastically (unbiased), in ``1 + ceil(log2(s + 1))`` bits."""

    name, aggregation, default = "qsgd", Aggregation.ALL_GATHER, 64

    def _levels(self) -> int:
        assert self.param is not None
        s = int(self.param)
        if s != self.param or not 1 <= s <= 2**16:
            raise ConfigError(f"--compress {self.label}: the levels must be an integer in 1..65536, e.g. qsgd:64")
        return s

    def check(self) -> None:
        self._levels()

    def _bits(self) -> int:
        return 1 + max(1, self._levels().bit_length())

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        s = self._levels()
        norm = np.float32(np.linalg.norm(x.astype(np.float64)))
        scaled = np.abs(x) / norm * s if norm > 0 else np.zeros(len(x))
        level = np.floor(scaled + np.random.default_rng(seed).random(len(x))).astype(np.uint64)
        code = (np.minimum(level, s) << np.uint64(1)) | (x < 0).astype(np.uint64)
        return np.concatenate([_bytes(np.array([norm])), pack_bits(code, self._bits())])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        norm = _f32(data[:4])[0]
        code = unpack_bits(data[4:], self._bits(), n)
        sign = np.where(code & np.uint64(1), -1.0, 1.0)
        return (sign * (code >> np.uint64(1)).astype(np.float64) / self._levels() * norm).astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return 4 + packed_bytes(n, self._bits())


class TernGrad(Compressor):
    """TernGrad: the largest magnitude (float32) and per element -1, 0 or +1 in 2 bits, kept with
    probability |x| / max (unbiased)."""

    name, aggregation = "terngrad", Aggregation.ALL_GATHER

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        scale = np.float32(np.abs(x).max()) if len(x) else np.float32(0)
        keep = np.random.default_rng(seed).random(len(x)) < (np.abs(x) / scale if scale > 0 else 0)
        code = np.where(keep, np.where(x < 0, 2, 1), 0).astype(np.uint64)
        return np.concatenate([_bytes(np.array([scale])), pack_bits(code, 2)])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        scale = _f32(data[:4])[0]
        code = unpack_bits(data[4:], 2, n)
        return (np.select([code == 1, code == 2], [1.0, -1.0], 0.0) * scale).astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return 4 + packed_bytes(n, 2)


class SignSgd(Compressor):
    """signSGD with majority vote: one bit per element; the aggregate is the sign of the votes."""

    name, aggregation, vote = "signsgd", Aggregation.ALL_GATHER, True

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        return np.packbits(x >= 0)

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        return np.where(np.unpackbits(np.asarray(data, np.uint8))[:n] == 1, 1.0, -1.0).astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return packed_bytes(n, 1)

    def combine(self, parts: list[np.ndarray]) -> np.ndarray:
        """The majority vote; a tie (an even number of workers) is +1, as in GRACE."""
        return np.where(np.sum(parts, axis=0) >= 0, 1.0, -1.0).astype(np.float32)


class EfSignSgd(SignSgd):
    """EF-signSGD: one bit per element scaled by the mean magnitude (float32), error feedback."""

    name, feedback, vote = "efsignsgd", True, False

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        scale = np.float32(np.abs(x).mean()) if len(x) else np.float32(0)
        return np.concatenate([_bytes(np.array([scale])), np.packbits(x >= 0)])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        return super().decompress(data[4:], n, seed) * _f32(data[:4])[0]

    def wire_bytes(self, n: int) -> int:
        return 4 + packed_bytes(n, 1)

    def combine(self, parts: list[np.ndarray]) -> np.ndarray:
        return Compressor.combine(self, parts)


class OneBit(EfSignSgd):
    """1-bit SGD: one bit per element; the mean of the non-negative and of the negative elements
    (two float32) stand for them; error feedback."""

    name = "onebit"

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        pos = x >= 0
        means = np.array([x[pos].mean() if pos.any() else 0.0, x[~pos].mean() if (~pos).any() else 0.0])
        return np.concatenate([_bytes(means), np.packbits(pos)])

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        hi, lo = _f32(data[:8])
        return np.where(np.unpackbits(np.asarray(data[8:], np.uint8))[:n] == 1, hi, lo).astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return 8 + packed_bytes(n, 1)


class Natural(Compressor):
    """Natural compression: each magnitude rounded stochastically to a power of two (unbiased), sent
    as a sign bit and an 8-bit exponent (0: zero): 9 bits."""

    name, aggregation = "natural", Aggregation.ALL_GATHER
    _BIAS = 127

    def compress(self, x: np.ndarray, seed: int) -> np.ndarray:
        mag = np.abs(x.astype(np.float64))
        nz = mag > 0
        low = np.floor(np.log2(np.where(nz, mag, 1.0)))
        up = np.random.default_rng(seed).random(len(x)) < (mag / np.exp2(low) - 1)
        e = np.clip(low + up + self._BIAS, 1, 254)  # 255 would decode to 2^128: inf in float32
        code = np.where(nz, e, 0).astype(np.uint64) << np.uint64(1) | (x < 0).astype(np.uint64)
        return pack_bits(code, 9)

    def decompress(self, data: np.ndarray, n: int, seed: int) -> np.ndarray:
        code = unpack_bits(data, 9, n)
        e = (code >> np.uint64(1)).astype(np.int64)
        mag = np.where(e > 0, np.exp2(e - self._BIAS), 0.0)
        return (np.where(code & np.uint64(1), -mag, mag)).astype(np.float32)

    def wire_bytes(self, n: int) -> int:
        return packed_bytes(n, 9)


@dataclass(frozen=True)
class PowerSgd(Compressor):
    """PowerSGD of rank ``r`` on each matrix of the bucket (its parameter shapes, the trace's
    ``tensors``): ``P = M Q`` is all-reduced and orthogonalized, then ``Q = M^T P`` all-reduced, and
    ``M ~ P Q^T``; vectors, and matrices too small to gain, cross as they are (as PyTorch's
    PowerSGD hook does). Two all_reduces of float32; error feedback."""

    name, aggregation, feedback, default = "powersgd", Aggregation.ALL_REDUCE, True, 1
    shapes: tuple[tuple[int, ...], ...] | None = None

    def _rank(self) -> int:
        assert self.param is not None
        r = int(self.param)
        if r != self.param or not 1 <= r <= 1024:
            raise ConfigError(f"--compress {self.label}: the rank must be an integer in 1..1024, e.g. powersgd:4")
        return r

    def check(self) -> None:
        self._rank()

    def _layout(self, n: int) -> list[tuple[int, int, bool]]:
        """Per tensor: (rows, columns, compressed)."""
        if self.shapes is None:
            raise ConfigError(f"--compress {self.label}: PowerSGD needs the bucket's parameter shapes (the trace's "
                              "'tensors' key), which this all_reduce lacks; capture with record_shapes, or pick "
                              "another compressor")
        out, r = [], self._rank()
        for shape in self.shapes:
            rows = shape[0] if len(shape) >= 2 else 1
            cols = math.prod(shape) // max(rows, 1) if shape else 1
            out.append((rows, cols, len(shape) >= 2 and (rows + cols) * r < rows * cols))
        if sum(rows * cols for rows, cols, _ in out) != n:
            raise ConfigError(f"--compress {self.label}: the bucket's shapes hold "
                              f"{sum(r_ * c for r_, c, _ in out)} elements, not its {n}")
        return out

    def sizes(self, n: int) -> tuple[int, int]:
        """Elements of the two all_reduces: the P factors (with the tensors sent whole), the Q factors."""
        r = self._rank()
        first = sum(rows * r if comp else rows * cols for rows, cols, comp in self._layout(n))
        second = sum(cols * r for _, cols, comp in self._layout(n) if comp)
        return first, second

    def wire_bytes(self, n: int) -> int:
        return 4 * sum(self.sizes(n))

    def aggregate(self, grads: list[np.ndarray], seed: int) -> np.ndarray:
        """The sum PowerSGD gives for the workers' gradients (one step, from a shared random Q)."""
        r, at = self._rank(), 0
        out = np.zeros(len(grads[0]), np.float64)
        rng = np.random.default_rng(seed)
        for rows, cols, comp in self._layout(len(grads[0])):
            size = rows * cols
            mats = [g[at: at + size].astype(np.float64).reshape(rows, cols) for g in grads]
            if comp:
                q0 = rng.standard_normal((cols, r))
                p = sum(m @ q0 for m in mats)
                p, _ = np.linalg.qr(p)
                q = sum(m.T @ p for m in mats)
                out[at: at + size] = (p @ q.T).ravel()
            else:
                out[at: at + size] = sum(m.ravel() for m in mats)
            at += size
        return out.astype(np.float32)


COMPRESSORS: dict[str, type[Compressor]] = {c.name: c for c in (
    NoCompression, Fp16, TopK, RandomK, Dgc, Qsgd, TernGrad, SignSgd, EfSignSgd, OneBit, Natural, PowerSgd)}


def parse_compress(text: str) -> Compressor:
    """``NAME`` or ``NAME:PARAM`` (``--compress``) to a compressor; ConfigError naming the option."""
    name, _, value = text.strip().lower().partition(":")
    cls = COMPRESSORS.get(name)
    if cls is None:
        import difflib

        near = difflib.get_close_matches(name, COMPRESSORS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"--compress {text!r}: unknown compressor{hint}; one of {', '.join(COMPRESSORS)} "
                          "(or adaptive[:FLOOR] for emu replay)")
    if value and cls.default is None:
        raise ConfigError(f"--compress {text!r}: {name} takes no parameter; give --compress {name}")
    try:
        param = float(value) if value else cls.default
    except ValueError:
        raise ConfigError(f"--compress {text!r}: {value!r} is not a number") from None
    if param is not None and not math.isfinite(param):
        raise ConfigError(f"--compress {text!r}: the parameter must be a finite number")
    comp = cls(param=param)
    comp.check()
    return comp


def aggregate(comp: Compressor, grads: list[np.ndarray], seed: int) -> np.ndarray:
    """What the workers end with: their compressed gradients, decompressed and combined."""
    if isinstance(comp, PowerSgd):
        return comp.aggregate(grads, seed)
    n = len(grads[0])
    shared = comp.aggregation == Aggregation.ALL_REDUCE  # one seed for all: randomk's indices agree
    return comp.combine([comp.decompress(comp.compress(g, s), n, s)
                         for s, g in ((seed if shared else seed + w, g) for w, g in enumerate(grads))])


def message_seed(comp: Compressor, base: int, index: int, worker: int) -> int:
    """Worker ``worker``'s draws for collective ``index`` (from ``base``, a run's seed): the
    indices of a compressor whose forms are summed (randomk's) agree across the workers, every
    other draw is the worker's own."""
    shared = comp.aggregation == Aggregation.ALL_REDUCE
    return (base * 1_000_003 + index * 4099 + (0 if shared else worker)) % (1 << 63)


def mirrored(comp: Compressor, parts: list[np.ndarray], mirror: int) -> np.ndarray:
    """The aggregate (float64) of workers that each send one of ``parts`` (decompressed), ``mirror``
    workers a part: ``mirror`` times their sum, a vote as it is."""
    combined = comp.combine(parts).astype(np.float64)
    return combined if comp.vote else combined * mirror


class ErrorFeedback:
    """Per worker and collective position, what compression dropped, added to the next gradient."""

    def __init__(self, comp: Compressor) -> None:
        self.comp = comp
        self.residual: dict[tuple[int, Hashable], np.ndarray] = {}

    def step(self, worker: int, position: Hashable, x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The bytes worker sends for gradient ``x``, and what they decompress to; ``position``
        names the tensor the residual belongs to (a collective's place in the iteration)."""
        if self.comp.feedback:
            x = x + self.residual.get((worker, position), 0.0)
        data = self.comp.compress(x, seed)
        back = self.comp.decompress(data, len(x), seed)
        if self.comp.feedback:
            self.residual[(worker, position)] = (x - back).astype(np.float32)
        return data, back

    def message(self, worker: int, position: Hashable, x: np.ndarray, seed: int) -> np.ndarray:
        """The bytes worker sends for ``x`` (``step``'s), without decompressing them where the
        compressor keeps no residual (its time is compress time only)."""
        if self.comp.feedback:
            return self.step(worker, position, x, seed)[0]
        return self.comp.compress(x, seed)


_SPEED_FILE = Path(__file__).with_name("speed.json")  # benchmarks/compress_speed.py writes it


@functools.lru_cache(maxsize=1)
def _speeds() -> dict[str, list[dict[str, float | None]]]:
    """Per compressor, its measured rows, by parameter (None: it takes none)."""
    doc = json.loads(_SPEED_FILE.read_text())
    if doc.get("version") != 2:
        raise ConfigError(f"{_SPEED_FILE}: not a version 2 speed file (one row per parameter measured); run "
                          "benchmarks/compress_speed.py again")
    return {name: sorted(rows, key=lambda r: -math.inf if r["param"] is None else float(r["param"]))
            for name, rows in doc["elements_per_s"].items()}


def rates(comp: Compressor) -> tuple[float, float]:
    """(compress, decompress) elements a second at ``comp``'s parameter: the seconds an element
    measured at the parameters either side, interpolated linearly in the parameter's logarithm,
    the nearest measured parameter outside the range measured (``speed.json``)."""
    rows = _speeds()[comp.name]
    if comp.param is None or rows[0]["param"] is None or len(rows) == 1:
        return float(rows[0]["compress"]), float(rows[0]["decompress"])  # type: ignore[arg-type]
    at = math.log(comp.param)
    logs = [math.log(float(r["param"])) for r in rows]  # type: ignore[arg-type]
    j = min(max(1, sum(1 for g in logs if g <= at)), len(rows) - 1)
    t = min(1.0, max(0.0, (at - logs[j - 1]) / (logs[j] - logs[j - 1])))
    return tuple(1.0 / ((1 - t) / float(rows[j - 1][k]) + t / float(rows[j][k]))  # type: ignore[return-value, arg-type]
                 for k in ("compress", "decompress"))


def cost_us(comp: Compressor, n: int, workers: int, speed: float = 1.0,
            summed: bool = False) -> tuple[float, float]:
    """(compress, decompress) time of one worker for ``n`` elements, from the throughputs measured
    on the build machine at the compressor's parameter (``rates``), ``speed`` times faster.
    Decompressing an all_gather's output is ``workers`` messages (and their sum); an all_reduce's,
    or what a switch ``summed``, one."""
    compress, decompress = rates(comp)
    messages = workers if comp.aggregation == Aggregation.ALL_GATHER and not summed else 1
    return 1e6 * n / compress / speed, 1e6 * n * messages / decompress / speed
