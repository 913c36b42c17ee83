"""The shipped sample traces load, are small, and hold what their models are."""

from __future__ import annotations

import pytest

from emu.errors import TraceError
from emu.traces import SAMPLES, CollKind, load_trace, sample_path

PARAMS = {"mlp": 6_316_042, "cnn": 918_826, "transformer": 25_245_696, "dlrm": 6_405_793}


@pytest.mark.parametrize("name", SAMPLES)
def test_sample(name: str) -> None:
    path = sample_path(name)
    assert path.stat().st_size < 300_000
    trace = load_trace(path)
    assert trace.meta.model == name and trace.meta.params == PARAMS[name]
    assert trace.meta.command.startswith(f"emu capture --model {name}")
    assert trace.iterations >= 3 and len(trace.ranks) == trace.meta.world_size == 2
    for program in trace.ranks:
        for it in program.iterations:
            assert sum(op.count for op in it.colls if op.kind == CollKind.ALL_REDUCE) == PARAMS[name]
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.05)


def test_unknown_sample() -> None:
    with pytest.raises(TraceError, match="the samples are: mlp, cnn, transformer"):
        sample_path("resnet")
