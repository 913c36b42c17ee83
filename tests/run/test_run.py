"""emu run: real ranks of an unmodified script (real torch processes) inside a job of M workers."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emu.capture.launcher import run_ranks
from emu.cli import cli
from emu.emulator.payload.recorded import load_payload
from emu.errors import ConfigError
from emu.replay import ReplayConfig
from emu.run.protocol import ComputeClock
from emu.run.session import RunConfig, run_job
from emu.traces.io import load_trace
from emu.traces.model import Coll, CollKind, Compute, Source, Wait

TINY = Path(__file__).resolve().parent.parent / "data" / "run" / "tiny_ddp.py"
KNOWN = TINY.with_name("known_tensors.py")


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """emu run keeps a failed run's folder (its error names a rank's log there): in the test's own
    folder, not the machine's /tmp."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


@pytest.mark.slow  # 9 s; make test keeps the real ranks' tensors crossing the fabric and the CLI runs
def test_training_proceeds_as_the_real_ranks_alone_would(tmp_path, monkeypatch, no_children) -> None:
    """2 real ranks of a job of 4 end with the parameters a real 2-rank gloo run reaches: the fake
    workers mirror the real ones, so DDP's average over 4 is the 2 ranks' average. A plain
    all_reduce outside DDP sums what 4 workers hold: twice the real ranks' sum."""
    emu_out, gloo_out = tmp_path / "emu", tmp_path / "gloo"
    emu_out.mkdir()
    gloo_out.mkdir()
    monkeypatch.setenv("EMU_TEST_OUT", str(emu_out))
    result = run_job(["python", str(TINY)], RunConfig(replay=ReplayConfig(workers=4, fabric="ring"), real=2), cores=2)
    # the real gloo run, through capture's rank entry point with no profiled step: it ends the rank
    # without gloo's finalization race (emu.capture.inject.end)
    run_ranks([sys.executable, "-m", "emu.capture", "--out", str(gloo_out), "--warmup", "0", "--steps", "0", "--",
               str(TINY)], 2, gloo_out, timeout_s=120, env={**os.environ, "EMU_TEST_OUT": str(gloo_out)})
    for r in (0, 1):
        got, want = np.load(emu_out / f"rank{r}.npy"), np.load(gloo_out / f"rank{r}.npy")
        np.testing.assert_allclose(got[:-1], want[:-1], rtol=1e-4, atol=1e-6)
        assert got[-1] == 2 * want[-1] == 2 * (1 + 2)
    checked = result.checked  # by each rank: DDP's broadcasts, its 5 steps' buckets, the plain all_reduce
    assert result.report.verification.ok and checked.mismatches == 0 and checked.unchecked == ()
    assert checked.results >= 2 * (5 + 1) and checked.elements > 0
    trace = result.trace
    assert trace.meta.source == Source.LIVE and trace.meta.world_size == 4 and len(trace.ranks) == 2
    assert trace.iterations == 5 - 2  # the first two optimizer steps warm up
    it = trace.ranks[0].iterations[0]
    assert any(isinstance(op, Compute) and op.dur_us > 0 for op in it.ops)
    colls = it.colls
    assert colls and all(c.kind == CollKind.ALL_REDUCE and c.group_size == 4 for c in colls)
    waited = {i for op in it.ops if isinstance(op, Wait) for i in op.ids}
    assert waited == {c.id for c in colls}  # the optimizer's step waits for every bucket
    assert [len(r.iterations[0].colls) for r in trace.ranks] == [len(colls)] * 2


