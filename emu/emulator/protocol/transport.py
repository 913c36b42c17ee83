"""The pyzmq framing between emu's processes: explicit binary layouts, never pickle.

Data messages are multipart: a one-byte kind, a small fixed ``struct`` frame and
numpy array frames. Every receiver checks the frame sizes against the counts
they claim and against ``MAX_FRAME`` before touching them. Control messages are
JSON objects of bounded size. The fabrics (emulator) serve over these frames,
and replay's hosts speak them, so the definitions live here, once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import numpy as np

from emu.emulator.protocol.rows import (
    distinct,
    every_row,
    gather,
    gather_at,
    indices,
    row_bounds,
    row_lengths,
    rows_of,
    spans,
)
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


def frame_bytes(frame: object) -> int:
    return memoryview(frame).nbytes  # bytes, zmq frame buffers and numpy arrays alike


def check_frames(frames: list, count: int) -> None:
    """``frames`` are ``count`` frames, none larger than ``MAX_FRAME``."""
    if len(frames) != count:
        raise FrameError(f"expected {count} frames, got {len(frames)}")
    if any(frame_bytes(f) > MAX_FRAME for f in frames):
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
        rows = rows if isinstance(rows, slice) else indices(rows)  # a mask's places once, not per field
        if not isinstance(rows, slice) and every_row(rows, len(self.headers)):
            return self  # every row in order (a window's batch sorted already, most often): nothing to copy
        return AggBatch(*(rows_of(a, rows) for a in (self.headers, self.payload, self.stamps, self.sparse,
                                                     self.packets)))

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
        check_frames(frames, 7)
        if frame_bytes(frames[1]) != _AGG_META.size:
            raise FrameError("bad batch meta")
        n, k = _AGG_META.unpack(frames[1])
        if (frame_bytes(frames[2]) != n * AGG_HEADER.itemsize or frame_bytes(frames[3]) != n * k * 4
                or frame_bytes(frames[4]) != n * 16 or frame_bytes(frames[5]) != n * 8 or frame_bytes(frames[6]) != n * 8):
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
SEG_FRAMES = 4  # a SegmentBatch's frames, its kind included
_TAKE_RUNS = 16  # runs of rows up to which SegmentBatch.take copies slices
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
        return [SEG, self.headers, self.meta, self.data]  # SEG_FRAMES

    @classmethod
    def parse(cls, frames: list) -> SegmentBatch:
        """From bytes or buffers (zero-copy frames), checked: the arrays view the message's memory."""
        check_frames(frames, SEG_FRAMES)
        if frame_bytes(frames[1]) % P2P_HEADER.itemsize or frame_bytes(frames[2]) % SEG_META.itemsize:
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
        """The segments ``rows`` (a mask), in order (the switch's part for one host): their data as a
        slice a run of rows where they lie in few runs (a parameter server's answers of one sum go
        to a host's workers one after another: 4.5 times faster for two runs of 1,500 rows of 96
        bytes), else by a mask over the bytes (twice as fast as by index, rows of 96 bytes taken
        every other)."""
        sizes = self._sizes()
        edges = np.flatnonzero(np.diff(rows, prepend=False, append=False))  # each run's first row and its end
        if len(edges) > 2 * _TAKE_RUNS:
            return SegmentBatch(self.headers[rows], self.meta[rows], self.data[np.repeat(rows, sizes)])
        at = row_bounds(sizes)[edges].tolist()
        data = [self.data[a:b] for a, b in zip(at[::2], at[1::2], strict=True)]
        return SegmentBatch(self.headers[rows], self.meta[rows],
                            np.concatenate(data) if data else self.data[:0].copy())

    def rows(self) -> SegmentRows:
        """As columns (values decoded to float64), for the endpoints that take a window's at once."""
        h, m = self.headers, self.meta
        n = m["elements"].astype(np.int64)
        code = h["dtype"].astype(np.int64)
        ints = [h[f].astype(np.int64) for f in ("job", "src", "dst", "seq", "segment")]
        return SegmentRows.packed([*ints, code, ints[2], m["emu_bytes"].astype(np.float64),
                                   m["first_us"].astype(np.float64), m["last_us"].astype(np.float64)],
                                  row_bounds(n), _decode(self.data, code, n))

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


_ROW_INTS = ("job", "src", "dst", "seq", "segment", "code", "key")
_ROW_FLOATS = ("emu_bytes", "t", "last")
_COLUMNS = (*_ROW_INTS, *_ROW_FLOATS, "lo", "n")
_SPARE = 4096  # values a joined part may carry unused beyond twice its own (SegmentRows.concat)


