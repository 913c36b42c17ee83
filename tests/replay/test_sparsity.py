"""Replays whose payload follows a sparsity (docs/sparse.md): verification stays exact on every
fabric, the realized fractions follow the asked ones, and dense replays are what they were."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import SparsityOption
from emu.replay.plan.programs import plan_programs
from emu.replay.plan.sparsity import job_plan, with_sparsity
from emu.traces import load_trace, sample_path
from emu.traces.model import Coll, CollKind, Dtype, Sparsity, Trace
from emu.traces.synthetic import single_collective
from tests.replay.test_clock import exact_part

FABRICS = ["ina", "ring", "ps"]


@pytest.fixture(scope="module")
def mlp() -> Trace:
    return load_trace(sample_path("mlp"))


def with_trace_sparsity(trace: Trace, per_rank: dict[int, float], union: float, k: int) -> Trace:
    """The trace as a capture with gradient masks would record it: each rank its own fraction."""
    ranks = []
    for r in trace.ranks:
        its = tuple(replace(it, ops=tuple(
            replace(op, sparsity=Sparsity(k, per_rank[r.rank], union))
            if isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE else op for op in it.ops))
            for it in r.iterations)
        ranks.append(replace(r, iterations=its))
    return replace(trace, ranks=tuple(ranks))


def run(trace: Trace, fabric: str, sparsity: str, workers: int = 4, **kw):
    return replay(trace, ReplayConfig(workers=workers, fabric=fabric, payload_scale=64, iters=1,
                                      sparsity=SparsityOption.parse(sparsity), **kw))


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize(("text", "nonzero", "union"), [("0.1", 0.1, 1 - 0.9**4), ("0.1:0.3", 0.1, 0.3)])
def test_sparse_payload_verifies_on_every_fabric(mlp, fabric: str, text: str, nonzero: float, union: float,
                                                 no_children) -> None:
    r = run(mlp, fabric, text)
    assert r.verification.ok and r.verification.elements_checked > 0 and r.verification.mismatches == 0
    cfg = r.config["sparsity"]
    assert cfg["source"] == "option" and cfg["block_elements"] == 256
    assert cfg["nonzero"] == pytest.approx(nonzero) and cfg["union"] == pytest.approx(union)
    s = r.sparsity
    assert s is not None and s.collectives == 2 and s.blocks > 300
    assert s.sent_fraction < 0.6 and s.sparse_collectives == 2  # every fabric skips the zero blocks
    assert s.union_fraction == pytest.approx(union, abs=0.01)
    assert s.nonzero_fraction == pytest.approx(nonzero, abs=0.01)
    assert r.to_dict()["sparsity"]["nonzero_fraction"] == s.nonzero_fraction


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("dtype", [Dtype.FLOAT16, Dtype.BFLOAT16])
def test_sixteen_bit_sparse_payload_verifies(fabric: str, dtype: Dtype, no_children) -> None:
    trace = single_collective(CollKind.ALL_REDUCE, 2_000_000, dtype)
    r = run(trace, fabric, "0.05:0.2", workers=5, elements=256)
    assert r.verification.ok and r.verification.elements_checked > 0
    assert r.sparsity is not None
    assert r.sparsity.union_fraction == pytest.approx(0.2, abs=0.01)
    assert r.sparsity.nonzero_fraction == pytest.approx(0.05, abs=0.01)


def test_integer_all_reduce_stays_dense(no_children) -> None:
    trace = single_collective(CollKind.ALL_REDUCE, 100_000, Dtype.INT32)
    dense = run(trace, "ring", "none")
    asked = run(trace, "ring", "0.1")
    assert asked.verification.ok and asked.sparsity is None
    assert asked.verification == dense.verification and asked.summary == dense.summary


@pytest.mark.parametrize("loss", [0.0, 0.01])
@pytest.mark.slow
def test_ina_streams_only_the_union(mlp, loss: float, no_children) -> None:
    """The sparse stream sends the union's blocks alone: fewer bytes, less time, the same sums."""
    link = LinkSpec(bandwidth_bps=10e9, loss=loss)
    sparse = run(mlp, "ina", "0.05:0.1", link=link)
    dense = run(mlp, "ina", "none", link=link)
    assert sparse.verification.ok and dense.verification.ok and sparse.verification.elements_checked > 0
    assert sparse.sparsity is not None and sparse.sparsity.sparse_collectives == 2
    assert sparse.sparsity.sent_fraction < 0.2
    assert sparse.summary.bytes_sent < 0.25 * dense.summary.bytes_sent
    assert sparse.summary.iteration_us_median < dense.summary.iteration_us_median


