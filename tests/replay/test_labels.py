"""What a report's counts are (issue 31, "labels"): elements checked counted once apart from their
deliveries, and losses a model drew apart from rows really dropped and resent."""

from __future__ import annotations

import pytest

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path
from emu.traces.model import CollKind


def _real_elements(sample: str, workers: int, scale: int) -> int:
    """Elements of every collective's result at payload scale ``scale`` (one iteration; a sample
    whose collectives keep their sizes at ``workers``)."""
    it = load_trace(sample_path(sample)).ranks[0].iterations[0]
    return sum(-(-op.count // scale) for op in it.colls if op.kind != CollKind.BARRIER)


@pytest.mark.parametrize("fabric", ["ina", "ring", "ps", "tree"])
def test_distinct_elements_are_each_result_once_and_deliveries_every_worker(fabric: str, no_children) -> None:
    r = replay(load_trace(sample_path("mlp")), ReplayConfig(workers=4, fabric=fabric, iters=1, payload_scale=8,
                                                            processes=0))
    v = r.verification
    assert v.ok
    assert v.elements_distinct == _real_elements("mlp", 4, 8)
    assert v.elements_checked == 4 * v.elements_distinct  # every worker receives every sum


def test_an_all_gathers_shards_count_once_though_no_worker_receives_its_own(no_children) -> None:
    fsdp = load_trace(sample_path("fsdp"))
    ring, ina = (replay(fsdp, ReplayConfig(workers=4, fabric=f, iters=1, payload_scale=4, processes=0))
                 for f in ("ring", "ina"))
    assert ring.verification.ok and ina.verification.ok
    want = _real_elements("fsdp", 4, 4)
    assert ring.verification.elements_distinct == want
    # the stream's shards are whole blocks of lanes: the last shard's padding is not data, but a
    # shard of ceil(n / g) elements may hold up to g - 1 past the tensor's end
    assert want <= ina.verification.elements_distinct <= want + 4 * len(fsdp.ranks[0].iterations[0].colls)


def test_losses_drawn_by_a_model_are_told_apart_from_rows_really_resent(collectives_trace, no_children) -> None:
    link = LinkSpec(bandwidth_bps=100e9, loss=0.05)

    def fabric(name: str, scale: int):
        r = replay(collectives_trace, ReplayConfig(workers=4, fabric=name, iters=2, payload_scale=scale, processes=0,
                                                   link=link))
        assert r.verification.ok
        return r.fabric

    real, drawn, ring = fabric("ina", 1), fabric("ina", 8), fabric("ring", 1)
    # at scale 1 the stream's rows are really dropped and resent; the trace's broadcasts and
    # all_to_alls run point to point, whose segments' packet losses are drawn
    assert real.lost > 0 and real.packets_lost - real.packets_lost_modelled == real.lost
    assert drawn.packets_lost > 0 and drawn.packets_lost_modelled == drawn.packets_lost and drawn.lost == 0
    assert ring.packets_lost > 0 and ring.packets_lost_modelled == ring.packets_lost


@pytest.mark.parametrize("fabric", ["ring", "ina", "ps"])
def test_distinct_elements_of_every_collective_kind(collectives_trace, fabric: str, no_children) -> None:
    """The real gloo trace's every kind at 4 workers, counted by hand: a result every member gets
    (all_reduce, broadcast from root 1, all_gather, and a reduce_scatter's shards, one a member)
    counts its tensor once; an all_to_all's chunks are each worker's own (M - 1 of count / M each);
    each of the M / 2 send/recv pairs counts its tensor; a barrier carries nothing."""
    m = 4
    want = 0
    for op in collectives_trace.ranks[0].iterations[0].colls:
        if op.kind == CollKind.ALL_TO_ALL:
            want += (m - 1) * op.count
        elif op.kind == CollKind.SEND:
            want += op.count * m // 2
        elif op.kind != CollKind.BARRIER:
            want += op.count
    r = replay(collectives_trace, ReplayConfig(workers=m, fabric=fabric, iters=1, payload_scale=1, processes=0))
    assert r.verification.ok and r.verification.elements_distinct == want == 10_174


def test_a_hierarchical_ring_counts_what_the_flat_ring_counts(no_children) -> None:
    from emu.emulator.links.topology import Hierarchy, Topology

    mlp = load_trace(sample_path("mlp"))
    flat, hier = (replay(mlp, ReplayConfig(workers=8, fabric="ring", iters=1, payload_scale=8, processes=0,
                                           topology=topo)).verification
                  for topo in (None, Topology(workers_per_node=4, algorithm=Hierarchy.HIERARCHICAL)))
    assert flat.ok and hier.ok and hier.elements_distinct == flat.elements_distinct == _real_elements("mlp", 8, 8)
