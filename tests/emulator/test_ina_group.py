"""The workers' INA state machine against the switch, without processes: exactness, loss, units."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.protocol import fixedpoint
from emu.emulator.protocol.ina import InaGroup, InaParams


def run(workers: int, slots: int, k: int, sizes: list[int], dtype: str = "float32", loss: float = 0.0,
        seed: int = 0):
    """Dense collectives of ``sizes`` through the group and the switch (tests/emulator/test_sparse_ina.py)."""
    from tests.emulator.test_sparse_ina import run as stream

    g, check, stats, _ = stream(workers, slots, k, [(n, None) for n in sizes], dtype, loss, seed, sparse_stream=False)
    return g.colls, check, stats


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_exact_sums_across_collectives(dtype: str) -> None:
    colls, check, stats = run(5, 8, 64, [1000, 64, 5, 3000], dtype)
    assert all(c.finished.all() for c in colls)
    assert check.mismatches == 0 and check.elements == 5 * (1000 + 64 + 5 + 3000)  # every worker's copy
    assert stats.duplicates == 0


def test_exact_under_ten_percent_loss() -> None:
    colls, check, stats = run(4, 4, 256, [5000], loss=0.10, seed=3)
    assert colls[0].finished.all()
    assert check.mismatches == 0 and check.elements >= 5000
    assert stats.duplicates > 0 and stats.answered > 0


def test_unit_path_equals_float_fixed_point() -> None:
    """The integer shortcut the workers take is fixedpoint.quantize of the float values, exactly."""
    p = InaParams(slots=4, elements=64, workers=7, job=0, seed=1)
    g = InaGroup(np.arange(7), p)
    c = g.collective(0, "float32", 1000, 16)
    c.agreed[:] = 3
    li, blocks = np.repeat(np.arange(7), 3), np.tile(np.array([0, 5, 15]), 7)
    values = g.values(c, li, blocks)
    assert np.array_equal(g.exponents(c, li, blocks), fixedpoint.block_exponents(values))
    c.agreed[blocks] = g.exponents(c, li, blocks).reshape(7, 3).max(axis=0)[np.tile(np.arange(3), 7)]
    assert np.array_equal(g.quantized(c, li, blocks), fixedpoint.quantize(values, c.agreed[blocks], 7))
