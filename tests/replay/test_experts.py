"""A mixture of experts at new sizes (emu.replay.plan.experts, docs/moe.md): the shipped moe sample
(a real capture of ep=4, its router's uneven splits) laid out at dp x ep, its all_to_alls' sizes
tiled from the measured ones or set by --moe-imbalance, the expert compute following the tokens,
the expert gradients all-reduced over the replicas; and what cannot be, refused by name."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from emu.errors import ConfigError
from emu.replay.plan.experts import _gaps
from emu.replay.plan.layout import parse_mesh
from emu.replay.plan.programs import plan_programs
from emu.traces import CollKind, load_trace, sample_path
from emu.traces.model import Coll, GroupRole, Wait


@pytest.fixture(scope="module")
def moe():
    return load_trace(sample_path("moe"))


def _uneven(prog, k: int = 0) -> list[Coll]:
    return [op for op in prog.iterations[k].colls if op.splits is not None]


def _matrix(programs, members, k: int, a: int) -> np.ndarray:
    return np.array([_uneven(programs[w], k)[a].splits.send_elements for w in members])


def _trace_matrix(trace, k: int, a: int) -> np.ndarray:
    return np.array([_uneven(r, k)[a].splits.send_elements for r in trace.ranks])


def test_measured_routing_is_tiled_and_kept(moe) -> None:
    programs = plan_programs(moe, 64, mesh=parse_mesh("dp=8,ep=8"), seed=3)
    for w in (0, 13, 63):
        groups = {op.group for op in _uneven(programs[w])}
        assert groups == {tuple(range(w // 8 * 8, w // 8 * 8 + 8))}  # the ep slice: 8 consecutive workers
    for k in range(len(moe.ranks[0].iterations)):
        for a in range(4):
            members = range(8, 16)
            got, traced = _matrix(programs, members, k, a), _trace_matrix(moe, k, a)
            recv = np.array([_uneven(programs[w], k)[a].splits.recv_elements for w in members])
            assert (recv == got.T).all()  # what j sends i is what i receives from j
            # tokens a rank kept: each position sends and receives what one trace rank did (to rounding)
            assert sorted(got.sum(axis=1)) == pytest.approx(sorted(np.repeat(traced.sum(axis=1), 2)), abs=8)
            assert sorted(got.sum(axis=0)) == pytest.approx(sorted(np.repeat(traced.sum(axis=0), 2)), abs=8)
            # the measured imbalance kept: the largest split over the mean
            assert got.max() / got.mean() == pytest.approx(traced.max() / traced.mean(), rel=1e-3)
    again = plan_programs(moe, 64, mesh=parse_mesh("dp=8,ep=8"), seed=3)
    other = plan_programs(moe, 64, mesh=parse_mesh("dp=8,ep=8"), seed=4)
    assert _matrix(again, range(8), 1, 1).tolist() == _matrix(programs, range(8), 1, 1).tolist()
    assert any(_matrix(other, range(8), k, 0).tolist() != _matrix(programs, range(8), k, 0).tolist() for k in range(5))
    # replicas draw their own order
    assert any(_matrix(programs, range(8), k, 0).tolist() != _matrix(programs, range(8, 16), k, 0).tolist()
               for k in range(5))


def test_set_imbalance(moe) -> None:
    for factor in (1.0, 2.5):
        programs = plan_programs(moe, 16, mesh=parse_mesh("dp=2,ep=8"), imbalance=factor)
        dispatch = _matrix(programs, range(8), 0, 0)  # tokens to their experts: receivers uneven
        received = dispatch.sum(axis=0)
        assert received.max() / received.mean() == pytest.approx(factor, rel=2e-3)
        combine = _matrix(programs, range(8), 0, 1)  # and back: the transpose's shape
        assert combine.sum(axis=1).max() / combine.sum(axis=1).mean() == pytest.approx(factor, rel=2e-3)
    with pytest.raises(ConfigError, match="--moe-imbalance 9: give the largest split over the mean, from 1"):
        plan_programs(moe, 16, mesh=parse_mesh("dp=2,ep=8"), imbalance=9.0)


def test_expert_compute_follows_the_tokens(moe) -> None:
    """After a dispatch a worker computes the group's measured compute per element received there
    (every trace rank's, that step) times what it received; after a combine, its own rank's."""
    mesh = parse_mesh("dp=2,ep=8")
    for imbalance in (None, 2.0):
        programs = plan_programs(moe, 16, mesh=mesh, imbalance=imbalance)
        for k in range(2):
            for a in (0, 2):  # the forward dispatch, and the gradients' way to the experts in backward
                rate = sum(_gaps(r.iterations[k].ops)[a] for r in moe.ranks) / sum(
                    sum(_uneven(r, k)[a].splits.recv_elements) for r in moe.ranks)
                for w in range(16):
                    ops = programs[w].iterations[k].ops
                    received = sum(_uneven(programs[w], k)[a].splits.recv_elements)
                    assert _gaps(ops)[a] == pytest.approx(rate * received)
            for w in range(16):
                own = moe.ranks[programs[w].rank].iterations[k].ops
                assert _gaps(programs[w].iterations[k].ops)[1] == pytest.approx(_gaps(own)[1])  # a combine's: as traced


def test_replicas_reduce_dense_and_expert_gradients(moe) -> None:
    programs = plan_programs(moe, 64, mesh=parse_mesh("dp=8,ep=8"))
    reductions = [op for op in programs[10].iterations[0].colls if op.kind == CollKind.ALL_REDUCE]
    dense, experts = reductions
    assert dense.group is None and dense.group_size == 64 and dense.count == 7178
    assert experts.group == tuple(range(2, 64, 8)) and experts.group_role == GroupRole.DP
    assert experts.count == 16 // 8 * moe.meta.experts.params_per_expert
    # the expert gradients are waited for with the dense ones
    waits = [op for op in programs[10].iterations[0].ops if isinstance(op, Wait) and dense.id in op.ids]
    assert waits and experts.id in waits[0].ids
    # without replicas, none is added; the count exchange grows to one element a peer
    alone = plan_programs(moe, 8, mesh=parse_mesh("ep=8"))
    assert [op.kind for op in alone[0].iterations[0].colls].count(CollKind.ALL_REDUCE) == 1
    assert alone[0].iterations[0].colls[0].count == 8


@pytest.mark.parametrize("mesh, expected", [
    ("ep=32", "16 experts over 4 ranks replay over a multiple of 4 that divides 16: 4, 8, 16"),
    ("ep=6", "a multiple of 4 that divides 16"),
    ("fsdp=2,ep=4", "a pure expert-parallel trace also takes a dp dimension"),
    ("ep=4,dp=2,tp=2", "give its dimensions, in its order"),
])
def test_layouts_that_cannot_be(moe, mesh: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        plan_programs(moe, parse_mesh(mesh).size, mesh=parse_mesh(mesh))


def test_without_the_experts_recorded_or_a_mesh(moe) -> None:
    bare = replace(moe, meta=replace(moe.meta, experts=None))
    with pytest.raises(ConfigError, match="records no meta.experts"):
        plan_programs(bare, 8, mesh=parse_mesh("ep=8"))
    with pytest.raises(ConfigError, match="records no meta.experts, and replicas added to a mixture of experts"):
        plan_programs(bare, 8, mesh=parse_mesh("dp=2,ep=4"))
    with pytest.raises(ConfigError, match=r"pure expert parallel\); lay it out with --mesh dp=D,ep=4 .* "
                                          r"e.g. --mesh dp=16,ep=4"):
        plan_programs(moe, 64)
    assert plan_programs(bare, 4)  # the trace's own layout needs none


def test_what_the_rule_leaves_as_it_was(moe) -> None:
    """A dimension of 1 added is the trace's own layout; --moe-imbalance where no layout is made is
    refused; a worker --moe-imbalance sends no tokens computes no expert work; experts that do not
    divide over the trace's ranks are refused."""
    own = plan_programs(moe, 4)
    assert [p.iterations for p in plan_programs(moe, 4, mesh=parse_mesh("dp=1,ep=4"))] == [p.iterations for p in own]
    with pytest.raises(ConfigError, match="--moe-imbalance 2: it sets a mixture of experts' routing where emu lays"):
        plan_programs(moe, 4, imbalance=2.0)
    programs = plan_programs(moe, 8, mesh=parse_mesh("ep=8"), imbalance=8.0)
    cold = [w for w in range(8) if sum(_uneven(programs[w])[0].splits.recv_elements) == 0]
    assert len(cold) == 7 and all(_gaps(programs[w].iterations[0].ops)[0] == 0.0 for w in cold)
    odd = replace(moe, meta=replace(moe.meta, experts=replace(moe.meta.experts, count=10)))
    with pytest.raises(ConfigError, match="meta.experts.count is 10, which does not divide over the trace's 4"):
        plan_programs(odd, 8, mesh=parse_mesh("ep=8"))
