"""Payload scale changes how many real bytes stand for the emulated ones, never the result: a ring's
and a parameter server's segments stand for the same emulated bytes at every R (issue 31: the
mlp's ring gave 72,938 us at R = 1 and 75,877 at R = 64)."""

from __future__ import annotations

import pytest

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path


@pytest.mark.parametrize("fabric", ["ring", pytest.param("ps", marks=pytest.mark.slow)])
def test_ring_and_ps_give_the_same_iteration_at_every_payload_scale(fabric: str, no_children) -> None:
    mlp = load_trace(sample_path("mlp"))
    times = {r: replay(mlp, ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=r, processes=0,
                                         link=LinkSpec(bandwidth_bps=10e9))).iterations[0].emulated_us
             for r in (1, 16, 256)}
    assert max(times.values()) / min(times.values()) - 1 < 0.005, times
