"""emu run: real ranks of an unmodified script (real torch processes) inside a job of M workers."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emu.capture.launcher import run_ranks
from emu.cli import cli
from emu.emulator.payload.recorded import load_payload
from emu.errors import ConfigError
from emu.replay import ReplayConfig
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
    assert result.report.verification.ok and result.mismatches == 0 and result.elements_checked > 0
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


def test_the_coordinator_checks_what_it_sends() -> None:
    from emu.run.coordinator import Coordinator

    c = Coordinator("ipc:///nonexistent", 4, 2)
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
    head = {"coll": "all_reduce", "dtype": "float32", "op": "sum", "root": None}
    good = c._results("all_reduce", head, [[a], [b]])
    c._verify("all_reduce", head, [[a], [b]], good)
    assert (c.checked.elements, c.checked.mismatches) == (4, 0)
    c._verify("all_reduce", head, [[a], [b]], [[np.array([8.0, 12.0], np.float32)], [good[1][0] * 1.01]])
    assert c.checked.mismatches == 2  # the second rank's reply is 1% off
