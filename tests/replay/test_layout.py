"""Sharded and split traces at a new layout: which program each worker runs, and each collective's
group of workers and number (emu.replay.plan.layout, emu.replay.plan.programs; docs/parallelism.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emu.errors import ConfigError
from emu.replay.config.options import CompressOption, SparsityOption
from emu.replay.plan.layout import parse_mesh, plan_mesh
from emu.replay.plan.programs import group_table, plan_programs
from emu.traces import CollKind, load_trace, sample_path
from emu.traces.model import GroupRole


@pytest.fixture(scope="module")
def tp():
    return load_trace(sample_path("tp"))


@pytest.fixture(scope="module")
def pp():
    return load_trace(sample_path("pp"))


@pytest.fixture(scope="module")
def fsdp():
    return load_trace(sample_path("fsdp"))


def _numbers_agree(programs) -> None:
    """Each collective's number is unique on its worker and the same on every member of its group."""
    by_number: dict[int, set] = {}
    for prog in programs:
        for it in range(2 * len(prog.iterations)):
            colls = prog.iterations[it % len(prog.iterations)].colls
            numbers = [prog.seq(it, k) for k in range(len(colls))]
            assert len(set(numbers)) == len(numbers)
            for n, op in zip(numbers, colls, strict=True):
                members = (tuple(sorted((prog.worker, op.peer))) if op.kind in (CollKind.SEND, CollKind.RECV)
                           else op.group)
                by_number.setdefault(n, set()).add((members, op.kind.value if op.peer is None else "p2p", op.count))
    assert all(len(v) == 1 for v in by_number.values())  # one group, one collective, a number


