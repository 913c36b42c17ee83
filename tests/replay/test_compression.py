"""Replays with ``--compress``: true compressed sizes through the fabrics, compute for the
compressors, verification ok, and the report's numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emu.emulator.compression.compressors import COMPRESSORS, cost_us, parse_compress
from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import CompressOption
from emu.replay.plan.programs import plan_programs
from emu.study.predict import predict
from emu.traces import load_trace, sample_path
from emu.traces.model import Coll, CollKind, Compute, Dtype, Trace, Wait

L10 = LinkSpec(bandwidth_bps=10e9)


@pytest.fixture(scope="module")
def mlp() -> Trace:
    return load_trace(sample_path("mlp"))


def run(trace: Trace, fabric: str, compress: str, workers: int = 4) -> object:
    return replay(trace, ReplayConfig(workers=workers, fabric=fabric, iters=1, payload_scale=64, link=L10,
                                      compress=CompressOption(compress)))


@pytest.mark.parametrize("fabric", [pytest.param("ina", marks=pytest.mark.slow), "ring"])
def test_topk_cuts_the_bytes_on_the_wire_tenfold(mlp, fabric: str, no_children) -> None:
    dense, topk = run(mlp, fabric, "none"), run(mlp, fabric, "topk:0.01")
    assert dense.verification.ok and topk.verification.ok and topk.verification.elements_checked > 0
    assert dense.summary.bytes_sent / topk.summary.bytes_sent > 10
    c = topk.compression
    assert c is not None and (c.compressor, c.aggregation, c.feedback, c.collectives) == ("topk:0.01", "all_gather",
                                                                                           True, 2)
    assert c.bytes_dense == sum(op.bytes for op in mlp.ranks[0].iterations[0].colls)
    assert c.ratio == pytest.approx(c.bytes_dense / c.bytes_compressed) and c.ratio > 50
    assert 0 < c.error < 1 and 0 < c.cosine < 1 and "Gaussian" in c.error_sample
    assert topk.to_dict()["config"]["compress"] == {"compressor": "topk:0.01", "speed": 1.0}
    assert dense.compression is None and dense.to_dict()["config"]["compress"] is None
    # top-k's output cannot be summed: an all_gather, which ina's switch multicasts (docs/protocol.md)
    # and a ring runs as its own algorithm: no fallback on either
    assert topk.fabric.fallbacks == {}


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_every_compressor_replays_with_its_true_bytes(mlp, name: str, no_children) -> None:
    r = run(mlp, "ring", name)
    assert r.verification.ok and r.verification.elements_checked > 0
    if name == "none":
        assert r.compression is None
        return
    c = r.compression
    assert c is not None and c.compressor.startswith(name) and c.error is not None
    want = sum(parse_compress(name).__class__(param=parse_compress(name).param,
                                              **({"shapes": op.tensors} if name == "powersgd" else {}))
               .wire_bytes(op.count) for op in mlp.ranks[0].iterations[0].colls)
    assert c.bytes_compressed == want and c.ratio >= 1.99


def test_the_program_compresses_before_the_issue_and_decompresses_after_the_wait(mlp) -> None:
    program = plan_programs(mlp, 8, compress=CompressOption("qsgd:16", speed=2.0))[0]
    original = mlp.ranks[0].iterations[0]
    it = program.iterations[0]
    comp = parse_compress("qsgd:16")
    for op in original.colls:
        k = next(i for i, x in enumerate(it.ops) if isinstance(x, Coll) and x.id == op.id)
        new = it.ops[k]
        assert isinstance(new, Coll) and new.kind == CollKind.ALL_GATHER and new.dtype == Dtype.UINT8
        assert new.count == 8 * comp.wire_bytes(op.count) and new.group_size == 8
        before = it.ops[k - 1]
        assert isinstance(before, Compute) and before.name == "compress"
        assert before.dur_us == pytest.approx(cost_us(comp, op.count, 8, 2.0)[0])
        w = next(i for i, x in enumerate(it.ops) if isinstance(x, Wait) and op.id in x.ids)
        after = it.ops[w + 1]
        assert isinstance(after, Compute) and after.name == "decompress"
    fp16 = plan_programs(mlp, 8, compress=CompressOption("fp16"))[0].iterations[0].colls
    assert [(c.kind, c.dtype, c.count) for c in fp16] == [(CollKind.ALL_REDUCE, Dtype.FLOAT16, c.count)
                                                          for c in original.colls]


def test_powersgd_without_shapes_is_refused_before_anything_runs(mlp, no_children) -> None:
    bare = replace(mlp, ranks=tuple(replace(r, iterations=tuple(
        replace(it, ops=tuple(replace(op, tensors=None) if isinstance(op, Coll) else op for op in it.ops))
        for it in r.iterations)) for r in mlp.ranks))
    with pytest.raises(ConfigError, match="PowerSGD needs the bucket's parameter shapes"):
        run(bare, "ring", "powersgd:2")


def test_predict_follows_the_compressed_programs(mlp, no_children) -> None:
    cfg = ReplayConfig(workers=4, fabric="ring", iters=1, payload_scale=64, link=L10,
                       compress=CompressOption("topk:0.01"))
    assert predict(mlp, cfg).iteration_us_median == pytest.approx(replay(mlp, cfg).summary.iteration_us_median,
                                                                  rel=0.02)


@pytest.mark.parametrize(("option", "words"), [(CompressOption("topk:5"), "ratio must be in (0, 1]"),
                                               (CompressOption("topk", speed=0.0), "--compress-speed")])
def test_bad_options_are_config_errors(option: CompressOption, words: str) -> None:
    with pytest.raises(ConfigError, match="--compress") as err:
        ReplayConfig(compress=option).check()
    assert words in str(err.value)


def test_a_sweep_records_the_compressor_of_each_point(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from emu.cli import cli

    result = CliRunner().invoke(cli, ["sweep", "mlp", "--workers", "2", "--fabric", "ring", "--iters", "1",
                                      "--payload-scale", "64", "--compress", "topk:0.01", "--out",
                                      str(tmp_path / "s"), "--no-plots", "--no-predict"])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "s" / "results.json").read_text())
    rows = rows["points"]
    assert len(rows) == 1 and rows[0]["compression_ratio"] > 50 and 0 < rows[0]["compression_error"] < 1
    assert "compression_ratio" in (tmp_path / "s" / "results.csv").read_text().splitlines()[0]


def test_review_edges_of_the_rewrite() -> None:
    """A collective nothing waits for is decompressed after a wait for it; an all_gather on a
    sub-group gathers from the group; the framework's sparse all_reduce and 16-bit tensors under
    fp16 stay as they are."""
    from emu.replay.plan.compression import with_compression
    from emu.traces.model import Iteration, RankProgram, Sparsity

    comp = parse_compress("topk:0.1")
    a = Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=1000, bytes=4000, group_size=8)
    b = replace(a, id=1, group=(0, 1, 2, 3), group_size=4)
    sparse = replace(a, id=2, sparsity=Sparsity(16, 0.1, 0.2, sparse_tensor=True))
    half = replace(a, id=3, dtype=Dtype.FLOAT16, bytes=2000)
    program = RankProgram(rank=0, iterations=(Iteration(step=0, measured_us=1.0, ops=(a, b, sparse, half)),))
    ops = with_compression((program,), 8, comp, 1.0)[0].iterations[0].ops
    colls = [op for op in ops if isinstance(op, Coll)]
    assert [c.count for c in colls[:2]] == [8 * comp.wire_bytes(1000), 4 * comp.wire_bytes(1000)]
    assert colls[2] == sparse and colls[3].kind == CollKind.ALL_GATHER  # topk compresses 16-bit too
    assert isinstance(ops[-2], Wait) and set(ops[-2].ids) == {0, 1, 3} and ops[-1].name == "decompress"
    fp16 = with_compression((program,), 8, parse_compress("fp16"), 1.0)[0].iterations[0].colls
    assert fp16[3] == half and fp16[2] == sparse


def test_compression_replaces_the_sparse_algorithms_and_says_so(no_children) -> None:
    dlrm = load_trace(sample_path("dlrm"))
    sparse = replay(dlrm, ReplayConfig(workers=4, fabric="ring", iters=1, payload_scale=64))
    qsgd = replay(dlrm, ReplayConfig(workers=4, fabric="ring", iters=1, payload_scale=64,
                                     compress=CompressOption("qsgd")))
    assert sparse.sparsity is not None and sparse.sparsity.sparse_collectives == 1
    assert qsgd.sparsity is None and qsgd.verification.ok  # the compressed bucket is coded densely
    assert qsgd.summary.bytes_sent > sparse.summary.bytes_sent and qsgd.compression.ratio == pytest.approx(4.0)


def test_powersgd_error_is_measured_on_matrices() -> None:
    from emu.replay.plan.compression import error_of

    op = Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=2048 * 1024 + 2048, bytes=4 * (2048 * 1024 + 2048),
              group_size=8, tensors=((2048,), (2048, 1024)))
    step = error_of(parse_compress("powersgd:1"), op, 8, 0)
    assert 0.5 < step.error < 1 and 0 < step.cosine < 0.9 and "matrices' first rows" in step.sample
    assert step.exact is None  # nothing was summed in a switch's lanes


@pytest.mark.parametrize("text", ["qsgd:inf", "powersgd:nan", "topk:inf"])
def test_non_finite_parameters_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="finite"):
        parse_compress(text)


def test_error_feedback_shrinks_the_accumulated_error() -> None:
    from emu.replay.plan.compression import accumulated_error

    op = Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=100_000, bytes=400_000, group_size=8)
    topk = accumulated_error(parse_compress("topk:0.01"), op, 8, 0)
    qsgd = accumulated_error(parse_compress("qsgd"), op, 8, 0)
    assert len(topk) == len(qsgd) == 8
    assert topk[-1] < topk[0] - 0.1 and all(b <= a for a, b in zip(topk, topk[1:], strict=False))
    assert abs(qsgd[-1] - qsgd[0]) < 0.05  # unbiased: the relative error of the sum stays where it was


@pytest.mark.slow
def test_on_ina_an_all_reduce_counts_what_the_switch_carries(mlp, no_children) -> None:
    """INA's packets carry int32: fp16 halves nothing there, and the report says so."""
    ina, ring = run(mlp, "ina", "fp16"), run(mlp, "ring", "fp16")
    assert ina.compression.in_switch and ina.compression.ratio == pytest.approx(1.0)
    assert not ring.compression.in_switch and ring.compression.ratio == pytest.approx(2.0)
    topk = run(mlp, "ina", "topk:0.01").compression  # an all_gather: point to point, packed bytes
    assert not topk.in_switch and topk.ratio > 50


