"""End-to-end replays through real processes and sockets, on every fabric."""

from __future__ import annotations

import pytest

from emu.replay import ReplayConfig, replay
from emu.traces import CollKind, load_trace, sample_path

FABRICS = ("ina", "ring", "ps")


@pytest.fixture(scope="module")
def mlp():
    return load_trace(sample_path("mlp"))


@pytest.mark.parametrize("fabric", FABRICS)
def test_mlp_on_every_fabric(mlp, fabric: str, no_children) -> None:
    report = replay(mlp, ReplayConfig(workers=4, fabric=fabric, iters=2, payload_scale=64))
    assert report.verification.ok and report.verification.mismatches == 0
    real = -(-4_216_842 // 64) + -(-2_099_200 // 64)  # the two buckets' real elements
    per_check = real * 2  # two iterations
    assert report.verification.elements_checked >= per_check
    assert len(report.iterations) == 2
    for it in report.iterations:
        assert it.emulated_us >= it.compute_us > 0
        assert it.comm_us > 0
        assert it.emulated_us == pytest.approx(it.compute_us + it.exposed_comm_us + it.start_offset_us, rel=1e-6)
    assert report.fabric.fallbacks == {}
    assert report.summary.bytes_sent > 4 * 2 * 25_264_168 * 2 * 0.99  # both directions, R counted back
    if fabric == "ina":
        assert report.fabric.packets > 0 and report.fabric.results > 0
    else:
        assert report.fabric.segments > 0


@pytest.mark.parametrize("fabric", FABRICS)
def test_every_collective_kind(collectives_trace, fabric: str, no_children) -> None:
    report = replay(collectives_trace, ReplayConfig(workers=4, fabric=fabric))
    assert report.verification.ok, report.verification
    kinds = {op.kind for op in collectives_trace.ranks[0].iterations[0].colls}
    assert CollKind.SEND in kinds and CollKind.BARRIER in kinds
    fb = report.fabric.fallbacks
    # ina's switch runs float reduce_scatters (the sum to each shard's owner) and all_gathers (multicast)
    on_switch = ("all_gather", "reduce_scatter") if fabric == "ina" else ()
    for kind in ("broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "send", "recv"):
        if kind in on_switch:
            assert kind not in fb, f"{kind} should run on {fabric}'s switch: {fb}"
        else:
            assert fb.get(kind, 0) > 0, f"{kind} should be reported as a fallback on {fabric}: {fb}"
    if fabric == "ina":
        assert fb.get("all_reduce", 0) > 0  # the int64 all_reduce cannot use fixed point
    else:
        assert "all_reduce" not in fb


@pytest.mark.slow
def test_sixteen_workers_transformer_ina(no_children) -> None:
    trace = load_trace(sample_path("transformer"))
    report = replay(trace, ReplayConfig(workers=16, fabric="ina", iters=1, payload_scale=512))
    assert report.verification.ok
    assert report.config["workers"] == 16 and report.emulator.payload_scale == 512


def test_payload_scale_keeps_emulated_bytes(mlp, no_children) -> None:
    a = replay(mlp, ReplayConfig(workers=2, fabric="ring", iters=1, payload_scale=16))
    b = replay(mlp, ReplayConfig(workers=2, fabric="ring", iters=1, payload_scale=64))
    assert a.summary.bytes_sent == pytest.approx(b.summary.bytes_sent, rel=1e-3)
    assert a.iterations[0].comm_us == pytest.approx(b.iterations[0].comm_us, rel=0.02)
