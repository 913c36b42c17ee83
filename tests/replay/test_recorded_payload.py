"""Replays that send the real ranks' tensors (emu run's recorded payload) through every fabric."""

from __future__ import annotations

import datetime as dt
import io
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator.compression.compressors import ErrorFeedback, message_seed, parse_compress
from emu.emulator.compression.in_switch import switch_aggregate
from emu.emulator.payload import recorded
from emu.emulator.payload.recorded import RecordedPayload, load_payload, payload_arrays
from emu.errors import ConfigError, TraceError
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import CompressOption
from emu.replay.plan.compressed_payload import compressed_payload
from emu.replay.plan.compression import derived
from emu.traces.io import save_trace
from emu.traces.model import (
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
)

K, M = 2, 8
F32 = Dtype.FLOAT32
# (kind, count, dtype, root): the count is the trace's (all_gather, reduce_scatter: the whole output / input)
COLLS = ((CollKind.ALL_REDUCE, 5000, F32, None), (CollKind.BROADCAST, 300, F32, 1),
         (CollKind.ALL_GATHER, 80 * M, F32, None), (CollKind.REDUCE_SCATTER, 40 * M, F32, None),
         (CollKind.BARRIER, 0, Dtype.UINT8, None), (CollKind.ALL_REDUCE, 700, Dtype.FLOAT64, None))
ITERATIONS = 2


