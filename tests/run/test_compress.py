"""emu run --compress: the real ranks compress their gradients for real, the compressor's output
crosses the fabric, and the report gives the loss curves beside the uncompressed run's."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator.compression.compressors import message_seed, parse_compress
from emu.emulator.payload.recorded import load_payload
from emu.emulator.protocol.wire import p2p_wire_bytes
from emu.errors import ConfigError
from emu.replay import CompressOption, ReplayConfig
from emu.run import protocol, report_loss
from emu.run.compress import SEED, RankCompressor, live_compressor
from emu.run.session import RunConfig
from emu.run.training import curve, training_report
from emu.traces.io import load_trace
from emu.traces.model import Coll, CollKind, Compute, Dtype, Wait

LEARN = Path(__file__).resolve().parents[2] / "examples" / "ddp_learn.py"


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


def test_a_rank_sends_its_compressors_output_and_gets_the_decompressed_aggregate() -> None:
    """Two real ranks of four workers: each message is the compressor's own output; the
    aggregate is what the four messages (two per real rank) decompress to, summed, and error
    feedback carries what a step dropped into the rank's next message for the same tensor."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(1000).astype(np.float32) for _ in range(2)]
    topk = parse_compress("topk:0.1")
    ranks = [RankCompressor(topk, r, 2, 4) for r in range(2)]
    messages = [rc.encode(x, seq=7) for rc, x in zip(ranks, xs, strict=True)]
    for m, x in zip(messages, xs, strict=True):
        assert m.dtype == np.uint8 and np.array_equal(m, topk.compress(x, 0)) and len(m) == topk.wire_bytes(1000)
    got = ranks[0].decode([messages[0], messages[1], messages[0], messages[1]], 1000, seq=7)
    want = 2 * topk.combine([topk.decompress(m, 1000, 0) for m in messages]).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    dropped = xs[0] - topk.decompress(messages[0], 1000, 0)
    ranks[0].next_iteration()
    again = topk.decompress(ranks[0].encode(xs[0], seq=8), 1000, 0)
    np.testing.assert_array_equal(again, topk.decompress(topk.compress(xs[0] + dropped, 0), 1000, 0))

    fp16 = RankCompressor(parse_compress("fp16"), 0, 1, 4)
    half = fp16.encode(xs[0], seq=0)
    assert half.dtype == np.float16 and np.array_equal(half, xs[0].astype(np.float16))
    np.testing.assert_array_equal(fp16.decode([half * 4], 1000, 0), (half * 4).astype(np.float64))
    plain = RankCompressor(parse_compress("qsgd"), 0, 1, 4)  # no error feedback: compressed, not decoded too
    assert np.array_equal(plain.encode(xs[0], 3), plain.comp.compress(xs[0], message_seed(plain.comp, SEED, 3, 0)))
    assert plain.memory.residual == {}
    vote = RankCompressor(parse_compress("signsgd"), 0, 1, 4)
    assert set(np.unique(vote.decode([vote.encode(xs[0], 0)] * 4, 1000, 0))) <= {-1.0, 1.0}  # a vote, not a sum


def test_what_emu_run_cannot_compress_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="powerSGD_hook"):
        live_compressor("powersgd:2")
    with pytest.raises(ConfigError, match="use topk"):
        live_compressor("dgc")
    with pytest.raises(ConfigError, match="adaptive compression is emu replay's"):
        live_compressor("adaptive")
    with pytest.raises(ConfigError, match="unknown compressor"):
        RunConfig(replay=ReplayConfig(workers=4), compress="zip").check(2)
    with pytest.raises(ConfigError, match="not in its replay"):
        RunConfig(replay=ReplayConfig(workers=4, compress=CompressOption("topk")), compress="topk").check(2)


def test_a_loss_curve_charges_each_step_its_replayed_time() -> None:
    """Steps 0 and 1 warm up (not replayed: the replayed mean, 20), steps 2-4 are the replayed
    iterations (10, 20, 30), step 5 is past them (the mean again)."""
    c = curve("none", ((0, 2.0), (3, 1.5), (6, 1.0)), [10.0, 20.0, 30.0], 20.0, warmup=2)
    assert [(p.steps, p.emulated_us, p.charged_mean) for p in c.points] == [(0, 0.0, 0), (3, 50.0, 2), (6, 120.0, 3)]
    assert c.reached(1.5).steps == 3 and c.reached(0.5) is None
    base = curve("none", ((0, 2.0), (6, 1.2)), [10.0], 10.0, warmup=0)
    report = training_report((c, base), None)
    assert report.target_loss == 1.2 and report.target_from == "the uncompressed run's last loss"
    assert [d["steps_to_target"] for d in report.to_dict()["curves"]] == [6, 6]
    assert training_report((curve("none", (), [1.0], 1.0, 0),), None) is None


