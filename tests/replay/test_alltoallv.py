"""An uneven all_to_all (a real gloo capture's per-peer sizes) replayed at the trace's size: each
peer's bytes as captured, every element checked, the same on every process layout; refused by
name where emu would have to make its sizes up."""

from __future__ import annotations

import dataclasses

import pytest

from emu.capture import import_kineto
from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.study.predict import predict
from emu.traces import CollKind
from emu.traces.model import Trace
from tests.conftest import GLOO_ALLTOALLV
from tests.replay.test_clock import exact_part


@pytest.fixture(scope="module")
def uneven() -> Trace:
    return import_kineto([GLOO_ALLTOALLV])


def _even(trace: Trace) -> Trace:
    """The same trace with every all_to_all split evenly (its splits dropped)."""
    ranks = tuple(dataclasses.replace(r, iterations=tuple(
        dataclasses.replace(it, ops=tuple(dataclasses.replace(op, splits=None) if getattr(op, "splits", None) else op
                                          for op in it.ops))
        for it in r.iterations)) for r in trace.ranks)
    return dataclasses.replace(trace, ranks=ranks)


@pytest.mark.parametrize("fabric", ["ring", "ina"])
def test_each_peer_gets_what_was_captured(uneven: Trace, fabric: str, no_children) -> None:
    config = ReplayConfig(workers=2, fabric=fabric, payload_scale=1, link=LinkSpec(bandwidth_bps=1e9))
    got = replay(uneven, config)
    assert got.verification.ok and got.verification.mismatches == 0
    # per profiled step, what each rank receives from the other: the uneven one's, then 32 of the even one's
    received = sum(op.splits.recv_elements[1 - r] if op.splits is not None else op.count // 2
                   for r, prog in enumerate(uneven.ranks) for it in prog.iterations for op in it.colls
                   if op.kind == CollKind.ALL_TO_ALL)
    assert received == (40 + 48) + (40 + 56) + 4 * 32
    assert got.verification.elements_checked == received
    even = replay(_even(uneven), config)
    # as even, rank 1 would send 40 and 44 elements where it sent 48 and 56, rank 0 44 where it sent 40;
    # the wire's bytes count the sender's uplink and the receiver's downlink, with the same headers
    assert got.summary.bytes_sent - even.summary.bytes_sent == 2 * 4 * ((48 - 40) + (56 - 44) + (40 - 44))
    assert exact_part(replay(uneven, dataclasses.replace(config, processes=2))) == exact_part(got)


def test_elsewhere_it_is_refused_by_name(uneven: Trace) -> None:
    with pytest.raises(ConfigError, match=r"all_to_all 0 sends \[40, 40\] elements .* at the trace's own size only"):
        replay(uneven, ReplayConfig(workers=4, fabric="ring"))
    with pytest.raises(ConfigError, match="emu predict has no closed form for an uneven all_to_all yet"):
        predict(uneven, ReplayConfig(workers=2, fabric="ring"))


def test_the_moe_sample_replays_at_its_size(no_children) -> None:
    """The shipped mixture of experts (ep=4): its token exchanges point to point at the sizes its
    router chose, its replicated parameters' all_reduce on the switch, every element checked, the
    same in one process and over sockets."""
    from emu.traces import load_trace, sample_path

    moe = load_trace(sample_path("moe"))
    config = ReplayConfig(workers=4, fabric="ina", iters=2)
    got = replay(moe, config)
    assert got.verification.ok and got.verification.mismatches == 0 and not got.fabric.fallbacks
    assert exact_part(replay(moe, dataclasses.replace(config, processes=2))) == exact_part(got)