def test_dp_grows_and_tp_pairs_stay(tp) -> None:
    programs = plan_programs(tp, 16, mesh=parse_mesh("dp=8,tp=2"))
    assert len(programs) == 16
    for prog in programs:
        w = prog.worker
        assert prog.rank == (w // 2 % 2) * 2 + w % 2  # its place in the mesh, dp modulo the trace's 2
        for op in prog.iterations[0].colls:
            if op.group_role == GroupRole.TP:
                assert op.group == (w - w % 2, w - w % 2 + 1) and op.group_size == 2
            else:
                assert op.group == tuple(range(w % 2, 16, 2)) and op.group_size == 8 and op.count == 2105354
    _numbers_agree(programs)
    table = group_table(programs)
    assert len(table) == programs[0].colls_per_iteration == 8 * 3 + 2  # 8 tp pairs' 3 all_reduces, 2 dp groups' 1


def test_pipeline_peers_keep_their_stage_offset(pp) -> None:
    programs = plan_programs(pp, 16, mesh=parse_mesh("pp=2,dp=8"))
    for prog in programs:
        w = prog.worker
        stage, replica = divmod(w, 8)
        for op in prog.iterations[0].colls:
            if op.kind in (CollKind.SEND, CollKind.RECV):
                assert op.peer == (1 - stage) * 8 + replica and op.group is None
            else:
                assert op.group == tuple(range(stage * 8, stage * 8 + 8))
    _numbers_agree(programs)


def test_fsdp_shards_grow_and_pad(fsdp) -> None:
    programs = plan_programs(fsdp, 64)  # the one data-parallel dimension grows by itself
    colls = programs[5].iterations[0].colls
    assert {op.group for op in colls} == {None} and {op.group_size for op in colls} == {64}
    assert sorted({op.count for op in colls}) == [6208, 262656]  # 6156 padded to whole shards of 64
    assert all(op.bytes == 4 * op.count for op in colls)
    _numbers_agree(programs[:8])


def test_a_trace_of_one_group_numbers_as_before() -> None:
    mlp = load_trace(sample_path("mlp"))
    assert plan_mesh(mlp, 8, None, "mlp") is None
    prog = plan_programs(mlp, 8)[3]
    assert prog.seq_offsets == () and prog.seq(2, 1) == 2 * prog.colls_per_iteration + 1


@pytest.mark.parametrize("workers, mesh, expected", [
    (16, "tp=2,dp=8", "--mesh tp=2,dp=8: the trace's mesh is dp=2,tp=2; give its dimensions, in its order"),
    (8, "dp=2,tp=4", "--mesh dp=2,tp=4: dimension tp (tp) splits the model and keeps its size 2; only data-parallel"),
    (10, "dp=4,tp=2", "--mesh dp=4,tp=2 is 8 workers but --workers is 10"),
    (5, None, "--workers 5: tp's mesh is dp=2,tp=2; give a multiple of 2"),
    (3, None, "--workers 3: tp's mesh is dp=2,tp=2; give a multiple of 2"),
])
def test_layouts_that_cannot_be(tp, workers: int, mesh: str | None, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_programs(tp, workers, "tp", mesh=None if mesh is None else parse_mesh(mesh))
    assert str(err.value).startswith(expected), str(err.value)


@pytest.mark.parametrize("text", ["dp", "dp=0,tp=2", "dp=2,dp=2", "DP=2", "dp=x"])
def test_bad_mesh_text(text: str) -> None:
    with pytest.raises(ConfigError, match=f"--mesh {text!r}"):
        parse_mesh(text)


def test_sub_groups_without_a_mesh_replay_at_their_own_size(tp) -> None:
    bare = replace(tp, meta=replace(tp.meta, mesh=None))
    for r in bare.ranks:  # the groups stay; nothing says which dimension each is
        for it in r.iterations:
            assert any(op.group is not None for op in it.colls)
    programs = plan_programs(bare, 4)
    assert [op.group for op in programs[2].iterations[0].colls] == [(2, 3)] * 3 + [(0, 2)]
    _numbers_agree(programs)
    with pytest.raises(ConfigError, match="sub-groups and no mesh \\(meta.mesh\\), so it replays at its own size "
                                          "only: use --workers 4"):
        plan_programs(bare, 8, "t")
    with pytest.raises(ConfigError, match="--mesh dp=4,tp=2: t records no mesh"):
        plan_programs(bare, 8, "t", mesh=parse_mesh("dp=4,tp=2"))


def test_what_sub_groups_do_not_take_yet(tp) -> None:
    with pytest.raises(ConfigError, match="--compress topk:0.01: t runs collectives on sub-groups"):
        plan_programs(tp, 4, "t", compress=CompressOption("topk:0.01"))
    with pytest.raises(ConfigError, match="--sparsity 0.1: t runs collectives on sub-groups .* drop --sparsity"):
        plan_programs(tp, 4, "t", sparsity=SparsityOption.parse("0.1"))


def test_a_mesh_of_whole_job_collectives_takes_compression_and_sparsity(fsdp) -> None:
    """FSDP's gathers and scatters span the job: a trace of one group that records a mesh is planned
    as any such trace (the mesh sets its size and roles), with every option."""
    progs = plan_programs(fsdp, 8, "t", sparsity=SparsityOption.parse("0.1"), compress=CompressOption("fp16"))
    assert progs[0].seq_offsets == () and {op.group_size for op in progs[0].iterations[0].colls} == {8}


def test_a_broadcast_of_a_grown_group_has_one_root() -> None:
    """Every member of a data-parallel group grown from 2 to 4 names the trace root's place in it."""
    from emu.traces import Coll, Dtype, Iteration, RankProgram, Source, Trace, TraceMeta, Wait
    from emu.traces.mesh import Mesh

    mesh = Mesh.of([("dp", 2), ("tp", 2)])
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=4, backend="gloo", device="cpu", framework="none",
                     dtype="float32", captured_at="2026-12-01T00:00:00Z", mesh=mesh)

    def program(r: int) -> RankProgram:
        dp = mesh.slice(r, (0,))
        op = Coll(id=0, kind=CollKind.BROADCAST, dtype=Dtype.FLOAT32, count=8, bytes=32, group_size=2, group=dp,
                  root=dp[0], group_role=GroupRole.DP)
        return RankProgram(rank=r, iterations=(Iteration(step=0, measured_us=1.0, ops=(op, Wait(ids=(0,)))),))

    trace = Trace(meta=meta, ranks=tuple(program(r) for r in range(4)))
    progs = plan_programs(trace, 8, "t", mesh=parse_mesh("dp=4,tp=2"))
    roots = {}
    for prog in progs:
        op = prog.iterations[0].colls[0]
        roots.setdefault(op.group, set()).add(op.root)
    assert roots == {(0, 2, 4, 6): {0}, (1, 3, 5, 7): {1}}


def test_a_file_of_some_ranks_cannot_lay_out_the_mesh(tp) -> None:
    part = replace(tp, ranks=tp.ranks[:2])
    with pytest.raises(ConfigError, match="holds the programs of ranks \\[0, 1\\], but the layout needs rank 2's"):
        plan_programs(part, 8, "t")


def test_a_send_without_its_recv_is_refused(pp) -> None:
    def drop_recvs(program):
        its = tuple(replace(it, ops=tuple(op for op in it.ops if getattr(op, "kind", None) != CollKind.RECV
                                         and not (hasattr(op, "ids") and any(i in {c.id for c in it.colls
                                                                                 if c.kind == CollKind.RECV}
                                                                            for i in op.ids))))
                    for it in program.iterations)
        return replace(program, iterations=its)

    broken = replace(pp, ranks=tuple(drop_recvs(r) if r.rank == 2 else r for r in pp.ranks))
    with pytest.raises(ConfigError, match="worker 2 never issues the collectives of the send from worker 0 to worker 2"):
        plan_programs(broken, 4, "t")
