"""The parameter-server shards' key of a push (shard, collective, segment) as one int64."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.algorithms.server_sums import _unique_rows


@pytest.mark.parametrize("wide", [False, True])
def test_unique_rows_is_numpys_row_unique(wide: bool) -> None:
    """The same rows, first indices and inverse as ``np.unique(axis=0)``, whether the columns'
    ranges fit in one int64 key or not (then it is ``np.unique(axis=0)`` itself)."""
    rng = np.random.default_rng(1)
    shard, seq = rng.integers(0, 5, 2000), rng.integers(0, 3, 2000)
    segment = rng.integers(0, 1 << 40 if wide else 9, 2000)
    if wide:
        shard = shard << 30
    got = _unique_rows(shard, seq, segment)
    want = np.unique(np.stack([shard, seq, segment], axis=1), axis=0, return_index=True, return_inverse=True)
    assert all(np.array_equal(g, w.reshape(g.shape)) for g, w in zip(got, want, strict=True))
    assert len(got[0]) < 2000 or wide
