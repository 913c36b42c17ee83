"""End-to-end replays through real processes and sockets, on every fabric."""

from __future__ import annotations

import pytest

from emu.replay import ReplayConfig, replay
from emu.replay.report.parallelism import mechanism
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
        assert it.span_us >= it.compute_us > 0
        assert it.comm_us > 0
        assert it.span_us == pytest.approx(it.compute_us + it.exposed_comm_us + it.start_offset_us, rel=1e-6)
        assert 0 < it.emulated_us <= it.span_us * (1 + 1e-12)  # the period holds no skew
    assert report.iterations[0].emulated_us == report.iterations[0].span_us  # the first: from the start
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
    # fallbacks are only what the fabric could not run its own way: on ina the int64 all_reduce (the
    # switch sums fixed point from floats); its reduce_scatters and all_gathers take the switch, and the
    # kinds no switch aggregates (broadcast, all_to_all, barrier, send, recv) are every fabric's own
    ints = sum(op.kind == CollKind.ALL_REDUCE and not op.dtype.is_float
               for it in collectives_trace.ranks[0].iterations for op in it.colls)
    assert ints > 0
    assert report.fabric.fallbacks == ({"all_reduce": 4 * ints} if fabric == "ina" else {}), report.fabric.fallbacks
    ran = {op.kind: mechanism(op, ReplayConfig(workers=4, fabric=fabric))
           for op in collectives_trace.ranks[0].iterations[0].colls}
    assert ran[CollKind.BROADCAST] == "binomial tree" and ran[CollKind.BARRIER] == "dissemination"
    assert ran[CollKind.ALL_TO_ALL] == "direct" and ran[CollKind.SEND] == "point to point"


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
