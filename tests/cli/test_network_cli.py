"""``--network design.toml`` on emu replay, and ``emu predict`` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.replay import ReplayConfig
from emu.study.predict import predict
from emu.traces import load_trace, sample_path

DESIGN = '''name = "lossy-25g"
fabric = "ring"
[link]
bandwidth = "25Gbps"
latency = "10us"
loss = 0.001
[switch]
elements = 256
'''


def run(*args: str):
    return CliRunner(env={"NO_COLOR": "1", "COLUMNS": "160"}).invoke(cli, list(args))


def test_replay_takes_a_design_and_records_it_resolved(tmp_path: Path) -> None:
    design = tmp_path / "d.toml"
    design.write_text(DESIGN)
    result = run("replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64",
                 "--network", str(design), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    cfg = doc["config"]
    assert (cfg["fabric"], cfg["bandwidth_bps"], cfg["latency_us"], cfg["loss"], cfg["elements"]) == (
        "ring", 25e9, 10.0, 0.001, 256)
    assert cfg["design"] == {"file": str(design), "name": "lossy-25g", "fabric": "ring",
                             "link": {"bandwidth_bps": 25e9, "latency_us": 10.0, "loss": 0.001, "jitter_us": 0.0},
                             "switch": {"slots": cfg["slots"], "elements": 256}}
    assert len(doc["trace"]["sha256"]) == 64


def test_typed_flags_win_over_the_design(tmp_path: Path) -> None:
    design = tmp_path / "d.toml"
    design.write_text(DESIGN)
    result = run("replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64",
                 "--network", str(design), "--fabric", "ina", "--bandwidth", "100Gbps", "--json")
    assert result.exit_code == 0, result.output
    cfg = json.loads(result.stdout)["config"]
    assert (cfg["fabric"], cfg["bandwidth_bps"], cfg["latency_us"], cfg["loss"]) == ("ina", 100e9, 10.0, 0.001)
    assert cfg["design"]["fabric"] == "ina" and cfg["design"]["link"]["bandwidth_bps"] == 100e9


@pytest.mark.parametrize("text, words", [
    ('[link]\nbandwith = "10Gbps"\n', ["link.bandwith", "link.bandwidth"]),
    ('fabric = "nope"\n', ["fabric", "ina"]),
    ('[link]\nloss = "1%"\n', ["link.loss", "0.01"]),
    ("[link\n", ["not valid TOML"]),
])
def test_bad_design_is_one_line_and_exit_2(tmp_path: Path, text: str, words: list[str]) -> None:
    design = tmp_path / "bad.toml"
    design.write_text(text)
    result = run("replay", "mlp", "--workers", "2", "--network", str(design))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and str(design) in line
    for word in words:
        assert word in line


def test_missing_design_file_is_exit_2(tmp_path: Path) -> None:
    result = run("replay", "mlp", "--network", str(tmp_path / "absent.toml"))
    assert result.exit_code == 2 and "absent.toml" in result.output


def test_predict_prints_the_library_estimate_for_every_point() -> None:
    result = run("predict", "mlp", "--workers", "8,64", "--fabric", "ina,ring", "--bandwidth", "10Gbps", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["fabric"], r["workers"]) for r in rows] == [("ina", 8), ("ina", 64), ("ring", 8), ("ring", 64)]
    trace = load_trace(sample_path("mlp"))
    from emu.emulator.links.spec import LinkSpec

    for r in rows:
        want = predict(trace, ReplayConfig(workers=r["workers"], fabric=r["fabric"], link=LinkSpec(bandwidth_bps=10e9)))
        assert r["iteration_us_median"] == pytest.approx(want.iteration_us_median)
        # the critical worker's own start to end; the period is shorter where it started before the
        # iteration before had ended on every worker
        assert r["compute_us"] + r["exposed_comm_us"] >= r["iteration_us_median"] - 1.0
    by = {(r["fabric"], r["workers"]): r["iteration_us_median"] for r in rows}
    assert by[("ring", 64)] > by[("ina", 64)]  # at 10 Gb/s and 64 workers the ring moves ~2x the bytes


def test_predict_table_and_past_the_replay_limit() -> None:
    result = run("predict", "mlp", "--workers", "1024", "--fabric", "ring")  # no replay: no limit
    assert result.exit_code == 0, result.output
    assert "analytic estimate" in result.stdout and "1024" in result.stdout


def test_predict_bad_grid_is_exit_2() -> None:
    result = run("predict", "mlp", "--workers", "8,0")
    assert result.exit_code == 2 and "--workers" in result.output


@pytest.mark.parametrize(("args", "words"), [(["--sparsity", "2"], ["--sparsity 2.0", "(0, 1]"]),
                                             (["--sparsity", "0.3:0.1"], ["--sparsity", "[F, 1]"]),
                                             (["--sparsity", "dense"], ["--sparsity 'dense'", "none"]),
                                             (["--sparsity-block", "0"], ["--sparsity-block"])])
def test_bad_sparsity_is_one_line_and_exit_2(args: list[str], words: list[str]) -> None:
    from tests.cli.test_cli_errors import assert_one_line_error

    assert_one_line_error(run("replay", "mlp", *args), *words)
    assert_one_line_error(run("predict", "mlp", *args), *words)


@pytest.mark.slow
def test_replay_sparsity_is_in_the_report_and_the_table() -> None:
    args = ["replay", "mlp", "--workers", "4", "--iters", "1", "--payload-scale", "64", "--sparsity", "0.1:0.3"]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["config"]["sparsity"] == {"source": "option", "nonzero": 0.1, "union": 0.3, "block_elements": 256}
    assert doc["sparsity"]["union_fraction"] == pytest.approx(0.3, abs=0.01) and doc["sparsity"]["sent_fraction"] < 0.5
    assert doc["verification"]["ok"]
    table = run(*args, "--sparsity-block", "100")
    assert table.exit_code == 0, table.output
    assert "non-zero blocks" in table.stdout and "per worker" in table.stdout
    dense = run("replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64", "--json")
    assert json.loads(dense.stdout)["config"]["sparsity"] is None and json.loads(dense.stdout)["sparsity"] is None
    assert "non-zero blocks" not in run("replay", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64").stdout


def test_sweep_takes_one_sparsity_for_the_grid(tmp_path: Path) -> None:
    result = run("sweep", "mlp", "--workers", "2", "--iters", "1", "--payload-scale", "64", "--sparsity", "0.2",
                 "--out", str(tmp_path / "s"), "--no-plots", "--no-predict")
    assert result.exit_code == 0, result.output
    reports = list((tmp_path / "s").rglob("*.json"))
    docs = [json.loads(p.read_text()) for p in reports]
    points = [d for d in docs if isinstance(d, dict) and "report_version" in d]
    assert points and all(d["config"]["sparsity"]["source"] == "option" and d["verification"]["ok"] for d in points)


@pytest.mark.parametrize("args, words", [
    (["mlp", "--sparsity-block", "64"], ["--sparsity-block", "no sparsity"]),
    (["dlrm", "--sparsity", "none", "--sparsity-block", "64"], ["--sparsity-block", "none"]),
])
def test_a_sparsity_block_with_nothing_to_cut_is_refused(args: list[str], words: list[str]) -> None:
    result = run("replay", *args, "--workers", "2", "--iters", "1")
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output