@pytest.mark.slow  # make test runs the CLI with --trace-out, --report and --straggler in test_compress.py
def test_the_cli_runs_the_script_and_writes_the_trace(tmp_path, no_children) -> None:
    out, report = tmp_path / "live.json.gz", tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "--workers", "8", "--fabric", "ina", "--trace-out", str(out),
                                   "--straggler", "3:2", "--report", str(report), "--", "python", str(TINY)])
    assert res.exit_code == 0, res.output
    trace = load_trace(out)
    assert trace.meta.source == Source.LIVE and trace.meta.world_size == 8 and "thread CPU" in trace.meta.gaps[0]
    doc = json.loads(report.read_text())
    assert doc["trace"]["source"] == "live" and doc["trace"]["path"] == str(out) and doc["trace"]["gaps"]
    assert doc["config"]["stragglers"] == ["3:2.0"] and doc["verification"]["ok"] and "verification" in res.output


def test_the_real_ranks_tensors_cross_the_fabric(tmp_path, no_children) -> None:
    """What the replay's workers send is what the script's ranks sent: the payload written beside
    the trace holds, per real rank, the all_reduce's arange(N) * (r + 1) + step and the broadcast's
    tensor, cut to what payload scale 4 sends; the fabric checked the sums of those values, and
    emu replay sends them again from the files."""
    out, report = tmp_path / "live.json.gz", tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--real", "2", "--fabric", "ring", "--payload-scale",
                                   "4", "--trace-out", str(out), "--report", str(report), "--", "python",
                                   str(KNOWN)])
    assert res.exit_code == 0, res.output
    payload_file = tmp_path / "live.payload.npz"
    assert f"wrote {payload_file}" in res.output.replace("\n", "")
    payload = load_payload(payload_file)
    assert (payload.real_ranks, payload.per_iteration, payload.iterations) == (2, 2, 2)  # steps 2 and 3 recorded
    n = 3000
    for i, step in enumerate((2, 3)):
        reduced, broadcast = payload.tensors[2 * i], payload.tensors[2 * i + 1]
        want = np.stack([np.arange(n // 4, dtype=np.float32) * (r + 1) + step for r in range(2)])
        assert reduced.dtype == np.float32 and np.array_equal(reduced, want)
        assert broadcast.dtype == np.float64 and np.array_equal(broadcast, [[0.0] * 13, [1.0] * 13])
    doc = json.loads(report.read_text())
    assert doc["verification"]["ok"] and doc["verification"]["payload"] == "recorded"
    again = CliRunner().invoke(cli, ["replay", str(out), "--workers", "4", "--fabric", "ina,ps", "--payload-scale",
                                     "4", "--payload", str(payload_file), "--json"])
    assert again.exit_code == 0, again.output
    docs = json.loads(again.stdout)
    assert [d["verification"]["payload"] for d in docs] == ["recorded", "recorded"]
    assert all(d["verification"]["ok"] and d["verification"]["elements_checked"] > 0 for d in docs)


def test_bad_requests_are_config_errors(no_children) -> None:
    with pytest.raises(ConfigError, match="multiple of --real"):
        run_job(["python", str(TINY)], RunConfig(replay=ReplayConfig(workers=5), real=2), cores=2)
    with pytest.raises(ConfigError, match="cores"):
        run_job(["python", str(TINY)], RunConfig(replay=ReplayConfig(workers=8), real=4), cores=2)
    res = CliRunner().invoke(cli, ["run", "--workers", "8", "--", "ls"])
    assert res.exit_code == 2 and "not python" in res.output
    with pytest.raises(ConfigError, match="--compute-clock 'cpu': thread or wall"):
        RunConfig(replay=ReplayConfig(workers=4), real=2, clock="cpu").check(2)  # type: ignore[arg-type]
    wall = RunConfig(replay=ReplayConfig(workers=4), real=2, clock="wall")  # type: ignore[arg-type]  # its value
    wall.check(2)
    assert wall.clock is ComputeClock.WALL  # made the enum once


def test_a_failing_script_fails_the_run(tmp_path, no_children) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\nraise SystemExit(3)\n")
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--", "python", str(script)])
    assert res.exit_code == 1 and "rank 0 exited with code 3" in res.output
    log = Path(res.output.rsplit("(log: ", 1)[1].split(")")[0])
    assert log.parent.parent == tmp_path / "tmp" and log.exists()  # kept: the error names it


def test_the_coordinator_answers_as_m_workers() -> None:
    """Without processes: the reductions over M workers that mirror K real ranks."""
    from emu.run.coordinator import Coordinator

    c = Coordinator("ipc:///nonexistent", 6, 2)
    a, b = np.array([1.0, -2.0], np.float32), np.array([3.0, 5.0], np.float32)
    dt = np.dtype("<f4")
    assert list(c._reduce([a, b], "sum", dt)) == [12.0, 9.0]
    assert list(c._reduce([a, b], "avg", dt)) == [2.0, 1.5]
    assert list(c._reduce([a, b], "max", dt)) == [3.0, 5.0]
    assert list(c._reduce([a, b], "product", dt)) == [27.0, -1000.0]
    gathered = c._results("all_gather", {"dtype": "float32"}, [[a], [b]])[1]
    assert [list(x) for x in gathered] == [list(a), list(b)] * 3
    assert [list(x[0]) for x in c._results("broadcast", {"dtype": "float32", "root": 5}, [[a], [b]])] == [list(b)] * 2
    coll = c._record(7, {"coll": "all_gather", "dtype": "float32", "root": None}, [a])
    assert isinstance(coll, Coll) and coll.count == 12 and coll.bytes == 48


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("import torch, torch.distributed as dist\nfrom torch import nn\n"
                    "dist.init_process_group('gloo')\nrank = dist.get_rank()\n" + body)
    return path


@pytest.mark.slow
def test_what_emu_run_cannot_serve_fails_with_its_name(tmp_path, no_children) -> None:
    """A sub-group, and a rank that ends while another waits in a collective: exit 1 at once,
    naming what went wrong (not a hang until --timeout)."""
    group = _script(tmp_path, "group.py", "g = dist.new_group([0])\n")
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--", "python", str(group)])
    assert res.exit_code == 1 and "process groups other than the job's" in res.output
    mesh = tmp_path / "mesh.py"
    mesh.write_text("from torch.distributed.device_mesh import init_device_mesh\nmesh = init_device_mesh('cpu', (2, 2))\n")
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--timeout", "60", "--", "python", str(mesh)])
    assert res.exit_code == 1 and "a device mesh's dimensions" in res.output  # not a hang in gloo
    lonely = _script(tmp_path, "lonely.py", "if rank == 0:\n    dist.barrier()\n")
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--real", "2", "--timeout", "60", "--",
                                   "python", str(lonely)])
    # whichever reaches emu first, the rank that finished or the one that waits, the run ends at once
    assert res.exit_code == 1 and "rank 1 finished while rank 0 waits for it in collective 0" in res.output, res.output
    p2p = _script(tmp_path, "p2p.py", "t = torch.ones(2)\ndist.send(t, 1) if rank == 0 else dist.recv(t, 0)\n")
    res = CliRunner().invoke(cli, ["run", "--workers", "2", "--", "python", str(p2p)])
    assert res.exit_code == 1 and "send/recv (point to point) is not supported yet" in res.output


@pytest.mark.slow
def test_a_closure_optimizer_records_a_program_that_replays(tmp_path, no_children) -> None:
    """LBFGS runs backward inside its step: the buckets it issues there are waited for as that
    backward ends, and every iteration closes on its own collectives."""
    lbfgs = _script(tmp_path, "lbfgs.py", (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\nmodel = DDP(nn.Linear(8, 2))\nopt = torch.optim.LBFGS(model.parameters(), max_iter=2)\n"
        "x, y = torch.randn(16, 8), torch.randn(16, 2)\n"
        "def closure():\n    opt.zero_grad()\n    loss = ((model(x) - y) ** 2).mean()\n    loss.backward()\n"
        "    return loss\n"
        "for _ in range(5):\n    opt.step(closure)\n"))
    result = run_job(["python", str(lbfgs)], RunConfig(replay=ReplayConfig(workers=4, fabric="ring")), cores=2)
    assert result.report.verification.ok and result.trace.iterations == 3
    for it in result.trace.ranks[0].iterations:
        issued = {c.id for c in it.colls}
        assert issued and {i for op in it.ops if isinstance(op, Wait) for i in op.ids} == issued


def _served(coll: str, op: str | None, dtype: str, tensors: list[list[np.ndarray]], m: int,
            corrupt: Callable[[int, list[np.ndarray]], None] | None = None) -> list[tuple[str | None, bool]]:
    """Without processes: each real rank's digest, the coordinator's results and relayed digests,
    the results corrupted as they leave (``corrupt(rank, tensors)``), and each rank's verdict."""
    from emu.run.backend import digest, verdict
    from emu.run.coordinator import Coordinator

    k = len(tensors)
    c = Coordinator("ipc:///nonexistent", m, k)
    head = {"coll": coll, "op": op, "dtype": dtype, "seq": 3, "root": 1 if coll == "broadcast" else None}
    relayed = c._digests(3, coll, [digest(head, xs, k) for xs in tensors])
    verdicts = []
    for r, result in enumerate(c._results(coll, head, tensors)):
        got = [np.array(t) for t in result]
        if corrupt is not None:
            corrupt(r, got)
        own = tensors[r][r if coll == "reduce_scatter" else 0]
        verdicts.append(verdict(head, got, own, relayed[r], r, k, m))
    return verdicts


def test_an_integer_sums_projections_move_with_any_one_bit_of_any_element() -> None:
    """The integer projections' words are odd, so invertible mod 2^bits: flipping any bit of one
    element changes a projection mod 2^bits, for every collective's vectors (even words hid a
    flipped sign bit one time in four)."""
    pytest.importorskip("torch")
    from emu.run import backend

    x = np.arange(300, dtype=np.int32) * 7919
    for seq in range(64):
        base = backend._wrapped(x, seq, 0)
        for bit in (31, 30, 0):
            y = x.copy()
            y.view(np.uint32)[seq % 300] ^= np.uint32(1 << bit)
            moved = [(b - a) % (1 << 32) for a, b in zip(base, backend._wrapped(y, seq, 0), strict=True)]
            assert any(moved), (seq, bit)  # compared mod 2^32, as an int32 sum that may wrap is


def test_a_rank_checks_its_result_against_what_the_ranks_contributed() -> None:
    """The digests, not the coordinator's arithmetic, decide: a result changed after the
    coordinator formed it fails, a correct one passes; product is not checked, nor max of
    several real ranks (bounded only)."""
    ramp = [[np.arange(3000, dtype=np.float32) * (r + 1)] for r in range(2)]
    assert _served("all_reduce", "sum", "float32", ramp, 4) == [(None, True)] * 2

    def negate_last(r: int, got: list[np.ndarray]) -> None:
        if r == 1:
            got[0][-1] = -got[0][-1]

    def swap(r: int, got: list[np.ndarray]) -> None:
        got[0][[3, 2000]] = got[0][[2000, 3]]

    def halve(r: int, got: list[np.ndarray]) -> None:  # a share of M/K lost
        got[0][:] = got[0] / 2

    assert _served("all_reduce", "sum", "float32", ramp, 4, negate_last) == [(None, True), (None, False)]
    assert _served("all_reduce", "avg", "float32", ramp, 4, swap) == [(None, False)] * 2
    assert _served("all_reduce", "sum", "float32", ramp, 4, halve) == [(None, False)] * 2
    scattered = [[np.full(5, float(r + 10 * j), np.float64) for j in range(4)] for r in range(2)]
    assert _served("reduce_scatter", "sum", "float64", scattered, 4) == [(None, True)] * 2
    assert _served("reduce_scatter", "sum", "float64", scattered, 4, negate_last) == [(None, True), (None, False)]
    wraps = [[np.full(7, 2**30, np.int32)] for _ in range(2)]  # 8 * 2^30 wraps to 0 in int32, as torch's would

    def plus_one(r: int, got: list[np.ndarray]) -> None:
        got[0][4] += 1

    assert _served("all_reduce", "sum", "int32", wraps, 8) == [(None, True)] * 2
    assert _served("all_reduce", "sum", "int32", wraps, 8, plus_one) == [(None, False)] * 2
    for bits, dtype in ((8, "int8"), (32, "int32"), (64, "int64")):  # the sign bit, and the one below it
        for bit in (bits - 1, bits - 2):
            ints = [[np.arange(7, dtype=dtype) + r] for r in range(2)]

            def high(r: int, got: list[np.ndarray], bit: int = bit) -> None:
                got[0].view(f"u{got[0].itemsize}")[3] ^= np.array(1 << bit).astype(f"u{got[0].itemsize}")

            assert _served("all_reduce", "sum", dtype, ints, 4, high) == [(None, False)] * 2, (dtype, bit)

    def flip_bit(r: int, got: list[np.ndarray]) -> None:
        got[-1].view(np.uint8)[5] ^= 1

    assert _served("broadcast", None, "float32", ramp, 4) == [(None, True)] * 2
    flags = [[np.array([True, False, r == 1])] for r in range(2)]

    def flip_flag(r: int, got: list[np.ndarray]) -> None:
        got[0][1] = not got[0][1]

    assert _served("broadcast", None, "bool", flags, 4) == [(None, True)] * 2
    assert _served("broadcast", None, "bool", flags, 4, flip_flag) == [(None, False)] * 2
    assert _served("all_gather", None, "float32", ramp, 4, flip_bit) == [(None, False)] * 2
    assert _served("all_reduce", "product", "float32", ramp, 4) == [("product", True)] * 2
    assert _served("all_reduce", "max", "float32", ramp, 4) == [("max_min", True)] * 2
    assert _served("all_reduce", "max", "float32", ramp[:1], 4) == [(None, True)]  # 4 copies of one rank: exact
    def double(r: int, got: list[np.ndarray]) -> None:
        got[0][:] = got[0] * 2

    # a minimum above rank 0's own tensor is wrong; rank 1's is twice rank 0's, so it cannot tell
    assert _served("all_reduce", "min", "float32", ramp, 4, double) == [("max_min", False), ("max_min", True)]
    nan = [[np.array([np.nan, 1.0], np.float32)], [np.ones(2, np.float32)]]
    assert _served("all_reduce", "sum", "float32", nan, 4) == [("nonfinite", True)] * 2


def test_the_rounding_bound_passes_every_correct_sum() -> None:
    """No false mismatch, whatever the dtype, magnitudes, cancellation or subnormals: the bound is
    the rounding's worst case (``emu.run.backend._bound``)."""
    rng = np.random.default_rng(7)
    for trial in range(240):
        dtype = ("float16", "float32", "float64")[trial % 3]
        dt = np.dtype(dtype)
        k, n = int(rng.integers(1, 5)), int(rng.choice([1, 7, 1000, 20000]))
        m = k * int(rng.integers(1, 70))
        base = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 1)
        ranks = []
        for r in range(k):
            x = (base * (-1) ** r + rng.standard_normal(n) * 1e-3,  # cancellation
                 rng.standard_normal(n) * float(np.finfo(dt).tiny) * rng.uniform(0, 4),  # subnormal
                 (1 + rng.integers(0, 4, n) * float(np.finfo(dt).eps) / 2) * (-1) ** r,  # ties
                 rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3))[trial // 3 % 4]
            ranks.append([x.astype(dt)])
        with np.errstate(over="ignore"):
            verdicts = _served("all_reduce", ("sum", "avg")[trial // 12 % 2], dtype, ranks, m)
        assert all(ok and why in (None, "nonfinite") for why, ok in verdicts), (trial, verdicts)
        assert sum(why is None for why, _ in verdicts) >= (k if dtype != "float16" else 0)
    for dtype in ("int8", "uint8", "int16", "int32", "int64"):
        info = np.iinfo(dtype)
        ranks = [[rng.integers(info.min, info.max, 500, endpoint=True).astype(dtype)] for _ in range(3)]
        assert _served("all_reduce", "sum", dtype, ranks, 6) == [(None, True)] * 3


def test_digests_and_counts_in_headers_are_checked() -> None:
    """What a rank sends of its check, and the digests either way, are bounded and checked like
    every other key of a header."""
    from emu.run import protocol
    from emu.run.protocol import Checked, ProtocolError, header_of, reply_of

    def request(**extra: object) -> list[bytes]:
        head = {"v": protocol.VERSION, "rank": 0, "kind": "coll", "coll": "all_reduce", "dtype": "float32", "shapes": [[2]],
                "op": "sum", "root": None, "seq": 0, **extra}
        return [json.dumps(head).encode(), bytes(8)]

    counts = Checked().record(None, 2, True).record("product", 5, True).record(None, 3, False)
    head = header_of(request(digest=[{"p": [1.5, -2.0], "a": [1.5, 2.0]}], check=counts.header()))
    assert head["check"] == counts == Checked(results=2, elements=5, mismatches=1, unchecked=(("product", 1),))
    for bad in ([{"p": [1.0], "a": [1.0]}], [{"p": [float("nan"), 0.0], "a": [0.0, 0.0]}], [{"h": "beef"}],
                [{"p": [2**64, 0]}], [None] * 129, {"p": [0, 0]}):
        with pytest.raises(ProtocolError, match="digests"):
            header_of(request(digest=bad))
    with pytest.raises(ProtocolError, match="unchecked results"):
        header_of(request(check={**counts.header(), "unchecked": {"because": 1}}))
    with pytest.raises(ProtocolError, match="is not the counts"):
        header_of(request(check={**counts.header(), "results": -1}))
    assert reply_of([json.dumps({"v": protocol.VERSION, "ok": True, "real": 2, "digests": [{"h": "0" * 32}, None]}).encode()])
    with pytest.raises(ProtocolError, match="64 KiB"):
        reply_of([json.dumps({"v": protocol.VERSION, "ok": True, "digests": ["x" * (1 << 16)]}).encode()])


def _corrupt_replies(monkeypatch: pytest.MonkeyPatch, bad: dict[int, tuple[int, str]]) -> None:
    """The coordinator's replies changed after it formed (and, before, checked) them: collective
    ``seq`` to real rank ``r`` (``bad[seq] = (r, dtype)``), its last element negated, or, for
    a float64, one bit of its first byte flipped."""
    from emu.run.coordinator import Coordinator

    answer = Coordinator._answer

    def corrupted(self: Coordinator, seq: int, got: dict) -> list:
        replies = answer(self, seq, got)
        if seq in bad:
            r, dtype = bad[seq]
            ident, parts = replies[r]
            arr = np.frombuffer(parts[1], dtype).copy()
            if dtype == "<f8":
                arr.view(np.uint8)[0] ^= 1
            else:
                arr[-1] = -arr[-1]
            replies[r] = (ident, [parts[0], arr.tobytes(), *parts[2:]])
        return replies

    monkeypatch.setattr(Coordinator, "_answer", corrupted)


def test_a_result_corrupted_on_its_way_fails_the_run(tmp_path, monkeypatch, no_children) -> None:
    """The ranks check what they received against their own digests: an all_reduce's element
    negated on its way to rank 1 and a broadcast's bit flipped on its way to rank 0 are 2
    mismatches, and emu run fails (exit 1). The coordinator's own check, before, saw its
    results as it formed them and passed these."""
    _corrupt_replies(monkeypatch, {2: (1, "<f4"), 5: (0, "<f8")})  # step 1's all_reduce, step 2's broadcast
    res = CliRunner().invoke(cli, ["run", "--workers", "4", "--real", "2", "--fabric", "ring", "--", "python",
                                   str(KNOWN)])
    out = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "real ranks' results checked in their own processes: 16 (" in out and "2 mismatched" in out
    assert "2 of the real ranks' results did not match what the real ranks contributed" in out


@pytest.mark.slow  # the same checks in one process: test_a_rank_checks_its_result_against_what_the_ranks_contributed
def test_what_the_ranks_check_and_what_they_do_not(tmp_path, no_children) -> None:
    """Every collective of 2 real ranks of 4 workers: sums of float32, float16 and int32,
    a broadcast, an all_gather and a reduce_scatter are checked by each rank; a product is not
    checked, and a max of 2 real ranks only bounded; a barrier has no result."""
    script = _script(tmp_path, "every.py", (
        "w = nn.Parameter(torch.zeros(2))\nopt = torch.optim.SGD([w], lr=0.1)\nn = dist.get_world_size()\n"
        "t = torch.arange(6, dtype=torch.float32) + rank\ndist.all_reduce(t)\n"
        "h = torch.linspace(-1, 1, 9, dtype=torch.float16) * (rank + 1)\ndist.all_reduce(h)\n"
        "i = torch.full((3,), 2**20 + rank, dtype=torch.int32)\ndist.all_reduce(i)\n"
        "p = torch.full((5,), 1.0 + rank, dtype=torch.float64)\ndist.all_reduce(p, op=dist.ReduceOp.PRODUCT)\n"
        "mx = torch.arange(4) * (rank + 1)\ndist.all_reduce(mx, op=dist.ReduceOp.MAX)\n"
        "b = torch.full((3,), float(rank))\ndist.broadcast(b, src=3)\n"
        "outs = [torch.empty(2) for _ in range(n)]\ndist.all_gather(outs, torch.full((2,), float(rank)))\n"
        "out = torch.empty(2)\ndist.reduce_scatter(out, [torch.full((2,), float(rank + j)) for j in range(n)])\n"
        "dist.barrier()\n"
        "assert t.tolist() == [2 * (2 * x + 1) for x in range(6)] and i.tolist() == [2**22 + 2] * 3\n"
        "assert p.tolist() == [4.0] * 5 and b.tolist() == [1.0] * 3 and out.tolist() == [2 * (2 * rank + 1)] * 2\n"
        "w.grad = torch.ones(2)\nopt.step()\n"))
    result = run_job(["python", str(script)], RunConfig(replay=ReplayConfig(workers=4, fabric="ring"), real=2,
                                                        warmup=0), cores=2)
    checked = result.checked
    assert (checked.results, checked.mismatches) == (2 * 6, 0)
    assert checked.elements == 2 * (6 + 9 + 3 + 3 + 4 * 2 + 2)
    assert checked.unchecked == (("max_min", 2), ("product", 2))
    assert result.report.verification.ok


def test_the_coordinator_exchanges_as_m_workers() -> None:
    """Without processes: an uneven all_to_all of K=2 real ranks in a job of M=4 workers. Worker w
    holds real rank w mod 2's rows and sends worker p what that rank sends p - (w - w mod 2)."""
    from emu.run.coordinator import Coordinator, RunProtocolFailed

    c = Coordinator("ipc:///nonexistent", 4, 2)
    rows = [np.arange(10, dtype=np.float32).reshape(10, 1), 100 + np.arange(6, dtype=np.float32).reshape(6, 1)]
    ins = [[1, 2, 3, 4], [3, 1, 0, 2]]
    # rank 0 receives: from w0 rank 0's piece 0, w1 rank 1's piece 0, w2 rank 0's piece 2, w3 rank 1's piece 2
    heads = [{"in_splits": ins[0], "out_splits": [1, 3, 3, 0]}, {"in_splits": ins[1], "out_splits": [2, 1, 4, 2]}]
    got = c._exchanged(0, heads, [[r] for r in rows])
    assert [x.ravel().tolist() for x in got[0]] == [[0.0], [100.0, 101.0, 102.0], [3.0, 4.0, 5.0], []]
    # rank 1: w0 rank 0's piece 1, w1 rank 1's piece 1, w2 rank 0's piece 3, w3 rank 1's piece 3
    assert [x.ravel().tolist() for x in got[1]] == [[1.0, 2.0], [103.0], [6.0, 7.0, 8.0, 9.0], [104.0, 105.0]]
    heads[1]["out_splits"] = [2, 1, 3, 2]
    with pytest.raises(RunProtocolFailed, match="rank 1 expects 3 rows from worker 2, which sends it 4"):
        c._exchanged(0, heads, [[r] for r in rows])
    coll = c._record(3, {"coll": "all_to_all", "dtype": "float32", "root": None, "shapes": [[10, 1]],
                         "in_splits": ins[0], "out_splits": [1, 3, 3, 0]}, [rows[0]], uneven=True)
    assert coll.kind == CollKind.ALL_TO_ALL and coll.count == 10 and coll.splits.send_elements == (1, 2, 3, 4)


def test_a_mixture_of_experts_runs_inside_a_larger_job(tmp_path, no_children) -> None:
    """The built-in moe script (pure expert parallelism, all_to_all_single with its router's split
    sizes) as 1 real rank of 16 workers: it trains, every piece it receives checked in its process,
    its recorded program's all_to_alls uneven, the replay at 16 workers verified."""
    from emu.capture.run import SCRIPTS

    out = tmp_path / "moe.json"
    result = run_job(["python", str(SCRIPTS / "moe_train.py"), "--steps", "5"],
                     RunConfig(replay=ReplayConfig(workers=16, fabric="ring")), cores=2, trace_out=out)
    assert result.report.verification.ok
    assert result.checked.results > 0 and result.checked.mismatches == 0 and not result.checked.unchecked
    trace = load_trace(out)
    uneven = [op for it in trace.ranks[0].iterations for op in it.colls if op.splits is not None]
    assert len(uneven) == 4 * trace.iterations and all(len(op.splits.send_elements) == 16 for op in uneven)
    from emu.study.predict import predict  # every worker its shifted sizes, a class each

    estimate = predict(trace, ReplayConfig(workers=16, fabric="ring")).iteration_us_median
    assert estimate == pytest.approx(result.report.summary.iteration_us_median, rel=0.02)


def test_all_to_all_lists_and_even_singles(tmp_path, no_children) -> None:
    """``dist.all_to_all`` of tensor lists and an even ``all_to_all_single``, 2 real ranks of 4
    workers: each rank gets from worker w what real rank w mod 2 sent the worker at its offset."""
    script = _script(tmp_path, "a2a.py", """
world = dist.get_world_size()
def size(src, dst):  # sizes that follow the peers' offset, as a job of copies keeps them
    return (dst - src) % world + 1
ins = [torch.full((size(rank, j),), 100.0 * rank + j) for j in range(world)]
want = [torch.full((size(w, rank),), 100.0 * (w % 2) + (rank - (w - w % 2)) % world) for w in range(world)]
outs = [torch.empty(size(w, rank)) for w in range(world)]
dist.all_to_all(outs, ins)
assert all(torch.equal(o, x) for o, x in zip(outs, want)), (outs, want)
x = torch.arange(8.0).reshape(world, 2) + 10 * rank
y = torch.empty(world, 2)
dist.all_to_all_single(y, x)
for w in range(world):
    assert y[w].tolist() == [10.0 * (w % 2) + 2 * ((rank - (w - w % 2)) % world) + c for c in (0, 1)], (w, y)
torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1).step()  # emu run cuts iterations at the optimizer
""")
    result = run_job(["python", str(script)], RunConfig(replay=ReplayConfig(workers=4, fabric="ring"), real=2,
                                                        warmup=0), cores=2)
    assert result.checked.results == 4 and result.checked.mismatches == 0
