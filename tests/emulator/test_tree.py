"""NCCL's double binary tree (``--fabric tree``, emu/emulator/algorithms/tree.py): its trees as NCCL builds them,
real replays whose sums are checked, its closed form exact on one switch, predict on the mlp."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator import fabric as fabrics
from emu.emulator.algorithms.tree import SEGMENT_BYTES, TreeFabric, btree, dtree, plan, tree_all_reduce_us
from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Hierarchy, Topology
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.study.predict import predict
from emu.traces import load_trace, sample_path
from emu.traces.model import CollKind, Dtype
from emu.traces.synthetic import single_collective


def test_the_first_tree_is_ncclGetBtree() -> None:
    # NCCL's illustration (src/graph/trees.cc) for 14 ranks: 0-8, 8: 4 12, 4: 2 6, 12: 10 13, ...
    tree = {r: btree(14, r) for r in range(14)}
    assert tree[0] == (-1, (8,)) and tree[8] == (0, (4, 12)) and tree[4] == (8, (2, 6))
    assert tree[12] == (8, (10, 13)) and tree[10] == (12, (9, 11)) and tree[13] == (12, ())
    assert tree[2] == (4, (1, 3)) and tree[1] == (2, ()) and tree[7] == (6, ())


@pytest.mark.parametrize("n", [2, 3, 4, 5, 12, 13, 16, 31, 64, 100])
def test_both_trees_span_every_rank_and_a_rank_is_interior_in_at_most_one(n: int) -> None:
    """Interior in at most one tree: every rank for an even count; for an odd one (the shifted tree)
    every rank but 0, which NCCL's construction leaves interior in both."""
    trees = [dtree(n, r) for r in range(n)]
    for t in range(2):
        roots = [r for r in range(n) if trees[r][t][0] < 0]
        assert len(roots) == 1
        for r in range(n):  # parents and children agree, and every rank reaches the root
            up, kids = trees[r][t]
            assert all(trees[k][t][0] == r for k in kids)
            seen, x = set(), r
            while trees[x][t][0] >= 0:
                assert x not in seen
                seen.add(x)
                x = trees[x][t][0]
            assert x == roots[0]
    interior = [sum(bool(trees[r][t][1]) for t in range(2)) for r in range(n)]
    assert [r for r in range(n) if interior[r] == 2] == ([0] if n % 2 and n > 2 else [])


def test_on_nodes_chains_inside_and_trees_across() -> None:
    trees = plan((0, 0, 0, 1, 1, 1, 2, 2, 2))
    for t in range(2):
        par, kids = trees.parent[t], trees.children[t]
        assert par[1] == 0 and par[2] == 1 and par[4] == 3 and par[5] == 4  # chains, head first
        heads = [0, 3, 6]
        assert sorted(m for m in heads if par[m] < 0 or par[m] in heads) == heads  # heads join each other
        assert all(par[m] in (m - 1,) for m in (1, 2, 4, 5, 7, 8))
        assert sum(len(k) for k in kids) == 8
    assert trees.parent[0] != trees.parent[1]


@pytest.mark.parametrize(("workers", "dtype"), [(2, Dtype.FLOAT32), (5, Dtype.INT32), (8, Dtype.FLOAT32),
                                                (13, Dtype.FLOAT16)])
def test_a_replay_checks_every_sum_and_takes_the_closed_form(workers: int, dtype: Dtype, no_children) -> None:
    count = 3 * SEGMENT_BYTES // dtype.itemsize + 1001  # several segments a tree, the last short
    link = LinkSpec(bandwidth_bps=10e9)
    report = replay(single_collective(CollKind.ALL_REDUCE, count, dtype),
                    ReplayConfig(workers=workers, fabric="tree", iters=1, link=link, payload_scale=2))
    real = -(-count // 2)
    assert report.verification.ok and report.verification.elements_checked == workers * real
    assert report.fabric.fallbacks == {}
    form = tree_all_reduce_us(count, dtype.itemsize, workers, link, 0.0, 2)
    assert report.iterations[0].emulated_us == pytest.approx(form, rel=1e-9)


def test_on_a_topology_the_chains_stay_inside_nodes(no_children) -> None:
    trace = single_collective(CollKind.ALL_REDUCE, 1 << 20)
    nodes = Topology(workers_per_node=4)
    on = replay(trace, ReplayConfig(workers=8, fabric="tree", iters=1, payload_scale=4, topology=nodes))
    flat = replay(trace, ReplayConfig(workers=8, fabric="tree", iters=1, payload_scale=4))
    assert on.verification.ok and on.verification.elements_checked == flat.verification.elements_checked
    # two nodes: only the heads' tree crosses the NICs, the chains ride the nodes' own links
    assert on.summary.bytes_sent < flat.summary.bytes_sent / 3
    with pytest.raises(ConfigError, match="tree.*no hierarchical variant .*ina, ring"):
        ReplayConfig(workers=8, fabric="tree", topology=Topology(workers_per_node=4,
                                                                algorithm=Hierarchy.HIERARCHICAL)).check()
    with pytest.raises(ConfigError, match="all_reduce of float32 by the double binary tree on a topology"):
        predict(trace, ReplayConfig(workers=8, fabric="tree", topology=nodes))


@pytest.mark.parametrize(("workers", "gbps"), [
    pytest.param(16, 10, marks=pytest.mark.slow), pytest.param(16, 100, marks=pytest.mark.slow),  # 9 s each
    pytest.param(64, 10, marks=pytest.mark.slow), pytest.param(64, 100, marks=pytest.mark.slow),
    pytest.param(256, 10, marks=pytest.mark.slow), pytest.param(256, 100, marks=pytest.mark.slow)])
def test_predict_follows_the_mlp_replay(workers: int, gbps: int, no_children) -> None:
    mlp = load_trace(sample_path("mlp"))
    cfg = ReplayConfig(workers=workers, fabric="tree", iters=2, link=LinkSpec(bandwidth_bps=gbps * 1e9))
    replayed = replay(mlp, cfg)
    assert replayed.verification.ok
    got = predict(mlp, cfg).iteration_us_median
    assert got == pytest.approx(replayed.summary.iteration_us_median, rel=0.02)


def test_the_report_names_the_tree_and_every_other_collective_runs_as_on_ring(no_children) -> None:
    res = CliRunner().invoke(cli, ["replay", "tp", "--mesh", "dp=4,tp=2", "--fabric", "tree", "--iters", "1",
                                   "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    ran = {g["role"]: g["ran"] for g in doc["parallelism"]["groups"]}
    assert "double binary tree" in ran["dp"] and doc["verification"]["ok"]
    assert doc["fabric"].get("fallbacks", {}) == {}


def test_the_registry_takes_a_class_once_and_refuses_another_under_its_name() -> None:
    assert fabrics.register(TreeFabric) is TreeFabric and "tree" in fabrics.names()

    class Impostor(fabrics.Fabric):
        name = "tree"
        description = "another"
        mechanisms = TreeFabric.mechanisms

    with pytest.raises(ConfigError, match="'tree' is registered already"):
        fabrics.register(Impostor)
    assert type(fabrics.get("tree")) is TreeFabric
