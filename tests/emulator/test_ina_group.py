"""The workers' INA state machine against the switch, without processes: exactness, loss, units."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator import fixedpoint
from emu.emulator.ina import InaGroup, InaParams, ResultCheck
from emu.emulator.switch import MULTICAST, AggregationSwitch


def run(workers: int, slots: int, k: int, sizes: list[int], dtype: str = "float32", loss: float = 0.0,
        seed: int = 0):
    p = InaParams(slots=slots, elements=k, workers=workers, job=0, seed=seed)
    g = InaGroup(np.arange(workers), p)
    sw = AggregationSwitch(slots, workers, k)
    colls = []
    for seq, n in enumerate(sizes):
        c = g.collective(seq, dtype, n, -(-n // k))
        c.start_us[:] = 0.0
        colls.append(c)
    check, rng, retx = ResultCheck(), np.random.default_rng(seed), []
    for _ in range(100_000):
        pk = g.next_packets(retx)
        retx = []
        if pk is None:
            break
        lost = rng.random(len(pk.local)) < loss
        retx += [(int(w), int(s), 0.0, 1.0) for w, s in zip(pk.local[lost], pk.headers["slot"][lost], strict=True)]
        res = sw.process(pk.headers[~lost], pk.payload[~lost])
        dest = res.headers["worker"].astype(int)
        pairs = [(w, i) for i, d in enumerate(dest) for w in (range(workers) if d == MULTICAST else [d])]
        li = np.array([w for w, _ in pairs], int)
        rb = np.array([i for _, i in pairs], int)
        gone = rng.random(len(li)) < loss
        retx += [(int(w), int(res.headers["slot"][i]), 0.0, 1.0) for w, i in zip(li[gone], rb[gone], strict=True)]
        g.on_results(li[~gone], rb[~gone], res.headers, res.payload, np.ones((~gone).sum()), None,
                     np.full(len(res.headers), -1), check)
    return colls, check, sw.stats


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
