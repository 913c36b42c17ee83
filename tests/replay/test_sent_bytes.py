"""What a sparse replay reports it sent is what crossed the links (``HostResult.carried``): its
values and indices counted where each message was sent, its headers apart, and at payload scale 1
exactly what the hashes that made the payload say each mechanism sends (``Mechanism.sent``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emu.emulator.links.spec import LinkSpec
from emu.emulator.mechanisms import choose
from emu.emulator.protocol import wire
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import SparsityOption
from emu.replay.plan.sparsity import replayed_sparse
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

L10 = LinkSpec(bandwidth_bps=10e9, latency_us=5.0)
TRACE = single_collective(CollKind.ALL_REDUCE, 1 << 18, iterations=2)
SPARSE = SparsityOption.parse("0.1:0.3")


def _hashed(cfg: ReplayConfig) -> float:
    """What the mechanisms' formulas say the replay's sparse all_reduces send (real bytes)."""
    return sum(choose(op, cfg.setting).sent(op, cfg.setting, seq, s).sent
               for seq, op, s in replayed_sparse(TRACE, cfg, cfg.iters))


@pytest.mark.parametrize("fabric", ["ring", "ps", "ina"])
def test_the_count_is_the_hashes_at_payload_scale_one(fabric: str, no_children) -> None:
    cfg = ReplayConfig(workers=4, fabric=fabric, iters=2, payload_scale=1, link=L10, sparsity=SPARSE)
    report = replay(TRACE, cfg)
    s = report.sparsity
    assert report.verification.ok and s is not None and s.sparse_collectives == 2
    assert s.sent_bytes == _hashed(cfg) > 0
    assert s.sent_fraction == s.sent_bytes / s.dense_bytes < 0.5
    # the dense algorithm's values: 2 (M-1) S a ring, 2 M S the parameter server and the stream
    share = 2 * (4 - 1) if fabric == "ring" else 2 * 4
    assert s.dense_bytes == 2 * share * 4 * (1 << 18)
    # headers apart, whole ones: a point-to-point packet's frame and header, a stream packet's
    # (every one, data or not; the sparse stream's block and next are its indices)
    header = wire.FRAME_OVERHEAD + (wire.AGG_HEADER if fabric == "ina" else wire.P2P_HEADER).itemsize
    assert s.header_bytes > 0 and s.header_bytes % header == 0
    if fabric != "ina":  # the sparse stream's header-only packets outweigh its values at f = 0.1
        assert s.header_bytes < 0.1 * s.sent_bytes
    # every byte the sparse collectives put on the links is payload or header
    assert s.sent_bytes + s.header_bytes <= report.summary.bytes_sent


def test_a_payload_scale_counts_emulated_bytes(no_children) -> None:
    """At R = 8 the real messages stand for 8 times theirs: the count is the emulated wire's, and
    its fraction of the dense values the one at R = 1 within the rounding of the cut blocks."""
    cfg = ReplayConfig(workers=4, fabric="ring", iters=2, payload_scale=1, link=L10, sparsity=SPARSE)
    one, eight = replay(TRACE, cfg).sparsity, replay(TRACE, replace(cfg, payload_scale=8)).sparsity
    assert one is not None and eight is not None and one.dense_bytes == eight.dense_bytes
    assert eight.sent_fraction == pytest.approx(one.sent_fraction, rel=0.05)
    assert eight.sent_bytes == pytest.approx(8 * _hashed(replace(cfg, payload_scale=8)), rel=1e-6)
