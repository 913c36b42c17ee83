"""The pyzmq framing between emu's processes: explicit binary layouts, never pickle.

Data messages are multipart: a one-byte kind, a small fixed ``struct`` frame and
numpy array frames. Every receiver checks the frame sizes against the counts
they claim and against ``MAX_FRAME`` before touching them. Control messages are
JSON objects of bounded size. The fabrics (emulator) serve over these frames,
and replay's hosts speak them, so the definitions live here, once.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from emu.emulator.protocol.wire import AGG_HEADER, DTYPE_CODES, P2P_HEADER, PAYLOAD, MsgType
from emu.errors import RunFailed
from emu.traces.model import Dtype

MAX_FRAME = 256 << 20  # no emu message needs more; a larger frame is an error

AGG = b"A"  # contributions, host -> switch
RESULTS = b"R"  # results, switch -> host
SEG = b"P"  # point-to-point segments (a SegmentBatch), either way
HELLO = b"H"  # a host's first message on the data socket: the switch can route to it from then on
GO = b"G"  # synchronized clock, switch -> host: handle every event up to the bound
DONE = b"D"  # synchronized clock, host -> switch: the window is handled; when the next event is


class FrameError(RunFailed, ValueError):
    """A message that does not match its declared layout (between emu's own processes: a run that
    failed, exit code 1)."""


_AGG_META = struct.Struct("<II")  # packets, elements per packet


def _nbytes(frame: object) -> int:
    return memoryview(frame).nbytes  # bytes, zmq frame buffers and numpy arrays alike


def _check(frames: list, count: int) -> None:
    if len(frames) != count:
        raise FrameError(f"expected {count} frames, got {len(frames)}")
    if any(_nbytes(f) > MAX_FRAME for f in frames):
        raise FrameError("frame larger than MAX_FRAME")


@dataclass
class AggBatch:
    headers: np.ndarray  # AGG_HEADER
    payload: np.ndarray  # (n, k) int32: native when built, a big-endian view when parsed
    stamps: np.ndarray  # (n, 2) float64: emulated times of the first and last packet each row stands for
    # (n, 2) uint32: the sparse stream's (block, next) of each row (wire.SPARSE_FIELDS); zeros for dense rows
    sparse: np.ndarray | None = None
    # (n,) float64: the emulated packets each row stands for at the switch's pipeline (a switch with a
    # packet rate: docs/topology.md); ones where unknown
    packets: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.sparse is None:
            self.sparse = np.zeros((len(self.headers), 2), np.uint32)
        if self.packets is None:
            self.packets = np.ones(len(self.headers))

    def take(self, rows: np.ndarray | slice) -> AggBatch:
        assert self.sparse is not None and self.packets is not None
        return AggBatch(self.headers[rows], self.payload[rows], self.stamps[rows], self.sparse[rows],
                        self.packets[rows])

    @classmethod
    def concat(cls, parts: list[AggBatch]) -> AggBatch:
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("headers", "payload", "stamps",
                                                                            "sparse", "packets")))

    def frames(self, kind: bytes) -> list[bytes | np.ndarray]:
        n, k = self.payload.shape if self.payload.ndim == 2 else (len(self.headers), 0)
        assert self.sparse is not None and self.packets is not None
        return [kind, _AGG_META.pack(n, k), self.headers.astype(AGG_HEADER, copy=False),
                np.ascontiguousarray(self.payload.astype(PAYLOAD, copy=False)),
                np.ascontiguousarray(self.stamps.astype("<f8").reshape(n, 2)),
                np.ascontiguousarray(self.sparse.astype("<u4", copy=False).reshape(n, 2)),
                np.ascontiguousarray(self.packets.astype("<f8").reshape(n))]

    @classmethod
    def parse(cls, frames: list) -> AggBatch:
        """From bytes or buffers (zero-copy frames): the arrays view the message's memory."""
        _check(frames, 7)
        if _nbytes(frames[1]) != _AGG_META.size:
            raise FrameError("bad batch meta")
        n, k = _AGG_META.unpack(frames[1])
        if (_nbytes(frames[2]) != n * AGG_HEADER.itemsize or _nbytes(frames[3]) != n * k * 4
                or _nbytes(frames[4]) != n * 16 or _nbytes(frames[5]) != n * 8 or _nbytes(frames[6]) != n * 8):
            raise FrameError(f"batch of {n} packets of {k} elements has frames of the wrong size")
        headers = np.frombuffer(frames[2], AGG_HEADER)
        # a view of the network-order bytes: numpy converts as it reads, without a copy pass
        payload = np.frombuffer(frames[3], PAYLOAD).reshape(n, k)
        return cls(headers, payload, np.frombuffer(frames[4], "<f8").reshape(n, 2),
                   np.frombuffer(frames[5], "<u4").reshape(n, 2), np.frombuffer(frames[6], "<f8"))


