"""Replays of sharded and split traces: every group's collectives run on its workers, with real
bytes through the fabric, and every one is accounted for (docs/parallelism.md)."""

from __future__ import annotations

import pytest

from emu.emulator.links.spec import LinkSpec
from emu.replay import ReplayConfig, replay
from emu.replay.plan.layout import parse_mesh
from emu.traces import (
    Coll,
    CollKind,
    Compute,
    Dtype,
    Iteration,
    RankProgram,
    Source,
    Trace,
    TraceMeta,
    Wait,
    load_trace,
    sample_path,
)
from emu.traces.mesh import Mesh
from emu.traces.model import GroupRole


def _accounted(report, roles: set[str]) -> None:
    par = report.parallelism
    assert report.verification.ok and report.verification.mismatches == 0
    assert par is not None and par.accounted and {g.role for g in par.groups} == roles
    assert all(g.completed == g.expected > 0 for g in par.groups)


# slow: 8 s each; make test keeps the golden mesh-tp cases
@pytest.mark.parametrize("fabric", [pytest.param("ring", marks=pytest.mark.slow), pytest.param("ps", marks=pytest.mark.slow),
                                    pytest.param("ina", marks=pytest.mark.slow)])
def test_dp_x_tp_at_a_larger_data_parallel_size(no_children, fabric: str) -> None:
    tp = load_trace(sample_path("tp"))
    report = replay(tp, ReplayConfig(workers=8, fabric=fabric, iters=2, mesh=parse_mesh("dp=4,tp=2")))
    _accounted(report, {"tp", "dp"})
    par = report.parallelism
    assert (par.trace_mesh, par.mesh, par.scaled, par.kept) == ("dp=2,tp=2", "dp=4,tp=2", ("dp",), ("tp",))
    groups = {g.role: g for g in par.groups}
    assert (groups["tp"].groups, groups["tp"].size, groups["tp"].dims) == (4, 2, ("tp",))
    assert (groups["dp"].groups, groups["dp"].size, groups["dp"].dims) == (2, 4, ("dp",))
    assert groups["tp"].collectives == 3 and groups["dp"].collectives == 1


# slow: 9 s each; make test keeps the golden mesh-fsdp-ina case (fsdp=8 on ina)
@pytest.mark.parametrize("fabric", [pytest.param("ring", marks=pytest.mark.slow), pytest.param("ina", marks=pytest.mark.slow)])
def test_fsdp_at_eight_shards(no_children, fabric: str) -> None:
    fsdp = load_trace(sample_path("fsdp"))
    report = replay(fsdp, ReplayConfig(workers=8, fabric=fabric, iters=2))
    _accounted(report, {"fsdp"})
    (g,) = report.parallelism.groups
    # the root module's 6156 parameters gathered and reduce-scattered in shards of 770 (6160: 4 padded, each)
    assert g.kinds == ("all_gather", "reduce_scatter") and g.size == 8 and g.padded_elements == 8
    # the switch sums the reduce_scatters to each shard's owner and multicasts the all_gathers
    assert g.ran == (("switch",) if fabric == "ina" else ("ring",))
    assert report.fabric.fallbacks == {}  # the switch's own, or the ring's


def test_a_pipeline_at_a_larger_data_parallel_size(no_children) -> None:
    pp = load_trace(sample_path("pp"))
    report = replay(pp, ReplayConfig(workers=8, fabric="ring", iters=2, mesh=parse_mesh("pp=2,dp=4")))
    _accounted(report, {"pp", "dp"})
    groups = {g.role: g for g in report.parallelism.groups}
    assert groups["pp"].ran == ("point to point",) and groups["pp"].groups == 4 and groups["pp"].size == 2


def _trace(world: int, mesh: Mesh | None, programs: dict[int, tuple]) -> Trace:
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=world, backend="gloo", device="cpu", framework="none",
                     dtype="float32", captured_at="2026-12-01T00:00:00Z", mesh=mesh)
    return Trace(meta=meta, ranks=tuple(RankProgram(rank=r, iterations=(Iteration(step=0, measured_us=1.0, ops=ops),))
                                        for r, ops in programs.items()))


