"""A window's point-to-point segments in one message: round trip exact, each host its part, and
every malformed batch refused before it is read."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.protocol import rows as row_ops
from emu.emulator.protocol import transport
from emu.emulator.protocol.transport import FrameError, Segment, SegmentBatch


def _segments() -> list[Segment]:
    rng = np.random.default_rng(3)
    return [Segment(0, "float32", 1, 2, 7, 0, 4096.0, 10.5, 12.25, rng.integers(-9, 9, 5) * 0.5),
            Segment(1, "bfloat16", 3, 0, 8, 2, 1e6, 11.0, 30.0, np.array([1.5, -2.0, 0.0])),
            Segment(0, "int64", 2, 1, 7, 1, 24.0, 9.0, 9.5, np.array([2.0**40, -3.0, 5.0])),
            Segment(0, "uint8", 0, 3, 9, 0, 2.0, 1.0, 1.0, np.array([0.0, 255.0])),
            Segment(0, "float16", 1, 0, 9, 3, 0.0, 2.0, 2.0, np.zeros(0))]


def _wire(batch: SegmentBatch) -> list[bytes]:
    return [bytes(memoryview(f)) for f in batch.frames()]


def test_round_trip_is_exact() -> None:
    segs = _segments()
    (batch,) = SegmentBatch.of(segs)
    back = SegmentBatch.parse(_wire(batch)).segments()
    assert len(back) == len(segs)
    for a, b in zip(segs, back, strict=True):
        assert (a.job, a.dtype, a.src, a.dst, a.seq, a.segment) == (b.job, b.dtype, b.src, b.dst, b.seq, b.segment)
        assert (a.emu_bytes, a.first_us, a.last_us) == (b.emu_bytes, b.first_us, b.last_us)
        assert np.array_equal(a.values, b.values)


def test_each_host_gets_its_part_in_order() -> None:
    segs = _segments()
    (batch,) = SegmentBatch.of(segs)
    mine = np.array([True, False, True, False, True])
    part = SegmentBatch.parse(_wire(batch.take(mine))).segments()
    assert [(s.src, s.segment) for s in part] == [(1, 0), (2, 1), (1, 3)]
    assert np.array_equal(part[1].values, segs[2].values)


def test_large_windows_split_into_bounded_messages(monkeypatch) -> None:
    monkeypatch.setattr(transport, "SEG_BATCH_BYTES", 24)
    segs = [Segment(0, "float32", 0, 1, 1, i, 16.0, 0.0, 1.0, np.ones(4)) for i in range(5)]
    batches = SegmentBatch.of(segs)
    assert [len(b) for b in batches] == [1] * 5  # 16 bytes each: two would pass the limit
    assert [s.segment for b in batches for s in b.segments()] == list(range(5))


def _forged(which: str) -> list[bytes]:
    (batch,) = SegmentBatch.of(_segments()[:2])
    kind, headers, meta, data = _wire(batch)
    if which == "torn header":
        headers = headers[:-1]
    elif which == "count mismatch":
        meta = meta[:transport.SEG_META.itemsize]
    elif which == "dtype":
        h = np.frombuffer(headers, transport.P2P_HEADER).copy()
        h["dtype"][0] = 200
        headers = h.tobytes()
    elif which == "payload":
        data = data + b"\0"
    elif which == "huge count":
        m = np.frombuffer(meta, transport.SEG_META).copy()
        m["elements"][0] = 1 << 62
        meta = m.tobytes()
    return [kind, headers, meta, data]


@pytest.mark.parametrize("which, why", [("torn header", "whole records"), ("count mismatch", "meta records"),
                                        ("dtype", "unknown dtype"), ("payload", "element counts"),
                                        ("huge count", "more elements")])
def test_forged_batches_are_refused(which: str, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        SegmentBatch.parse(_forged(which))


def test_frame_count_is_checked() -> None:
    with pytest.raises(FrameError, match="expected 4 frames"):
        SegmentBatch.parse([b"", b""])


@pytest.mark.parametrize("lengths", [[5000, 7000, 3000, 9000], [3, 0, 5, 1, 2, 7, 0, 4]], ids=["long", "short"])
def test_gather_is_the_rows_values_in_any_order(lengths: list[int]) -> None:
    """Long runs of consecutive rows are copied as slices, many short ones by index: the same
    values either way, in the order asked, a new array."""
    bounds = row_ops.row_bounds(np.asarray(lengths))
    values = np.arange(bounds[-1], dtype=np.float64)
    for rows in ([0, 1, 2, 3], [2, 3, 0], [3, 1, 2], [1], [], [3, 2, 1, 0]):
        got = row_ops.gather(values, bounds, np.asarray(rows, np.int64))
        want = values[row_ops.spans(bounds, np.asarray(rows, np.int64))]
        assert np.array_equal(got, want) and not np.shares_memory(got, values)


def test_rows_of_is_indexing_by_rows_masks_and_slices() -> None:
    """``rows_of`` gathers with ``np.take``: the same rows as indexing, for indices (repeated, in any
    order), boolean masks (which ``np.take`` alone would read as indices 0 and 1) and slices, on
    plain rows, narrow rows and structured headers."""
    rng = np.random.default_rng(3)
    headers = np.zeros(9, transport.AGG_HEADER)
    headers["chunk"] = rng.integers(0, 1 << 20, 9)
    for a in (rng.integers(-9, 9, (9, 64)).astype(np.int32), rng.integers(0, 9, (9, 2)).astype(np.uint32),
              rng.random(9), headers):
        mask = rng.random(9) < 0.5
        for rows in (np.array([8, 0, 3, 3, 1]), np.zeros(0, np.int64), mask, np.ones(9, bool), slice(2, 7)):
            got = row_ops.rows_of(a, rows)
            assert got.dtype == a.dtype and np.array_equal(got, a[rows])


def _rows_values(rows: transport.SegmentRows) -> list[list[float]]:
    return [rows.row_values(r).tolist() for r in range(len(rows))]


def test_rows_taken_sliced_and_joined_keep_their_values() -> None:
    """Rows share their values when taken, sliced or sorted, and ``concat`` joins the arrays of
    different parts: every row keeps its own values through any chain of these, ``flat`` gives them
    one row after another (a view where they already lie so), and a join never carries a part's
    array when it would mostly be unused."""
    rng = np.random.default_rng(5)
    segs = [Segment(0, "float32", int(rng.integers(0, 9)), int(rng.integers(0, 9)), 7, i, 8.0, float(i), float(i),
                    rng.integers(-9, 9, int(rng.integers(0, 6))) * 1.0) for i in range(40)]
    rows = transport.SegmentRows.of(segs)
    want = {s.segment: s.values.tolist() for s in segs}

    def check(r: transport.SegmentRows) -> None:
        assert [want[int(s)] for s in r.segment] == _rows_values(r)
        bounds, flat = r.flat()
        assert [flat[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)] == _rows_values(r)

    check(rows)
    assert np.shares_memory(rows.flat()[1], rows.values)  # in order: a view
    shuffled = rows.take(rng.permutation(40))
    assert shuffled.values is rows.values
    check(shuffled)
    joined = transport.SegmentRows.concat([shuffled.slice(0, 10), transport.SegmentRows.of(segs[:5]),
                                           rows.slice(30, 40), shuffled.slice(20, 25)])
    check(joined)
    check(joined.take(np.argsort(joined.t, kind="stable")))
    big = transport.SegmentRows.of([Segment(0, "float32", 0, 1, 7, 100 + i, 8.0, 0.0, 0.0, np.ones(3000))
                                    for i in range(10)])
    want.update({100 + i: [1.0] * 3000 for i in range(10)})
    few = transport.SegmentRows.concat([big.slice(9, 10), rows.slice(0, 2)])
    check(few)
    assert len(few.values) <= 2 * int(few.n.sum()) + transport._SPARE  # the other nine rows' values not carried


@pytest.mark.parametrize("high", [50, 1 << 40], ids=["packed", "too-wide"])
def test_lexsort_is_numpy_lexsort(high: int) -> None:
    """The packed sort gives ``np.lexsort``'s order, ties of the time resolved by the other keys,
    and falls back where the keys do not fit in one integer or go below 0."""
    rng = np.random.default_rng(7)
    for n in (0, 1, 7, 500, 600, 3000):
        keys = tuple(rng.integers(0, high, n) for _ in range(4)) + (rng.integers(0, 20, n) * 0.5,)
        assert np.array_equal(row_ops.lexsort(keys), np.lexsort(keys))
        negative = (keys[0] - 3, *keys[1:])
        assert np.array_equal(row_ops.lexsort(negative), np.lexsort(negative))


def test_a_hosts_part_is_the_same_in_few_runs_or_many() -> None:
    """``SegmentBatch.take`` copies a few runs of rows as slices and many by a mask over the bytes:
    either way the rows' headers, meta and bytes in order."""
    rng = np.random.default_rng(3)
    segs = [Segment(0, "float32", int(rng.integers(0, 9)), int(rng.integers(0, 9)), 1, i, 8.0, 1.0, 2.0,
                    rng.random(int(rng.integers(0, 5)))) for i in range(200)]
    (batch,) = SegmentBatch.of(segs)
    runs = set()
    for _ in range(200):
        k = int(rng.integers(1, 60))
        mask = np.repeat(rng.random(k) < 0.5, rng.multinomial(200, np.ones(k) / k))
        runs.add(int(np.count_nonzero(np.diff(mask, prepend=False, append=False))) > 2 * transport._TAKE_RUNS)
        part = SegmentBatch.parse(_wire(batch.take(mask))).segments()
        want = [s for s, m in zip(segs, mask, strict=True) if m]
        assert [(s.src, s.segment) for s in part] == [(s.src, s.segment) for s in want]
        assert all(np.array_equal(a.values, b.values.astype(np.float32)) for a, b in zip(part, want, strict=True))
    assert runs == {False, True}  # both ways taken
