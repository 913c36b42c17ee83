"""The switch under a network's faults: packets reordered and duplicated between the workers and
the switch still give exact sums, and the duplicates are answered or dropped, never summed twice."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.protocol.ina import InaGroup, InaParams, ResultCheck
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reordered_and_duplicated_contributions_sum_exactly(seed: int) -> None:
    workers, slots, k, n = 4, 8, 64, 6000
    g = InaGroup(np.arange(workers), InaParams(slots=slots, elements=k, workers=workers, job=0, seed=seed))
    sw = AggregationSwitch(slots, workers, k)
    coll = g.collective(0, "float32", n, -(-n // k))
    coll.start_us[:] = 0.0
    rng = np.random.default_rng(seed)
    check, held = ResultCheck(), None
    duplicated = 0
    for _ in range(100_000):
        pk = g.next_packets()
        if pk is None and held is None:
            break
        headers = pk.headers if pk is not None else held[0][:0]
        payload = pk.payload if pk is not None else held[1][:0]
        order = rng.permutation(len(headers))  # reordered on the way
        headers, payload = headers[order], payload[order]
        dup = rng.random(len(headers)) < 0.2  # and some duplicated
        duplicated += int(dup.sum())
        headers = np.concatenate([headers, headers[dup]])
        payload = np.concatenate([payload, payload[dup]])
        late = rng.random(len(headers)) < 0.1  # some overtaken by the next round's packets
        if held is not None:
            headers, payload = np.concatenate([headers, held[0]]), np.concatenate([payload, held[1]])
            late = np.concatenate([late, np.zeros(len(held[0]), bool)])
        held = (headers[late], payload[late]) if late.any() else None
        headers, payload = headers[~late], payload[~late]
        res = sw.process(headers, payload)
        dest = res.headers["worker"].astype(int)
        pairs = [(w, i) for i, d in enumerate(dest) for w in (range(workers) if d == MULTICAST else [d])]
        if not pairs:
            continue
        li = np.array([w for w, _ in pairs], int)
        rb = np.array([i for _, i in pairs], int)
        g.on_results(li, rb, res.headers, res.payload, np.ones(len(li)), None, np.full(len(res.headers), -1), check)
    assert coll.finished.all()
    assert check.mismatches == 0 and check.elements == workers * n  # every worker's copy, each checked
    assert duplicated > 0 and sw.stats.duplicates > 0