def _all_reduce(i: int, count: int, group: tuple[int, ...] | None, size: int, role: GroupRole | None = None,
                stream: int | None = None) -> Coll:
    return Coll(id=i, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=count, bytes=4 * count, group_size=size,
                group=group, group_role=role, stream=stream)


@pytest.mark.parametrize("fabric", ["ring", pytest.param("ina", marks=pytest.mark.slow)])
def test_a_groups_all_reduce_takes_what_a_job_of_its_size_takes(no_children, fabric: str) -> None:
    """Two data-parallel groups of 4 (dp=4 x tp=2) share no link: on a ring, and on the switch
    where each group's pool is as large as the job's, each takes exactly the time of a 4-worker
    job's all_reduce of the same tensor. (Not on a parameter server: the groups share its shards.)"""
    mesh = Mesh.of([("dp", 4), ("tp", 2)])
    count = 200_000
    grouped = _trace(8, mesh, {r: (Compute("forward", 100.0), _all_reduce(0, count, mesh.slice(r, (0,)), 4, GroupRole.DP),
                                   Wait(ids=(0,))) for r in range(8)})
    whole = _trace(4, None, {r: (Compute("forward", 100.0), _all_reduce(0, count, None, 4), Wait(ids=(0,)))
                             for r in range(4)})
    link = LinkSpec(bandwidth_bps=10e9, latency_us=5.0)
    a = replay(grouped, ReplayConfig(workers=8, fabric=fabric, iters=2, link=link, payload_scale=1, slots=8192))
    b = replay(whole, ReplayConfig(workers=4, fabric=fabric, iters=2, link=link, payload_scale=1, slots=4096))
    if fabric == "ina":  # the design's 8192 slots split between the two groups' pools
        assert a.fabric.fallbacks == {} and "4096 slots each of the design's 8192" in a.parallelism.notes[-1]
    assert [it.emulated_us for it in a.iterations] == pytest.approx([it.emulated_us for it in b.iterations], rel=1e-12)
    assert a.verification.ok and a.verification.elements_checked == 2 * b.verification.elements_checked
    assert a.summary.bytes_sent == 2 * b.summary.bytes_sent


def test_groups_on_streams_of_their_own_run_concurrently(no_children) -> None:
    """A rank issues its tp all_reduce and its dp all_reduce back to back: on streams of their own
    they overlap (latency-bound: about the longer one), on the rank's one stream they follow each
    other (about their sum)."""
    mesh = Mesh.of([("dp", 2), ("tp", 2)])

    def program(r: int, streams: bool) -> tuple:
        return (Compute("forward", 10.0),
                _all_reduce(0, 16, mesh.slice(r, (1,)), 2, GroupRole.TP, 0 if streams else None),
                _all_reduce(1, 16, mesh.slice(r, (0,)), 2, GroupRole.DP, 1 if streams else None),
                Wait(ids=(0, 1)))

    link = LinkSpec(bandwidth_bps=100e9, latency_us=1000.0)
    times = {}
    for streams in (True, False):
        trace = _trace(4, mesh, {r: program(r, streams) for r in range(4)})
        rep = replay(trace, ReplayConfig(workers=4, fabric="ring", iters=1, link=link))
        assert rep.verification.ok and rep.parallelism.accounted
        times[streams] = rep.iterations[0].emulated_us
    one = 4 * 1000.0  # a ring all_reduce of 2: two steps, each up and down a link
    assert times[True] == pytest.approx(10 + one, rel=1e-3)
    assert times[False] == pytest.approx(10 + 2 * one, rel=1e-3)


def _one(kind: CollKind, count: int, dtype: Dtype, world: int = 8) -> Trace:
    op = Coll(id=0, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize, group_size=world)
    return _trace(world, None, {r: (Compute("forward", 10.0), op, Wait(ids=(0,))) for r in range(world)})