def test_the_p4_switch_streams_dense() -> None:
    """The P4 program aggregates every block (docs/p4.md): only emu's software switch is sparse."""
    from emu.emulator import fabric

    assert fabric.get("ina").sparse_stream
    assert not fabric.Fabric.sparse_stream


@pytest.mark.slow
def test_none_is_the_dense_replay(mlp, no_children) -> None:
    """On a trace without sparsity, ``--sparsity none`` and the default give the same report."""
    default = replay(mlp, ReplayConfig(workers=4, fabric="ina", payload_scale=64, iters=1))
    none = run(mlp, "ina", "none")
    assert default.config["sparsity"] is None and default.sparsity is None
    assert exact_part(none) == exact_part(default)
    assert none.summary == default.summary and none.verification == default.verification


def test_the_trace_sparsity_is_followed_job_wide(mlp, no_children) -> None:
    """Ranks record their own fractions; the payload follows one job-wide value (their mean)."""
    trace = with_trace_sparsity(mlp, {0: 0.1, 1: 0.2}, union=0.4, k=128)
    r = run(trace, "ring", "trace")
    assert r.verification.ok
    assert r.config["sparsity"] == {"source": "trace", "nonzero": pytest.approx(0.15), "union": 0.4,
                                    "block_elements": 128}
    assert r.sparsity is not None and r.sparsity.union_fraction == pytest.approx(0.4, abs=0.01)
    assert r.sparsity.nonzero_fraction == pytest.approx(0.15, abs=0.015)
    programs = plan_programs(trace, 4, sparsity=SparsityOption())
    seen = {op.sparsity for p in programs for it in p.iterations for op in it.colls}
    assert len(seen) == 1 and seen.pop() == Sparsity(128, pytest.approx(0.15), 0.4)
    # --sparsity none ignores it; --sparsity-block re-blocks it
    none = run(trace, "ring", "none")
    assert none.sparsity is None and none.config["sparsity"]["source"] == "none"
    assert none.summary.bytes_sent > r.summary.bytes_sent and none.verification.ok
    reblocked = replay(trace, ReplayConfig(workers=4, fabric="ina", payload_scale=64, iters=1,
                                           sparsity=SparsityOption.parse("trace", 1000)))
    assert reblocked.verification.ok and reblocked.config["sparsity"]["block_elements"] == 1000


@pytest.mark.slow
def test_identical_across_process_layouts(mlp, no_children) -> None:
    config = ReplayConfig(workers=4, fabric="ina", iters=1, payload_scale=64, sparsity=SparsityOption.parse("0.2:0.5"))
    first, second = (exact_part(replay(mlp, replace(config, processes=p))) for p in (1, 2))
    assert first == second and first["verification"]["ok"] and first["sparsity"]["blocks"] > 0


def test_dense_programs_are_the_trace_objects(mlp) -> None:
    assert all(a is b for a, b in zip(with_sparsity(mlp, 4, None), mlp.ranks, strict=True))
    assert job_plan(mlp, 4, SparsityOption()) == ((None, None),) * len(job_plan(mlp, 4, SparsityOption()))


@pytest.mark.parametrize(("text", "want"), [
    ("trace", SparsityOption()), ("none", SparsityOption(source="none")), (" NONE ", SparsityOption(source="none")),
    ("0.1", SparsityOption(source="option", nonzero=0.1)),
    ("10%:30%", SparsityOption(source="option", nonzero=0.1, union=0.3)),
    ("1", SparsityOption(source="option", nonzero=1.0))])