@pytest.mark.parametrize("name", ["signsgd", pytest.param("terngrad", marks=pytest.mark.slow),
                                  pytest.param("qsgd", marks=pytest.mark.slow)])
def test_on_ina_the_switch_sums_the_quantizers_levels(mlp, name: str, no_children) -> None:
    """signsgd, terngrad and qsgd: an all_reduce of int32 lanes on ina, summed in the switch (no
    fallback), bytes of the lanes; point to point (an all_gather of packed bits) on the ring."""
    from emu.emulator.compression.in_switch import fields_per_lane

    comp = parse_compress(name)
    ina, ring = run(mlp, "ina", name, workers=8), run(mlp, "ring", name, workers=8)
    assert ina.verification.ok and ina.verification.elements_checked > 0 and ring.verification.ok
    c = ina.compression
    assert c.in_switch and c.aggregation == "all_reduce" and c.switch_exact is True
    assert ina.fabric.fallbacks == {}  # nothing ran point to point
    f = fields_per_lane(comp, 8)
    assert c.bytes_compressed == sum(4 * -(-op.count // f) for op in mlp.ranks[0].iterations[0].colls)
    assert "int32 lanes" in c.error_sample
    assert not ring.compression.in_switch and ring.compression.switch_exact is None
    assert ring.compression.aggregation == "all_gather"
    # the lanes' bytes go up and down once, the all_gather's cross M - 1 links one after another
    assert ina.summary.iteration_us_median < ring.summary.iteration_us_median


def test_in_switch_lanes_follow_the_workers(mlp) -> None:
    """A field holds the sum of M levels: fewer fields a lane as M grows, none past 2^31."""
    from emu.emulator.compression.in_switch import fields_per_lane, lanes

    sign = parse_compress("signsgd")
    assert [fields_per_lane(sign, m) for m in (2, 8, 256, 1024)] == [10, 6, 3, 2]
    assert fields_per_lane(parse_compress("qsgd:64"), 8) == 2 and fields_per_lane(parse_compress("qsgd:64"), 256) == 1
    assert lanes(parse_compress("qsgd:65536"), 1000, 1 << 14) is None  # S M >= 2^30: no field fits
    assert lanes(parse_compress("topk"), 1000, 8) is None
    op = mlp.ranks[0].iterations[0].colls[0]
    big = plan_programs(mlp, 4, compress=CompressOption("qsgd:65536"), switch_sums=True)
    assert [c.kind for c in big[0].iterations[0].colls] == [CollKind.ALL_REDUCE] * 2  # 17-bit fields: one a lane
    assert big[0].iterations[0].colls[0].count == op.count


def test_powersgd_issues_its_two_all_reduces_back_to_back(mlp, no_children) -> None:
    """P then Q, each its own all_reduce on the FIFO stream (Q starts when P completed); the
    bucket's wait waits for both; the replay verifies both."""
    comp = parse_compress("powersgd:2")
    progs = plan_programs(mlp, 4, compress=CompressOption("powersgd:2"))
    it = progs[0].iterations[0]
    buckets = mlp.ranks[0].iterations[0].colls
    colls = it.colls
    assert len(colls) == 2 * len(buckets)
    for k, op in enumerate(buckets):
        p, q = replace(comp, shapes=op.tensors).sizes(op.count)
        first, second = colls[2 * k], colls[2 * k + 1]
        assert (first.id, first.count, second.count) == (op.id, p, q) and second.id not in {b.id for b in buckets}
        waits = [w for w in it.ops if isinstance(w, Wait) and op.id in w.ids]
        assert waits and all(second.id in w.ids for w in waits)
    r = run(mlp, "ring", "powersgd:2")
    assert r.verification.ok and r.compression.bytes_compressed == sum(
        4 * sum(replace(comp, shapes=op.tensors).sizes(op.count)) for op in buckets)


def test_a_captured_sample_is_what_the_error_is_measured_on(no_children) -> None:
    """A trace whose capture sampled its gradients (``gradient_samples``, heavy-tailed here) has the
    compressors' error measured on them, the workers derived from the ranks' samples, and the
    report says so (``compression.data`` is ``sampled``); the same trace without them keeps the
    Gaussian sample."""
    import numpy as np

    from emu.emulator.compression.compressors import aggregate
    from emu.replay.plan.compression import derived
    from emu.traces.model import GradientSample

    trace = load_trace(sample_path("mlp"))
    rng = np.random.default_rng(0)
    samples = tuple(GradientSample(p.rank, i, op.id, (rng.standard_t(2, 4096) * 1e-3).astype("<f4").tobytes())
                    for p in trace.ranks for i, it in enumerate(p.iterations) for op in it.colls
                    if op.kind == CollKind.ALL_REDUCE and op.dtype.is_float)
    config = ReplayConfig(workers=8, fabric="ring", iters=1, compress=CompressOption("topk:0.01"))
    sampled = replay(replace(trace, gradient_samples=samples), config).compression
    plain = replay(trace, config).compression
    assert (sampled.data, plain.data) == ("sampled", "generated") and "sampled at capture" in sampled.error_sample
    largest = max((op for op in trace.ranks[0].iterations[0].colls if op.kind == CollKind.ALL_REDUCE),
                  key=lambda op: op.count)
    rows = np.stack([next(g for g in samples if (g.rank, g.iteration, g.coll) == (r, 0, largest.id)).array()
                     for r in (0, 1)])
    grads = [derived(rows, w, config.seed, 0) for w in range(8)]
    exact = np.sum(grads, axis=0, dtype=np.float64)
    got = aggregate(parse_compress("topk:0.01"), grads, config.seed).astype(np.float64)
    assert sampled.error == pytest.approx(np.linalg.norm(got - exact) / np.linalg.norm(exact), rel=1e-6)
    assert sampled.error < 0.7 * plain.error  # a heavy tail keeps more of its norm in the top 1%
    assert len(sampled.error_accumulated) == len(plain.error_accumulated)
