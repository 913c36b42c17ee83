"""The leaves' links to the spine (emu.replay.host.leaves): a segment waits as its numbers (``_Seg``)
and crosses exactly as the one-row arrays it stood for before (``_Seg.rows``), alone or beside
aggregation rows in one window."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Topology
from emu.emulator.protocol.transport import AggBatch, Segment
from emu.emulator.protocol.wire import AGG_HEADER
from emu.replay.host.leaves import LeafStage, _Seg


def _segments(rng: np.random.Generator, n: int) -> list[tuple[int, Segment, float, int]]:
    out = []
    for i in range(n):
        first = float(rng.uniform(0, 50))
        seg = Segment(0, "float32", int(rng.integers(0, 8)), int(rng.integers(0, 8)), int(rng.integers(0, 3)), i,
                      4096.0, first, first + float(rng.uniform(0, 5)), np.arange(3, dtype=np.float64) + i)
        out.append((int(rng.choice([0, 3])), seg, float(rng.uniform(1000, 9000)), int(rng.integers(1, 7))))
    return out


def _batch(rng: np.random.Generator, n: int) -> AggBatch:
    h = np.zeros(n, AGG_HEADER)
    h["chunk"], h["worker"], h["job"] = rng.integers(0, 4, n), rng.integers(0, 8, n), 0
    first = np.sort(rng.uniform(0, 50, n))
    return AggBatch(h, np.zeros((n, 4), np.int32), np.stack([first, first + 1.0], 1), None, np.ones(n))


def _run(as_rows: bool, with_batch: bool, direction: int) -> tuple[list, dict, float, list]:
    """Segments (and rows) through a stage of two leaves, jitter on, in two windows: what comes out."""
    rng = np.random.default_rng(11)
    spine = Topology(workers_per_node=1, leaf_ports=2).spine_link(LinkSpec(bandwidth_bps=1e10, jitter_us=3.0))
    stage = LeafStage(np.array([0, 3]), spine, seed=7)
    for leaf, seg, wire, packets in _segments(rng, 40):
        if as_rows:  # the form every segment took before ``_Seg``
            stage._push(direction, _Seg(stage.index[leaf], seg.first_us, seg.last_us, wire, float(packets), seg).rows())
        else:
            stage.segment(direction, leaf, seg, wire, packets)
    if with_batch:
        b = _batch(rng, 12)
        stage.batch(direction, rng.choice([0, 3], 12), b, np.full(12, 1500.0), np.ones(12))
    out: list = []
    on_segment = lambda s: out.append(("seg", s.src, s.dst, s.seq, s.segment, s.first_us, s.last_us,  # noqa: E731
                                       s.values.tolist()))
    on_batch = lambda b, tags: out.append(("rows", b.headers["chunk"].tolist(), b.stamps.tolist()))  # noqa: E731
    horizon = np.array([30.0, 10.0]) if direction == 0 else None
    stage.advance(direction, 25.0, False, on_segment, on_batch, horizon)
    stage.advance(direction, 1e9, True, on_segment, on_batch)
    return out, stage.bytes_by_job, stage.bytes_sent, [b.tolist() for b in stage.busy_us]


@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize("with_batch", [False, True])
def test_a_segment_crosses_a_leaf_as_its_one_row_arrays_did(direction: int, with_batch: bool) -> None:
    got = _run(False, with_batch, direction)
    assert got == _run(True, with_batch, direction)
    assert sum(1 for o in got[0] if o[0] == "seg") == 40 and (any(o[0] == "rows" for o in got[0]) == with_batch)