def _trace() -> Trace:
    ranks = []
    for r in range(K):
        its = []
        for i in range(ITERATIONS):
            ops: list = [Compute(name="fwd", dur_us=200.0 + 10 * r)]
            for c, (kind, count, dtype, root) in enumerate(COLLS):
                ops.append(Coll(id=c, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize,
                                group_size=K, root=root))
            ops.append(Wait(ids=tuple(range(len(COLLS)))))
            its.append(Iteration(step=i, measured_us=0.0, ops=tuple(ops)))
        ranks.append(RankProgram(rank=r, iterations=tuple(its)))
    meta = TraceMeta(source=Source.LIVE, world_size=K, backend="emu", device="cpu", framework="test",
                     dtype="float32", captured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    return Trace(meta=meta, ranks=tuple(ranks))


def _payload(seed: int = 7) -> RecordedPayload:
    """Gradient-like values: normal, scaled over six decades, so that no sum is exact in float32."""
    rng = np.random.default_rng(seed)
    tensors, dtypes = [], []
    for _ in range(ITERATIONS):
        for kind, count, dtype, _root in COLLS:
            dtypes.append(dtype.value)
            if kind == CollKind.BARRIER:
                tensors.append(None)
                continue
            values = rng.standard_normal((K, count)) * 10.0 ** rng.uniform(-6, 0, (K, count))
            tensors.append(values.astype(np.float32 if dtype == F32 else np.float64))
    return RecordedPayload(real_ranks=K, per_iteration=len(COLLS), dtypes=tuple(dtypes), tensors=tuple(tensors))


@pytest.fixture(scope="module")
def trace() -> Trace:
    return _trace()


@pytest.mark.parametrize("fabric", ["ina", "ring", "ps"])
def test_every_fabric_carries_and_checks_the_real_tensors(trace, fabric, no_children) -> None:
    """Every kind crosses the fabric with the real ranks' values and is checked where it lands:
    as many elements as generated payload is checked at, and none wrong."""
    config = ReplayConfig(workers=M, fabric=fabric, iters=3)
    real = replay(trace, config, payload=_payload())
    generated = replay(trace, config)
    assert real.verification.payload == "recorded" and generated.verification.payload == "generated"
    assert real.verification.ok and real.verification.mismatches == 0
    assert real.verification.elements_checked == generated.verification.elements_checked > 0
    # the data does not change the times: they follow from the programs (docs/run.md)
    assert [it.emulated_us for it in real.iterations] == [it.emulated_us for it in generated.iterations]


@pytest.mark.parametrize("fabric", ["ina", "ring", "ps"])
def test_a_worker_sending_other_values_is_caught(trace, fabric, monkeypatch, no_children) -> None:
    """Worker 3 adds 1 to what it sends: the sums formed from the real ranks' tensors disagree.
    (The replay's processes are forked: they inherit the patch.)"""
    values, rows = recorded.RecordedBlock.values, recorded.RecordedPayload.rows

    def bad_values(self, worker):
        return values(self, worker) + (worker == 3)

    def bad_rows(self, seq, workers, blocks, k):
        return rows(self, seq, workers, blocks, k) + (np.asarray(workers) == 3)[:, None]

    monkeypatch.setattr(recorded.RecordedBlock, "values", bad_values)
    monkeypatch.setattr(recorded.RecordedPayload, "rows", bad_rows)
    report = replay(trace, ReplayConfig(workers=M, fabric=fabric, iters=1), payload=_payload())
    assert not report.verification.ok and report.verification.mismatches > 0


def test_the_switch_sums_are_exact_and_the_ring_within_rounding() -> None:
    """On ina each worker quantizes its real rank's rows with the agreed exponent, and the int32
    sum is M / K times the real ranks' sum of them, exactly; a point-to-point sum may differ from
    the float64 sum by its dtype's rounding per addition, and no more."""
    p = _payload()
    blk = p.block(0, 0, 5000)
    assert np.array_equal(blk.values(5), p.tensors[0][1].astype(np.float64))
    want = blk.expected_sum(M)
    assert np.allclose(want, (M // K) * p.tensors[0].astype(np.float64).sum(axis=0))
    # a ring's order, rounded to float32 at each hop, stays within the slack
    acc = np.zeros(5000, np.float32)
    for w in range(M):
        acc = (acc + blk.values((w + 3) % M)).astype(np.float32)
    slack = blk.slack(M)
    assert (np.abs(acc - want) <= slack).all()
    assert (slack < 1e-4 * np.abs(blk.ranks).sum(axis=0) * M).all()  # and it is tight: 1e-4 relative is caught
    rows = p.rows(0, np.array([0, 1, 2, 3]), np.array([0, 0, 1, 78]), 64)
    assert rows.shape == (4, 64) and np.array_equal(rows[2], p.tensors[0][0, 64:128])
    assert np.array_equal(rows[3, :8], p.tensors[0][1, 78 * 64:]) and not rows[3, 8:].any()  # zero padded


def test_the_payload_must_belong_to_the_trace(trace) -> None:
    p = _payload()
    with pytest.raises(ConfigError, match="multiple of 2"):
        replay(trace, ReplayConfig(workers=7, fabric="ring"), payload=p)
    one = RecordedPayload(1, p.per_iteration, p.dtypes, tuple(None if t is None else t[:1] for t in p.tensors))
    with pytest.raises(ConfigError, match="holds 1 real ranks"):
        replay(trace, ReplayConfig(workers=M), payload=one)
    half = RecordedPayload(K, p.per_iteration, p.dtypes[: len(COLLS)], p.tensors[: len(COLLS)])
    with pytest.raises(ConfigError, match="holds 1 iterations"):
        replay(trace, ReplayConfig(workers=M), payload=half)
    swapped = RecordedPayload(K, p.per_iteration, ("float64", *p.dtypes[1:]), p.tensors)
    with pytest.raises(ConfigError, match="entry 0 is not collective 0"):
        replay(trace, ReplayConfig(workers=M), payload=swapped)
    counts = [c for _ in range(ITERATIONS) for _, c, _, _ in COLLS]
    coarse = p.trimmed(counts, 4)  # recorded for payload scale 4: too few for scale 1
    with pytest.raises(ConfigError, match="--payload-scale 4 or more"):
        replay(trace, ReplayConfig(workers=M, payload_scale=1), payload=coarse, payload_path="live.payload.npz")
    report = replay(trace, ReplayConfig(workers=M, payload_scale=4, iters=1), payload=coarse)
    assert report.verification.ok and report.verification.payload == "recorded"


def test_compression_sends_every_workers_message_and_measures_their_error(trace, no_children) -> None:
    """Under --compress each of the M workers compresses its own gradient for real (the real ranks'
    tensors for the first K, derived ones for the others; top-k with error feedback over the
    iterations): the payload of each all_gather holds every worker's message at its own chunk, the
    fabric checks those bytes, and the error is that of the aggregate of those messages against the
    exact sum of the workers' gradients, found here from the compressor alone."""
    payload = _payload()
    config = ReplayConfig(workers=M, fabric="ring", iters=2, payload_scale=1, compress=CompressOption("topk:0.1"))
    report = replay(trace, config, payload=payload)
    assert report.verification.ok and report.verification.payload == "recorded"
    c = report.compression
    assert c.data == "recorded" and f"{M} workers' own gradients" in c.error_sample
    topk = parse_compress("topk:0.1")
    memory = ErrorFeedback(topk)
    got, want = [], []
    for i, (kind, *_) in enumerate(COLLS * ITERATIONS):
        if kind != CollKind.ALL_REDUCE:
            continue
        rows = payload.tensors[i].astype(np.float32)
        position = [j for j, c_ in enumerate(COLLS) if c_[0] == CollKind.ALL_REDUCE].index(i % len(COLLS))
        grads = [derived(rows, w, config.seed, i) for w in range(M)]
        parts = [memory.step(w, position, grads[w], 0)[1] for w in range(M)]  # top-k draws nothing
        got.append(topk.combine(parts).astype(np.float64))
        want.append(np.sum(grads, axis=0, dtype=np.float64))
    got, want = np.concatenate(got), np.concatenate(want)
    assert c.error == pytest.approx(np.linalg.norm(got - want) / np.linalg.norm(want), rel=1e-9)
    assert len(c.error_accumulated) == ITERATIONS and 0 < c.error < 1

    real, _, why = compressed_payload(trace, config, payload)
    assert why is None
    first = payload.tensors[0].astype(np.float32)  # iteration 0's all_reduce: nothing carried over yet
    length = topk.wire_bytes(COLLS[0][1])
    assert real.dtypes[0] == "uint8" and real.tensors[0].shape == (1, length * M)
    for w in range(M):
        want_msg = topk.compress(derived(first, w, config.seed, 0), 0)
        assert np.array_equal(real.tensors[0][0, w * length:(w + 1) * length], want_msg)
    assert np.array_equal(real.tensors[0][0, :length], topk.compress(first[0], 0))  # worker 0: real rank 0


def test_derived_gradients_resample_the_ranks_spread() -> None:
    """The first K workers are the real ranks; every other is the ranks' mean plus one of their
    residuals per element with a random sign: the same mean, the same spread, its own draws."""
    rows = np.random.default_rng(3).standard_normal((3, 20000)).astype(np.float32)
    mean = rows.mean(axis=0, dtype=np.float64)
    assert all(np.array_equal(derived(rows, r, 0, 5), rows[r]) for r in range(3))
    grads = np.stack([derived(rows, w, 0, 5) for w in range(3, 40)]).astype(np.float64)
    residuals = np.abs(rows - mean)  # each derived element is mean +- one rank's residual
    off = np.abs(grads - mean)
    assert np.all(np.min(np.abs(off[:, None, :] - residuals[None, :, :]), axis=1) < 1e-5)
    assert np.abs(grads.mean(axis=0) - mean).mean() < 0.2 * residuals.mean()
    assert grads.std(axis=0).mean() == pytest.approx(np.sqrt(((rows - mean) ** 2).mean(axis=0)).mean(), rel=0.05)
    assert not np.array_equal(derived(rows, 3, 0, 5), derived(rows, 4, 0, 5))
    assert np.array_equal(derived(rows, 7, 0, 5), derived(rows, 7, 0, 5))  # seeded


def test_a_payload_scale_mirrors_the_real_ranks_and_says_so(trace, no_children) -> None:
    """At payload scale 2 a message's part is all a worker sends: the M / K workers of a real rank
    send its message, as the error's sample says."""
    config = ReplayConfig(workers=M, fabric="ring", iters=1, payload_scale=2, compress=CompressOption("topk:0.1"))
    real, error, why = compressed_payload(trace, config, _payload())
    assert why is None and error is not None and "payload scale 2" in error.sample
    assert real.tensors[0].shape[0] == K


@pytest.mark.parametrize(("compress", "fabric", "cut", "why"), [
    ("dgc", "ring", False, "message length differs per worker"),
    ("topk:0.1", "ring", True, "compressing a part is not compressing the tensor"),
])
def test_where_compression_cannot_use_the_real_tensors_the_report_says_why(trace, compress, fabric, cut, why,
                                                                            no_children) -> None:
    payload = _payload()
    if cut:  # recorded at payload scale 2
        payload = payload.trimmed([c[1] for c in COLLS] * ITERATIONS, 2)
    report = replay(trace, ReplayConfig(workers=M, fabric=fabric, iters=1, payload_scale=2 if cut else 1,
                                        compress=CompressOption(compress)), payload=payload)
    assert report.verification.ok and report.verification.payload == "generated"
    assert why in report.verification.payload_note and report.compression.data == "generated"


def test_the_switch_sums_the_real_levels_in_its_lanes(trace, no_children) -> None:
    """On ina, qsgd's levels of every worker's real (or derived) gradient cross as int32 lanes the
    switch adds; the fabric checks their sums exactly, and the aggregate is what the sample's own
    path (``in_switch.switch_aggregate``, with the same draws) makes of the same gradients."""
    config = ReplayConfig(workers=M, fabric="ina", iters=2, payload_scale=1, compress=CompressOption("qsgd"))
    payload = _payload()
    report = replay(trace, config, payload=payload)
    c = report.compression
    assert report.verification.ok and report.verification.payload == "recorded"
    assert c.data == "recorded" and c.in_switch and c.switch_exact is True
    qsgd = parse_compress("qsgd")
    got, want = [], []
    for i, (kind, *_) in enumerate(COLLS * ITERATIONS):
        if kind != CollKind.ALL_REDUCE:
            continue
        grads = [derived(payload.tensors[i].astype(np.float32), w, config.seed, i) for w in range(M)]
        s = switch_aggregate(qsgd, grads, message_seed(qsgd, config.seed, i, 0), config.elements, M)
        assert s.exact
        got.append(s.aggregate.astype(np.float64))
        want.append(np.sum(grads, axis=0, dtype=np.float64))
    got, want = np.concatenate(got), np.concatenate(want)
    assert c.error == pytest.approx(np.linalg.norm(got - want) / np.linalg.norm(want), rel=1e-6)
    # at 6 workers qsgd:4's lanes would need the stream's headroom bit: generated, and why
    report = replay(trace, ReplayConfig(workers=6, fabric="ina", iters=1, payload_scale=1,
                                        compress=CompressOption("qsgd:4")), payload=payload)
    assert report.verification.ok and report.compression.data == "generated"
    assert "fixed point at 6 workers would round qsgd:4's int32 lanes" in report.verification.payload_note


def test_the_messages_are_cut_to_what_the_replay_runs_and_never_overflow(trace, no_children) -> None:
    """At 6 workers the all_gather and reduce_scatter are padded to whole shards, and at payload
    scale 2 every entry is cut to what the padded collectives send; fp16 values whose sum over 8
    workers overflows float16 are refused (generated payload, and why), not sent as inf."""
    report = replay(trace, ReplayConfig(workers=6, fabric="ring", iters=1, payload_scale=2,
                                        compress=CompressOption("topk:0.1")), payload=_payload())
    assert report.verification.ok and report.compression.data == "recorded"
    # uncompressed at payload scale 1 too: the shards' padding is zeros every worker sends
    report = replay(trace, ReplayConfig(workers=6, fabric="ring", iters=1, payload_scale=1), payload=_payload())
    assert report.verification.ok and report.verification.payload == "recorded"
    p = _payload()
    big = RecordedPayload(K, p.per_iteration, p.dtypes, tuple(None if t is None else t * 3e4 for t in p.tensors))
    report = replay(trace, ReplayConfig(workers=M, fabric="ring", iters=1, payload_scale=1,
                                        compress=CompressOption("fp16")), payload=big)
    assert report.verification.ok and report.verification.payload == "generated"
    assert "overflows their dtype" in report.verification.payload_note


def test_powersgd_keeps_generated_payload(trace) -> None:
    config = ReplayConfig(workers=M, fabric="ring", compress=CompressOption("powersgd:2"))
    assert compressed_payload(trace, config, _payload())[2] == "PowerSGD's second all_reduce needs the first's sum"


def _write(payload: RecordedPayload, path) -> None:
    with open(path, "wb") as f:
        np.savez(f, **payload_arrays(payload))


def test_a_payload_file_reads_back_and_bad_ones_are_trace_errors(tmp_path) -> None:
    p = _payload()
    _write(p, tmp_path / "p.npz")
    back = load_payload(tmp_path / "p.npz")
    assert (back.real_ranks, back.per_iteration, back.dtypes) == (p.real_ranks, p.per_iteration, p.dtypes)
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(back.tensors, p.tensors, strict=True))
    with pytest.raises(TraceError, match="no such payload file"):
        load_payload(tmp_path / "missing.npz")
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(TraceError, match="r.json: not an emu payload file"):
        load_payload(tmp_path / "r.json")
    arrays = payload_arrays(p)
    arrays["header"] = np.frombuffer(b'{"format": "other", "version": 1}', np.uint8)
    with open(tmp_path / "other.npz", "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(TraceError, match="not an emu payload of version 1"):
        load_payload(tmp_path / "other.npz")
    buf = io.BytesIO()
    np.savez(buf, header=np.array([object()], dtype=object))  # pickled data is never loaded
    (tmp_path / "pickled.npz").write_bytes(buf.getvalue())
    with pytest.raises(TraceError, match="not a readable emu payload"):
        load_payload(tmp_path / "pickled.npz")
    assert zipfile.is_zipfile(tmp_path / "pickled.npz")


def test_replay_cli_sends_the_payload(trace, tmp_path, no_children) -> None:
    save_trace(trace, tmp_path / "live.json.gz")
    _write(_payload(), tmp_path / "live.payload.npz")
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "160"})
    args = ["replay", str(tmp_path / "live.json.gz"), "--workers", "4", "--fabric", "ring", "--iters", "1"]
    result = runner.invoke(cli, [*args, "--payload", str(tmp_path / "live.payload.npz")])
    assert result.exit_code == 0, result.output
    assert "real ranks' tensors" in result.output
    result = runner.invoke(cli, [*args, "--payload", str(tmp_path / "live.json.gz")])
    assert result.exit_code == 2 and "not an emu payload file" in result.output
    result = runner.invoke(cli, [*args, "--workers", "3", "--payload", str(tmp_path / "live.payload.npz")])
    assert result.exit_code == 2 and "multiple of 2" in result.output



def test_tensors_that_cannot_be_checked_are_not_sent(trace, no_children) -> None:
    """inf or NaN (a gradient overflow), or sums too loose to tell one worker's contribution
    (float16 at 32 workers point to point): the workers send generated payload, and the report
    says why."""
    p = _payload()
    bad = list(p.tensors)
    bad[0] = bad[0].copy()
    bad[0][1, 7] = np.inf
    report = replay(trace, ReplayConfig(workers=M, fabric="ring", iters=1),
                    payload=RecordedPayload(K, p.per_iteration, p.dtypes, tuple(bad)))
    assert report.verification.ok and report.verification.payload == "generated"
    assert "inf or NaN" in report.verification.payload_note
    assert not recorded.checkable("float16", 32) and recorded.checkable("float16", 8)
    assert recorded.checkable("float32", 1024) and not recorded.checkable("float32", 2048)