@pytest.mark.parametrize("kind, dtype", [pytest.param(CollKind.REDUCE_SCATTER, Dtype.FLOAT32, marks=pytest.mark.slow),
                                         (CollKind.ALL_GATHER, Dtype.FLOAT32),
                                         pytest.param(CollKind.ALL_GATHER, Dtype.FLOAT16, marks=pytest.mark.slow)])
def test_the_switch_runs_reduce_scatter_and_all_gather_as_its_closed_forms(no_children, kind, dtype) -> None:
    """On ina a reduce_scatter sums in the switch (its sums to each shard's owner, exact) and an
    all_gather multicasts each shard (its bytes as they are, 2-byte dtypes two to a lane): no
    fallback, every element checked, the time the closed form's (docs/physics.md)."""
    from emu.emulator.mechanisms import collective_us

    link = LinkSpec(bandwidth_bps=10e9, latency_us=5.0)
    count = 1 << 20
    report = replay(_one(kind, count, dtype), ReplayConfig(workers=8, fabric="ina", iters=1, link=link, payload_scale=1))
    assert report.fabric.fallbacks == {} and report.verification.ok
    # a reduce_scatter's owner checks its shard (the job's tensor once); an all_gather every worker all of it
    assert report.verification.elements_checked == (count if kind == CollKind.REDUCE_SCATTER else 8 * count)
    cfg = ReplayConfig(workers=8, fabric="ina", link=link)
    form = collective_us(kind, count, dtype, cfg.setting)
    assert report.iterations[0].emulated_us - 10.0 == pytest.approx(form, rel=0.005)


@pytest.mark.parametrize("scale", [1, 8])
def test_scatter_and_gather_rounds_recover_from_loss(no_children, scale: int) -> None:
    """Lost contributions and results of reduce_scatter and all_gather rounds are resent and the
    switch answers duplicates (the owner with its sum, the others with a header): every element
    still arrives right."""
    ops = (Compute("forward", 10.0),
           Coll(id=0, kind=CollKind.REDUCE_SCATTER, dtype=Dtype.FLOAT32, count=1 << 16, bytes=1 << 18, group_size=4),
           Coll(id=1, kind=CollKind.ALL_GATHER, dtype=Dtype.FLOAT32, count=1 << 16, bytes=1 << 18, group_size=4),
           Wait(ids=(0, 1)))
    trace = _trace(4, None, {r: ops for r in range(4)})
    link = LinkSpec(bandwidth_bps=10e9, latency_us=5.0, loss=0.02)
    report = replay(trace, ReplayConfig(workers=4, fabric="ina", iters=2, link=link, payload_scale=scale, seed=3))
    assert report.verification.ok and report.fabric.fallbacks == {}
    assert report.fabric.packets_lost > 0
    if scale == 1:  # real rows lost and resent; the switch answered duplicates of completed rounds
        assert report.fabric.retransmissions > 0 and report.fabric.answered > 0


def test_small_gathers_and_group_broadcasts_move_their_bytes(no_children) -> None:
    """An all_gather smaller than the grown job still crosses the switch (padded to whole shards),
    and a broadcast on a data-parallel group reaches every member from the one root."""
    small = _one(CollKind.ALL_GATHER, 2, Dtype.FLOAT32, world=2)
    report = replay(small, ReplayConfig(workers=8, fabric="ina", iters=1))
    assert report.verification.ok and report.fabric.packets > 0 and report.iterations[0].comm_us > 0
    mesh = Mesh.of([("dp", 2), ("tp", 2)])
    ops = {r: (Compute("forward", 10.0),
               Coll(id=0, kind=CollKind.BROADCAST, dtype=Dtype.FLOAT32, count=4096, bytes=16384, group_size=2,
                    group=mesh.slice(r, (0,)), root=mesh.slice(r, (0,))[1], group_role=GroupRole.DP),
               Wait(ids=(0,))) for r in range(4)}
    report = replay(_trace(4, mesh, ops), ReplayConfig(workers=8, fabric="ring", iters=1, mesh=parse_mesh("dp=4,tp=2")))
    assert report.verification.ok and report.parallelism.accounted
    # each of the two groups of 4: 3 receivers check the 4096 elements
    assert report.verification.elements_checked == 2 * 3 * 4096