def test_parse(text: str, want: SparsityOption) -> None:
    got = SparsityOption.parse(text)
    assert got == want
    got.check()
    assert SparsityOption.parse(got.text) == got


@pytest.mark.parametrize(("text", "block", "words"), [
    ("2", None, "(0, 1]"), ("0", None, "(0, 1]"), ("0.3:0.2", None, "[F, 1]"), ("0.3:1.5", None, "[F, 1]"),
    ("abc", None, "give F"), ("0.1:0.2:0.3", None, "give F"), ("nan", None, "give F"), ("0.1", 0, "--sparsity-block"),
    ("trace", 1 << 21, "--sparsity-block")])
def test_bad_values_name_the_option(text: str, block: int | None, words: str) -> None:
    with pytest.raises(ConfigError, match="--sparsity") as exc:
        config = ReplayConfig(sparsity=SparsityOption.parse(text, block))
        config.check()
    assert words in str(exc.value)


def test_the_job_value_is_the_workers_mean_and_one_per_position(mlp) -> None:
    """3 workers run ranks 0, 1, 0; ranks with different iteration counts get one value per position."""
    trace = with_trace_sparsity(mlp, {0: 0.1, 1: 0.4}, union=0.5, k=256)
    plan = job_plan(trace, 3, SparsityOption())
    assert [s.nonzero for row in plan for s in row] == pytest.approx([0.2] * 2 * len(plan))
    uneven = replace(trace, ranks=(trace.ranks[0], replace(trace.ranks[1], iterations=trace.ranks[1].iterations[:1])))
    programs = plan_programs(uneven, 4, sparsity=SparsityOption())
    assert len({op.sparsity for p in programs for it in p.iterations for op in it.colls}) == 1
    assert job_plan(uneven, 4, SparsityOption("option", 0.1))[0][0] == Sparsity(256, 0.1, 1 - 0.9**4)


def test_the_shipped_sparse_sample_replays_as_recorded(no_children) -> None:
    from emu.traces import SAMPLES

    if "dlrm" not in SAMPLES:
        pytest.skip("no shipped sample with sparsity")
    r = replay(load_trace(sample_path("dlrm")), ReplayConfig(workers=4, fabric="ina", payload_scale=64, iters=1))
    cfg = r.config["sparsity"]
    assert r.verification.ok and cfg["source"] == "trace" and 0 < cfg["nonzero"] <= cfg["union"] < 1
    assert r.sparsity is not None
    assert r.sparsity.union_fraction == pytest.approx(cfg["union"], abs=0.01)
    assert r.sparsity.nonzero_fraction == pytest.approx(cfg["nonzero"], abs=0.01)


@pytest.fixture(scope="module")
def embedding() -> Trace:
    from emu.capture import import_kineto
    from tests.conftest import GLOO_SPARSE

    return import_kineto(sorted(GLOO_SPARSE.glob("rank*.json.gz")))


@pytest.mark.parametrize(("fabric", "split"), [("ina", (1, 1)), pytest.param("ring", (1, 1), marks=pytest.mark.slow),
                                              pytest.param("ps", (2, 0), marks=pytest.mark.slow)])
def test_a_sparse_tensor_all_reduce_runs_sparse_whatever_the_cost(embedding, fabric: str, split, no_children) -> None:
    """The framework's sparse all_reduce (a sparse embedding's gradient under DDP) stays sparse where
    dense would be cheaper; the dense bucket beside it takes the fabric's own choice."""
    r = replay(embedding, ReplayConfig(workers=8, fabric=fabric, iters=1, sparsity=SparsityOption.parse("0.5")))
    assert r.verification.ok and r.sparsity is not None
    assert (r.sparsity.sparse_collectives, r.sparsity.dense_collectives) == split
    recorded = replay(embedding, ReplayConfig(workers=8, fabric=fabric, iters=1))
    assert recorded.verification.ok and recorded.config["sparsity"]["block_elements"] == 32  # one row a block
    assert recorded.sparsity is not None and recorded.sparsity.sent_fraction < 0.05
