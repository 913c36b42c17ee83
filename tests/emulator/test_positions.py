"""Where each row's values lie: ``positions`` and ``gather_at``, the element indices a parameter
server's segments are gathered by at every stage."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.emulator.protocol.rows import gather_at, positions


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 12)), max_size=60))
def test_positions_are_each_rows_range_one_after_another(rows: list[tuple[int, int]]) -> None:
    """Rows anywhere, overlapping or not, out of order, some without elements."""
    lo = np.array([a for a, _ in rows], np.int64)
    n = np.array([k for _, k in rows], np.int64)
    want = [p for a, k in rows for p in range(a, a + k)]
    assert positions(lo, n).tolist() == want
    values = np.arange(10_020, dtype=np.float64) * 0.5
    assert gather_at(values, lo, n).tolist() == [values[p] for p in want]