def test_a_loss_report_is_a_number_and_nothing_outside_emu_run() -> None:
    report_loss(1.5)  # no channel: nothing happens
    head = {"v": protocol.VERSION, "rank": 0, "kind": "loss", "compute_us": 1.0}
    for bad in ("1.0", True, None):
        with pytest.raises(protocol.ProtocolError, match="a loss of"):
            protocol.header_of([json.dumps({**head, "value": bad}).encode()])
    with pytest.raises(protocol.ProtocolError, match="decompress_us"):
        protocol.header_of([json.dumps({**head, "kind": "wait", "decompress_us": -1}).encode()])
    assert protocol.header_of([json.dumps({**head, "value": 0.25}).encode()])["value"] == 0.25


def test_emu_run_compresses_for_real_and_reports_both_loss_curves(tmp_path, no_children) -> None:
    """examples/ddp_learn.py at 4 workers under topk:0.1: the trace's gradients are all_gathers of
    the messages the rank made (their bytes, recorded beside the trace, decompress to k values
    each), replayed and verified through the fabric, which counted exactly their bytes;
    compression and decompression are measured compute; the loss curves of the compressed and
    the uncompressed run start alike, both fall, and part."""
    out, report = tmp_path / "live.json.gz", tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--fabric", "ring", "--bandwidth", "1Gbps", "--compress",
                                   "topk:0.1", "--target-loss", "2.2", "--payload-scale", "1", "--trace-out", str(out), "--straggler", "3:2",
                                   "--report", str(report), "--", "python", str(LEARN), "--steps", "5"])
    assert res.exit_code == 0, res.output
    assert "time to loss 2.2000 (--target-loss)" in res.output
    doc = json.loads(report.read_text())
    curves = doc["training"]["curves"]
    assert [c["compressor"] for c in curves] == ["topk:0.1", "none"]
    losses = [[p["loss"] for p in c["points"]] for c in curves]
    assert all([p["steps"] for p in c["points"]] == list(range(6)) for c in curves)
    assert losses[0][0] == losses[1][0] and losses[0][-1] != losses[1][-1]
    assert losses[0][-1] < losses[0][0] and losses[1][-1] < losses[1][0]  # both learn, each its own way
    for c in curves:
        hit = next((p for p in c["points"] if p["loss"] <= 2.2), None)
        assert c["time_to_target_us"] == (None if hit is None else hit["emulated_us"])
    times = [p["emulated_us"] for p in curves[0]["points"]]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] > 0
    assert doc["verification"]["ok"] and doc["verification"]["payload"] == "recorded"
    assert doc["trace"]["source"] == "live" and doc["trace"]["path"] == str(out) and doc["config"]["stragglers"] == ["3:2.0"]

    trace = load_trace(out)
    assert "thread CPU" in trace.meta.gaps[0] and any("compressed by the real ranks with topk:0.1" in g
                                                      for g in trace.meta.gaps)
    topk = parse_compress("topk:0.1")
    it = trace.ranks[0].iterations[0]
    assert it.colls and all(c.kind == CollKind.ALL_GATHER and c.dtype == Dtype.UINT8 for c in it.colls)
    ops = list(it.ops)
    for i, op in enumerate(ops):  # compression right before each collective, decompression right after its wait
        if isinstance(op, Coll):
            assert isinstance(ops[i - 1], Compute) and ops[i - 1].name == "compress" and ops[i - 1].dur_us > 0
        if isinstance(op, Wait):
            assert isinstance(ops[i + 1], Compute) and ops[i + 1].name == "decompress" and ops[i + 1].dur_us > 0
    # the bytes the fabric counted are the messages' (each L bytes, from the rank's real output): a
    # ring all_gather sends M - 1 segments from each of M workers, counted on the uplink and the downlink
    lengths = [c.count // 4 for c in it.colls]
    assert doc["summary"]["bytes_sent"] == len(doc["iterations"]) * sum(2 * 4 * 3 * p2p_wire_bytes(n) for n in lengths)
    payload = load_payload(tmp_path / "live.payload.npz")
    params = [64 * 256 + 256, 256 * 256 + 256, 256 * 10 + 10]
    for coll, vectors in zip(it.colls, payload.tensors, strict=False):
        size = coll.count // 4  # one message, gathered from 4 workers
        n = next(n for n in (sum(params), *params, params[0] + params[1], params[1] + params[2]) if
                 topk.wire_bytes(n) == size)  # which of the bucket splits the message's length is
        message = vectors[0][:size].astype(np.uint8)
        assert np.count_nonzero(topk.decompress(message, n, 0)) == topk._k(n)


def test_options_that_need_compression_or_a_number_are_refused(no_children) -> None:
    for args, message in ((["--compress-speed", "10"], "--compress-speed applies to --compress"),
                          (["--no-baseline"], "--no-baseline applies to --compress"),
                          (["--compress", "topk", "--target-loss", "nan"], "--target-loss must be a finite number")):
        res = CliRunner().invoke(cli, ["run", "--workers", "2", *args, "--", "python", str(LEARN)])
        assert res.exit_code == 2 and message in res.output, res.output
