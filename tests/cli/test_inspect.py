"""``emu inspect`` on real traces: the table and the JSON carry the same facts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from emu.cli import cli
from tests.conftest import A100


def test_import_then_inspect_json(tmp_path: Path) -> None:
    out = tmp_path / "a100.json.gz"
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "120"})
    result = runner.invoke(cli, ["capture", "--kineto", str(A100), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # status goes to stderr
    assert "wrote" in result.stderr and "ranks 1 of 2" in result.stderr
    result = runner.invoke(cli, ["inspect", str(out), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["iterations"] == 3 and data["world_size"] == 2 and data["ranks_in_file"] == [0]
    assert data["backend"] == "nccl" and data["source"] == "kineto"
    kinds = {(c["kind"], c["dtype"]): c for c in data["collectives"]}
    assert kinds[("all_reduce", "float32")]["per_iteration"] == 5
    assert kinds[("all_reduce", "float32")]["elements_per_iteration"] == 25_557_032
    assert 219_000 < data["step_us_median"] < 225_000
    assert data["overlap_pct"] is not None


def test_inspect_table(tmp_path: Path) -> None:
    out = tmp_path / "a100.json"
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert runner.invoke(cli, ["capture", "--kineto", str(A100), "-o", str(out)]).exit_code == 0
    result = runner.invoke(cli, ["inspect", str(out)])
    assert result.exit_code == 0
    for text in ("1 in file of world size 2", "all_reduce", "25,557,032", "102.2 MB", "overlap with compute"):
        assert text in result.stdout
    assert "\x1b[" not in result.stdout  # NO_COLOR honoured


def test_inspect_takes_a_shipped_sample_by_name() -> None:
    result = CliRunner().invoke(cli, ["inspect", "mlp", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "mlp" and data["world_size"] == 2


def test_inspect_shows_gradient_sparsity() -> None:
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "200"})
    result = runner.invoke(cli, ["inspect", "dlrm"])
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stdout.splitlines() if "gradient sparsity" in ln]
    assert re.search(r"gradient sparsity +\d+\.\d% of 256-element blocks non-zero per rank, \d+\.\d% on some rank "
                     r"\(median of 10 all_reduces; bytes-weighted \d+\.\d%, \d+\.\d%\)", line), line
    data = json.loads(runner.invoke(cli, ["inspect", "dlrm", "--json"]).stdout)
    sp = data["sparsity"]
    assert sp["block_elements"] == 256 and sp["all_reduces"] == sp["all_reduces_total"] == 10
    assert 0 < sp["nonzero_median"] < sp["union_median"] <= 1
    assert 0 < sp["nonzero_weighted"] < sp["union_weighted"] <= 1
    assert f"{100 * sp['nonzero_median']:.1f}% of 256-element blocks" in line  # the table and the JSON agree


def test_inspect_without_sparsity_is_as_before() -> None:
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "200"})
    result = runner.invoke(cli, ["inspect", "mlp"])
    assert result.exit_code == 0 and "sparsity" not in result.stdout
    data = json.loads(runner.invoke(cli, ["inspect", "mlp", "--json"]).stdout)
    assert data["sparsity"] is None and data["collectives"][0]["kind"] == "all_reduce"


def test_sparsity_line_names_partial_and_mixed_measures() -> None:
    from emu.cli.inspect import sparsity_line
    from emu.traces.summary import SparsityStats

    line = sparsity_line(SparsityStats(block_elements=None, all_reduces=3, all_reduces_total=4, nonzero_median=0.125,
                                       union_median=0.5, nonzero_weighted=0.1, union_weighted=0.4))
    assert line == ("12.5% of blocks non-zero per rank, 50.0% on some rank (median of the 3 of 4 all_reduces "
                    "measured; bytes-weighted 10.0%, 40.0%)")


def test_a_sharded_trace_shows_its_mesh_and_each_groups_collectives() -> None:
    runner = CliRunner(env={"NO_COLOR": "1", "COLUMNS": "160"})
    result = runner.invoke(cli, ["inspect", "tp"])
    assert result.exit_code == 0, result.output
    assert "mesh" in result.output and "dp=2,tp=2" in result.output and "group" in result.output
    data = json.loads(runner.invoke(cli, ["inspect", "tp", "--json"]).stdout)
    assert data["mesh"] == "dp=2,tp=2"
    rows = {(c["kind"], c["role"]): c for c in data["collectives"]}
    assert rows[("all_reduce", "tp")]["per_iteration"] == 3 and rows[("all_reduce", "dp")]["per_iteration"] == 1