def encode_values(values: np.ndarray, dtype: str) -> bytes:
    """Exact values of a collective's dtype to their bytes on the wire."""
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return values.astype(_NP[dtype]).tobytes()


def decode_values(data: bytes, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(data, _NP[dtype]).astype(np.float64)


_NP = {d.value: d.numpy for d in Dtype}
ITEMSIZE = {d.value: d.itemsize for d in Dtype}
_ITEMSIZES = np.array([ITEMSIZE[d] for d in DTYPE_CODES], np.int64)  # by dtype code


@dataclass(slots=True)
class Segment:
    """A point-to-point segment: its header's fields (``P2P_HEADER`` on the wire, plain ints
    between the stages of one process, where a record per segment costs more than the hand-off
    around it), emulated size and timing, real data."""

    job: int
    dtype: str
    src: int
    dst: int
    seq: int  # the collective's number in the job's stream
    segment: int  # the segment's number in the collective's layout
    emu_bytes: float
    first_us: float  # first packet fully received by the switch
    last_us: float  # last packet fully received by the switch
    values: np.ndarray  # float64

    def at(self, first_us: float, last_us: float) -> Segment:
        """The same segment, its first and last packets at these times (past a leaf's link)."""
        return Segment(self.job, self.dtype, self.src, self.dst, self.seq, self.segment, self.emu_bytes,
                       first_us, last_us, self.values)


# a batch's per-segment fields besides the header: emulated payload bytes, first/last packet ready
# at the switch (us), real elements
SEG_META = np.dtype([("emu_bytes", "<f8"), ("first_us", "<f8"), ("last_us", "<f8"), ("elements", "<u8")])
SEG_BATCH_BYTES = 64 << 20  # the real data of one batch message at most (a quarter of MAX_FRAME)


@dataclass(frozen=True)
class SegmentBatch:
    """Point-to-point segments in one message (a host's of one window, or the part of them the
    switch forwards to one host): per segment a ``P2P_HEADER`` and a ``SEG_META`` record, and every
    segment's values in its dtype, one after another. One message a window, not one a segment: a
    zmq message costs more than the hand-off it carries."""

    headers: np.ndarray  # P2P_HEADER
    meta: np.ndarray  # SEG_META
    data: np.ndarray  # uint8: the values' bytes

    @staticmethod
    def of(segs: list[Segment]) -> list[SegmentBatch]:
        """Batches of ``segs``, in order, each of at most ``SEG_BATCH_BYTES`` of data (or one segment)."""
        out, part, size = [], [], 0
        for seg in segs:
            n = len(seg.values) * ITEMSIZE[seg.dtype]
            if part and size + n > SEG_BATCH_BYTES:
                out.append(SegmentBatch._pack(part))
                part, size = [], 0
            part.append(seg)
            size += n
        if part:
            out.append(SegmentBatch._pack(part))
        return out

    @staticmethod
    def _pack(segs: list[Segment]) -> SegmentBatch:
        headers = np.array([(MsgType.P2P, DTYPE_CODES.index(s.dtype), s.job, s.src, s.dst, s.seq, s.segment)
                            for s in segs], P2P_HEADER)
        meta = np.array([(s.emu_bytes, s.first_us, s.last_us, len(s.values)) for s in segs], SEG_META)
        data = b"".join(encode_values(s.values, s.dtype) for s in segs)
        return SegmentBatch(headers, meta, np.frombuffer(data, np.uint8))

    def __len__(self) -> int:
        return len(self.headers)

    def frames(self) -> list:
        return [SEG, self.headers, self.meta, self.data]

    @classmethod
    def parse(cls, frames: list) -> SegmentBatch:
        """From bytes or buffers (zero-copy frames), checked: the arrays view the message's memory."""
        _check(frames, 4)
        if _nbytes(frames[1]) % P2P_HEADER.itemsize or _nbytes(frames[2]) % SEG_META.itemsize:
            raise FrameError("bad segment batch: its header or meta frame is not whole records")
        headers, meta = np.frombuffer(frames[1], P2P_HEADER), np.frombuffer(frames[2], SEG_META)
        if len(headers) != len(meta):
            raise FrameError(f"segment batch of {len(headers)} headers has {len(meta)} meta records")
        codes = headers["dtype"].astype(np.int64)
        if len(codes) and int(codes.max()) >= len(DTYPE_CODES):
            raise FrameError(f"unknown dtype code {int(codes.max())}")
        if meta["elements"].max(initial=0) > MAX_FRAME:
            raise FrameError("segment batch claims more elements than a frame can hold")
        data = np.frombuffer(frames[3], np.uint8)
        if int((meta["elements"].astype(np.int64) * _ITEMSIZES[codes]).sum()) != len(data):
            raise FrameError("segment batch payload does not match its element counts")
        return cls(headers, meta, data)

    def _sizes(self) -> np.ndarray:
        return self.meta["elements"].astype(np.int64) * _ITEMSIZES[self.headers["dtype"].astype(np.int64)]

    def take(self, rows: np.ndarray) -> SegmentBatch:
        """The segments ``rows`` (a mask), in order (the switch's part for one host)."""
        return SegmentBatch(self.headers[rows], self.meta[rows], self.data[np.repeat(rows, self._sizes())])

    def segments(self) -> list[Segment]:
        ends = np.cumsum(self._sizes()).tolist()
        out, at = [], 0
        for h, m, end in zip(self.headers.tolist(), self.meta.tolist(), ends, strict=True):
            _, code, job, src, dst, seq, segment = h
            dtype = DTYPE_CODES[code]
            out.append(Segment(job, dtype, src, dst, seq, segment, m[0], m[1], m[2],
                               decode_values(self.data[at:end], dtype)))
            at = end
        return out


_WINDOW = struct.Struct("<QdB")  # window number, time (us), flag


def _window(frames: list) -> tuple[int, float, int]:
    """The fields of a Go or Done message, checked against its layout."""
    _check(frames, 2)
    if _nbytes(frames[1]) != _WINDOW.size:
        raise FrameError("bad window message")
    return _WINDOW.unpack(frames[1])


@dataclass(frozen=True)
class Go:
    """Window ``window`` of the synchronized clock: handle events before ``bound_us`` (at or
    before it when ``inclusive``: zero lookahead, where a window is one round at one time)."""

    window: int
    bound_us: float
    inclusive: bool

    def frames(self) -> list[bytes]:
        return [GO, _WINDOW.pack(self.window, self.bound_us, self.inclusive)]

    @classmethod
    def parse(cls, frames: list) -> Go:
        window, bound, inclusive = _window(frames)
        return cls(window, bound, bool(inclusive))


@dataclass(frozen=True)
class Departures:
    """When a host's uplinks (FIFOs) can next start to send what it has not sent, for the clock's
    bound (``emu.replay.switch.daemon.Windows``): ``local_us``, the earliest from what the host
    holds (per link, the later of its free time and the next event that can make it send);
    ``free_us``, the least free time of all links (what a segment can wake); per slot pool of
    the switch (its number in the headers' job field), ``waiting``: (the least free time of the
    links whose workers wait for one of its results, which only they can receive; the earliest
    of its results the host holds for its stamp). -inf: unknown."""

    free_us: float = -math.inf
    local_us: float = -math.inf
    waiting: tuple[tuple[float, float], ...] = ()

    @classmethod
    def least(cls, all_: list[Departures]) -> Departures:
        """Every field's least, pool by pool (several jobs in one host, or every host at the switch)."""
        if not all_:
            return cls(math.inf, math.inf)
        pools = max(len(d.waiting) for d in all_)
        pad = [(*d.waiting, *[(math.inf, math.inf)] * (pools - len(d.waiting))) for d in all_]
        return cls(min(d.free_us for d in all_), min(d.local_us for d in all_),
                   tuple((min(p[g][0] for p in pad), min(p[g][1] for p in pad)) for g in range(pools)))

    def frame(self) -> bytes:
        return np.asarray([self.free_us, self.local_us, *(x for w in self.waiting for x in w)], "<f8").tobytes()

    @classmethod
    def parse(cls, frame: object) -> Departures:
        n = _nbytes(frame)
        if n % 16 != 0 or not 16 <= n <= 16 * (1 + MAX_POOLS):
            raise FrameError("bad departures in a window report")
        v = np.frombuffer(frame, "<f8").tolist()  # type: ignore[call-overload]
        return cls(v[0], v[1], tuple((v[i], v[i + 1]) for i in range(2, len(v), 2)))


MAX_POOLS = 1 << 16  # slot pools a window report may name (jobs and sub-groups)
_DONE = struct.Struct("<QdB")  # window number, next event (us), flag


@dataclass(frozen=True)
class Done:
    """A host handled window ``window``; its earliest remaining event is at ``next_us`` (inf: none);
    ``finished``: every worker it runs has run its whole program; ``departures``: when its
    uplinks can next send."""

    window: int
    next_us: float
    finished: bool
    departures: Departures = Departures()

    def frames(self) -> list[bytes]:
        return [DONE, _DONE.pack(self.window, self.next_us, self.finished), self.departures.frame()]

    @classmethod
    def parse(cls, frames: list) -> Done:
        _check(frames, 3)
        if _nbytes(frames[1]) != _DONE.size:
            raise FrameError("bad window report")
        window, next_us, finished = _DONE.unpack(frames[1])
        return cls(window, next_us, bool(finished), Departures.parse(frames[2]))
