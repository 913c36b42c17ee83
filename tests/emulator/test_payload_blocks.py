"""Generated payload blocks made once for the workers that ask for them (emu.emulator.algorithms.p2p)."""

from __future__ import annotations

import numpy as np

from emu.emulator.algorithms import p2p
from emu.emulator.payload.generated import block


def test_large_blocks_are_kept_read_only_and_dropped_past_their_bytes() -> None:
    cache = p2p._LargeBlocks(limit=1_700_000)  # four blocks of 20,000 elements (20 bytes each)
    keys = [(0, seq, 0, 20_000, 4, "float32", None) for seq in range(6)]
    first = cache.get(keys[0])
    assert cache.get(keys[0]) is first and not first.common.flags.writeable
    fresh = block(*keys[0])
    assert np.array_equal(first.values(1), fresh.values(1))  # the same numbers as made anew
    for key in keys[1:]:
        cache.get(key)
    assert cache.bytes <= cache.limit and keys[0] not in cache.blocks and keys[-1] in cache.blocks
    big = (0, 9, 0, 200_000, 4, "float32", None)  # past a quarter of the limit: made, not kept
    assert np.array_equal(cache.get(big).values(0), block(*big).values(0)) and big not in cache.blocks