@dataclass(frozen=True)
class SegmentRows:
    """Point-to-point segments as columns, a window's at once between the stages of a host (where a
    ``Segment`` object per hand-off costs more than the hand-off): per row its header's fields, its
    emulated size and times, and where its values are in a flat float64 array (row r's are
    ``values[lo[r]:lo[r] + n[r]]``). Rows taken, sliced or sorted share their values: only the columns
    move (a parameter server's segments of a few elements each cost their values' gathering several
    times over, once per stage they waited in); ``flat`` gathers them once, where they are used.
    ``SegmentBatch`` is the same on the wire."""

    job: np.ndarray  # int64, as the header's fields
    src: np.ndarray
    dst: np.ndarray
    seq: np.ndarray
    segment: np.ndarray
    code: np.ndarray  # the values' dtype on the wire: an index of DTYPE_CODES
    # the order among rows of equal (t, seq, segment, src) waiting to be sent: the destination, or a
    # parameter-server shard's turn for it (emu.replay.host.p2p._reply_turns)
    key: np.ndarray
    emu_bytes: np.ndarray  # float64
    t: np.ndarray  # waiting to be sent: the send time; sent: the first packet at the switch (us)
    last: np.ndarray  # the last packet at the switch (us); the send time while waiting
    lo: np.ndarray  # int64: where each row's values begin in ``values``
    n: np.ndarray  # int64: how many values each row has
    values: np.ndarray  # float64; may hold other rows' values too (never written through)

    def __len__(self) -> int:
        return len(self.src)

    @staticmethod
    def empty() -> SegmentRows:
        """No rows: one read-only instance for all."""
        return _NO_ROWS

    @staticmethod
    def packed(columns: list[np.ndarray], bounds: np.ndarray, values: np.ndarray) -> SegmentRows:
        """From the ten columns (job to last, in the fields' order) and values one row after another
        (row r's ``values[bounds[r]:bounds[r + 1]]``, ``bounds`` from 0)."""
        return SegmentRows(*columns, bounds[:-1], row_lengths(bounds), values)

    def lengths(self) -> np.ndarray:
        return self.n

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's values one after another, and where each begins (bounds from 0, one more than
        the rows): a view where the rows already lie so in ``values``, else gathered."""
        bounds = row_bounds(self.n)
        lo = self.lo
        if not len(lo):
            return bounds, self.values[:0]
        start = int(lo[0])
        if bool((lo == bounds[:-1] + start).all()):
            return bounds, self.values[start:start + int(bounds[-1])]
        return bounds, gather_at(self.values, lo, self.n)

    def row_values(self, r: int) -> np.ndarray:
        """Row ``r``'s values (a view)."""
        lo = int(self.lo[r])
        return self.values[lo:lo + int(self.n[r])]

    def take(self, rows: np.ndarray) -> SegmentRows:
        """Rows ``rows`` (indices, in that order), their values shared."""
        rows = np.asarray(rows, np.int64)
        if every_row(rows, len(self)):
            return self
        return SegmentRows(*[getattr(self, f)[rows] for f in _COLUMNS], self.values)

    def slice(self, lo: int, hi: int) -> SegmentRows:
        """Rows ``lo`` to ``hi`` as views."""
        return SegmentRows(*[getattr(self, f)[lo:hi] for f in _COLUMNS], self.values)

    @staticmethod
    def concat(parts: list[SegmentRows]) -> SegmentRows:
        """The rows of ``parts`` one after another. Their values arrays are joined, each once, the
        rows pointing into the join; a part whose array it would carry mostly unused (more than
        twice its rows' values, past ``_SPARE``) is gathered first, so a long wait's rows never hold
        a window's values many times over."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return SegmentRows.empty()
        if len(parts) == 1:
            return parts[0]
        used: dict[int, int] = {}  # values array (by id) -> its elements the parts use
        for p in parts:
            used[id(p.values)] = used.get(id(p.values), 0) + int(p.n.sum())
        parts = [_compacted(p) if len(p.values) > 2 * used[id(p.values)] + _SPARE else p for p in parts]
        arrays: dict[int, tuple[int, np.ndarray]] = {}  # values array (by id) -> its offset in the join
        at = 0
        for p in parts:
            if id(p.values) not in arrays:
                arrays[id(p.values)] = (at, p.values)
                at += len(p.values)
        columns = [np.concatenate([getattr(p, f) for p in parts]) for f in _COLUMNS]
        if len(arrays) > 1:
            columns[-2] = np.concatenate([p.lo + arrays[id(p.values)][0] for p in parts])
        values = np.concatenate([a for _, a in arrays.values()]) if len(arrays) > 1 else parts[0].values
        return SegmentRows(*columns, values)

    @staticmethod
    def of(segs: list[Segment]) -> SegmentRows:
        """From ``Segment`` objects (sent: their times are the switch's)."""
        if not segs:
            return SegmentRows.empty()
        ints = np.array([(s.job, s.src, s.dst, s.seq, s.segment, DTYPE_CODES.index(s.dtype), s.dst) for s in segs],
                        np.int64).reshape(len(segs), 7)
        floats = np.array([(s.emu_bytes, s.first_us, s.last_us) for s in segs], np.float64).reshape(len(segs), 3)
        n = np.array([len(s.values) for s in segs], np.int64)
        values = np.concatenate([s.values for s in segs]).astype(np.float64, copy=False)
        return SegmentRows.packed([*ints.T.copy(), *floats.T.copy()], row_bounds(n), values)

    def segments(self) -> list[Segment]:
        """As ``Segment`` objects (sent: ``t`` and ``last`` are the first and last packets' times)."""
        b, values = self.flat()
        b = b.tolist()
        return [Segment(job, DTYPE_CODES[code], src, dst, seq, segment, e, t, last, values[b[r]:b[r + 1]])
                for r, (job, src, dst, seq, segment, code, e, t, last) in enumerate(zip(
                    self.job.tolist(), self.src.tolist(), self.dst.tolist(), self.seq.tolist(),
                    self.segment.tolist(), self.code.tolist(), self.emu_bytes.tolist(), self.t.tolist(),
                    self.last.tolist(), strict=True))]

    def batches(self) -> list[SegmentBatch]:
        """On the wire: batches in row order, each of at most ``SEG_BATCH_BYTES`` of data (or one row)."""
        if not len(self):
            return []
        sizes = self.lengths() * _ITEMSIZES[self.code]
        out, lo = [], 0
        ends = np.cumsum(sizes)
        while lo < len(self):
            base = int(ends[lo - 1]) if lo else 0
            hi = max(lo + 1, int(np.searchsorted(ends, base + SEG_BATCH_BYTES, side="right")))
            out.append(self._batch(np.arange(lo, hi)))
            lo = hi
        return out

    def _batch(self, rows: np.ndarray) -> SegmentBatch:
        part = self.take(rows)
        headers = np.zeros(len(part), P2P_HEADER)
        headers["msg_type"] = MsgType.P2P
        for name in ("job", "src", "dst", "seq", "segment"):
            headers[name] = getattr(part, name)
        headers["dtype"] = part.code
        meta = np.zeros(len(part), SEG_META)
        meta["emu_bytes"], meta["first_us"], meta["last_us"] = part.emu_bytes, part.t, part.last
        meta["elements"] = part.lengths()
        return SegmentBatch(headers, meta, _encode(part.flat()[1], part.code, part.lengths()))


def _encode(values: np.ndarray, code: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Rows' values, each in its dtype (``code``), to their bytes on the wire, one after another."""
    codes = distinct(code)  # one dtype, most often: no sort
    if len(codes) == 1:
        return np.frombuffer(encode_values(values, DTYPE_CODES[int(codes[0])]), np.uint8)
    size = n * _ITEMSIZES[code]
    out = np.empty(int(size.sum()), np.uint8)
    at = row_bounds(size)
    elems = row_bounds(n)
    for c in codes.tolist():
        rows = np.flatnonzero(code == c)
        out[spans(at, rows)] = np.frombuffer(encode_values(gather(values, elems, rows), DTYPE_CODES[c]), np.uint8)
    return out


def _decode(data: np.ndarray, code: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``_encode`` undone: float64 values, exact."""
    codes = distinct(code)  # one dtype, most often: no sort
    if len(codes) == 1:
        return decode_values(data, DTYPE_CODES[int(codes[0])]) if len(data) else np.zeros(0)
    size = n * _ITEMSIZES[code]
    out = np.empty(int(n.sum()))
    at = row_bounds(size)
    elems = row_bounds(n)
    for c in codes.tolist():
        rows = np.flatnonzero(code == c)
        out[spans(elems, rows)] = decode_values(np.ascontiguousarray(data[spans(at, rows)]), DTYPE_CODES[c])
    return out


def _no_rows() -> SegmentRows:
    ints, floats = np.zeros(0, np.int64), np.zeros(0)
    for a in (ints, floats):
        a.flags.writeable = False
    return SegmentRows(*[ints] * 7, *[floats] * 3, ints, ints, floats)


def _compacted(rows: SegmentRows) -> SegmentRows:
    """``rows`` with values of their own, one row after another."""
    bounds, values = rows.flat()
    return replace(rows, lo=bounds[:-1], values=values)


_NO_ROWS = _no_rows()
