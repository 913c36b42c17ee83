"""``emu check``: pairing, verdicts, exit codes, JUnit and Markdown, through the command line.

One real replay (mlp, 2 workers, 1 iteration) per session; every other report is that one,
edited (a slower median, another worker count, a failed verification...).
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.errors import ConfigError
from emu.replay.report.model import REPORT_VERSION
from emu.study.check import format_change, parse_tolerance
from emu.study.reports import LOADERS, point_key, point_label
from tests.cli.test_cli_errors import assert_one_line_error


@pytest.fixture(scope="session")
def real() -> dict[str, Any]:
    """A real report of this emu, brought to version 2 by hand where this emu still writes 1."""
    from emu.replay import ReplayConfig, replay
    from emu.traces import load_trace, sample_path

    path = sample_path("mlp")
    doc = replay(load_trace(path), ReplayConfig(workers=2, iters=1), trace_path=str(path)).to_dict()
    if "sha256" not in doc["trace"]:
        doc["trace"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        doc["config"].setdefault("stragglers", None)
        doc["config"].setdefault("design", None)
        doc["report_version"] = 2
    assert doc["summary"]["iteration_us_median"] > 0 and doc["verification"]["ok"]
    assert doc["emulator"]["trustworthy"] and doc["complete"]
    return doc


def variant(doc: dict[str, Any], *, median: float | None = None, **config: Any) -> dict[str, Any]:
    new = copy.deepcopy(doc)
    if median is not None:
        new["summary"]["iteration_us_median"] = median
    new["config"].update(config)
    return new


def save(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def run(*args: str | Path):
    return CliRunner(env={"NO_COLOR": "1", "COLUMNS": "200"}).invoke(cli, ["check", *map(str, args)])


def pair(tmp_path: Path, base: dict[str, Any], cur: dict[str, Any]) -> tuple[Path, Path]:
    return save(tmp_path / "base.json", base), save(tmp_path / "cur.json", cur)


def median(doc: dict[str, Any]) -> float:
    return doc["summary"]["iteration_us_median"]


def test_the_same_report_passes(tmp_path: Path, real: dict[str, Any]) -> None:
    base, cur = pair(tmp_path, real, real)
    result = run(cur, "--baseline", base)
    assert result.exit_code == 0, result.output
    assert "mlp ina x2 100Gbps 5us" in result.stdout and " ok " in result.stdout
    assert "1 point(s) ok" in result.stderr


@pytest.mark.parametrize(("factor", "options", "code", "word"), [
    (1.10, (), 1, "REGRESSION"),  # beyond the default 5%
    (1.04, (), 0, "ok"),  # within it
    (1.04, ("--tolerance", "3%"), 1, "REGRESSION"),
    (1.04, ("--tolerance", "0.05"), 0, "ok"),
    (0.80, (), 0, "faster"),
    (0.99, ("--tolerance", "0"), 0, "faster"),
])
def test_verdicts_by_tolerance(tmp_path: Path, real: dict[str, Any], factor: float, options: tuple[str, ...],
                               code: int, word: str) -> None:
    base, cur = pair(tmp_path, real, variant(real, median=median(real) * factor))
    result = run(cur, "--baseline", base, *options)
    assert result.exit_code == code, result.output
    assert word in result.stdout
    if code:
        assert_one_line_error(result, "1 of 1 point(s) failed: 1 regression", code=1)


@pytest.mark.parametrize("tolerance", ["0", "0%"])
def test_tolerance_zero_catches_one_microsecond(tmp_path: Path, real: dict[str, Any], tolerance: str) -> None:
    base, cur = pair(tmp_path, real, variant(real, median=median(real) + 1.0))
    result = run(cur, "--baseline", base, "--tolerance", tolerance)
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.stdout and "+0.0022%" in result.stdout
    assert run(base, "--baseline", base, "--tolerance", tolerance).exit_code == 0


@pytest.mark.parametrize(("edit", "why"), [
    (lambda d: d["verification"].update(ok=False, mismatches=7), "verification failed (7 mismatched elements)"),
    (lambda d: d["emulator"].update(trustworthy=False), "not trustworthy"),
    (lambda d: d.update(complete=False, reason="interrupted", summary=None), "incomplete (interrupted)"),
    (lambda d: d.update(summary=None), "no summary"),
])
def test_a_current_report_that_cannot_be_trusted_fails(tmp_path: Path, real: dict[str, Any], edit, why: str) -> None:
    cur = copy.deepcopy(real)
    edit(cur)
    base, cur_path = pair(tmp_path, real, cur)
    result = run(cur_path, "--baseline", base)
    assert result.exit_code == 1, result.output
    assert f"FAILED: {why}" in result.stdout
    assert_one_line_error(result, "1 failed", code=1)
    # the same flaw in the baseline is not the current run's failure (but a null summary is)
    result = run(base, "--baseline", cur_path)
    assert result.exit_code == (1 if cur["summary"] is None else 0), result.output


def test_folders_pair_by_point_not_by_name(tmp_path: Path, real: dict[str, Any]) -> None:
    # a sweep's folder: reports under points/, and a results.json that is no report
    w2, w4 = real, variant(real, workers=4, median=median(real) * 1.5)
    save(tmp_path / "base/points/a.json", w2)
    save(tmp_path / "base/points/b.json", w4)
    save(tmp_path / "base/results.json", {"points": ["a", "b"]})
    save(tmp_path / "base/.git/x.json", {"report_version": "hidden folders are not searched"})
    save(tmp_path / "cur/deep/er/one.json", variant(w4, median=median(w4) * 1.2))
    save(tmp_path / "cur/two.json", w2)
    save(tmp_path / "cur/chrome.json", {"traceEvents": []})
    result = run(tmp_path / "cur", "--baseline", tmp_path / "base", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert [(p["label"], p["verdict"]) for p in doc["points"]] == [
        ("mlp ina x4 100Gbps 5us", "REGRESSION"), ("mlp ina x2 100Gbps 5us", "ok")]
    assert doc["points"][0]["current_path"].endswith("one.json") and doc["points"][0]["change"] == pytest.approx(0.2)
    assert doc["ok"] is False and doc["tolerance"] == 0.05


def test_a_point_on_one_side_only_fails(tmp_path: Path, real: dict[str, Any]) -> None:
    save(tmp_path / "both/a.json", real)
    save(tmp_path / "both/b.json", variant(real, workers=4))
    save(tmp_path / "one/a.json", real)
    result = run(tmp_path / "one", "--baseline", tmp_path / "both")
    assert result.exit_code == 1, result.output
    assert "MISSING in current" in result.stdout
    assert_one_line_error(result, "1 of 2 point(s) failed: 1 missing in current", code=1)
    result = run(tmp_path / "both", "--baseline", tmp_path / "one")
    assert result.exit_code == 1, result.output
    assert "NEW" in result.stdout
    assert_one_line_error(result, "1 new", code=1)


def test_ignore_config_pairs_by_trace(tmp_path: Path, real: dict[str, Any]) -> None:
    slower = variant(real, bandwidth_bps=1e10, median=median(real) * 1.3)
    base, cur = pair(tmp_path, real, slower)
    result = run(cur, "--baseline", base)  # a changed design is another point
    assert result.exit_code == 1, result.output
    assert "MISSING in current" in result.stdout and "NEW" in result.stdout
    assert "bandwidth 100Gbps -> 10Gbps" in result.stdout and "--ignore-config" in result.stdout
    assert_one_line_error(result, "1 missing in current, 1 new", "2 of them have their trace on the other side",
                          code=1)
    result = run(cur, "--baseline", base, "--ignore-config")
    assert result.exit_code == 1, result.output
    assert "mlp ina x2 10Gbps 5us" in result.stdout and "REGRESSION (bandwidth 100Gbps -> 10Gbps)" in result.stdout
    assert "+30.00%" in result.stdout
    # two reports of one trace on a side cannot be paired by trace alone
    save(tmp_path / "two/a.json", real)
    save(tmp_path / "two/b.json", variant(real, workers=4))
    assert_one_line_error(run(tmp_path / "two", "--baseline", base, "--ignore-config"),
                          "a.json and", "b.json are the same point", "--ignore-config pairs by trace alone")
    assert run(tmp_path / "two", "--baseline", tmp_path / "two").exit_code == 0
    md = tmp_path / "s.md"
    assert run(cur, "--baseline", base, "--ignore-config", "--markdown", md).exit_code == 1
    assert "| +30.00% | **REGRESSION** (bandwidth 100Gbps -> 10Gbps) |" in md.read_text()


def test_duplicate_points_exit_2(tmp_path: Path, real: dict[str, Any]) -> None:
    # processes, tdf and the design label do not change results: these are one point twice
    save(tmp_path / "cur/a.json", real)
    save(tmp_path / "cur/b.json", variant(real, processes=7, tdf=3.0, design={"name": "other"}))
    base = save(tmp_path / "base.json", real)
    assert_one_line_error(run(tmp_path / "cur", "--baseline", base), "CURRENT:", "a.json and", "b.json",
                          "same point", "keep one of them")
    assert_one_line_error(run(base, "--baseline", tmp_path / "cur"), "--baseline:", "same point")


@pytest.mark.parametrize(("edit", "fragments"), [
    (lambda d: d["summary"].update(iteration_us_median="fast"), ("summary.iteration_us_median", "re-run emu replay")),
    (lambda d: d["trace"].pop("sha256"), ("trace.sha256: expected 64 hex digits, found nothing",)),
    (lambda d: d["verification"].update(ok="yes"), ("verification.ok: expected true or false",)),
    (lambda d: d.pop("config"), ("config: expected an object",)),
    (lambda d: d.update(report_version="2"), ("report_version: expected an integer",)),
    (lambda d: d.update(report_version=99), ("report_version 99 is not supported (written by a newer emu",
                                             "this emu reads report_version 1, 2, 3, 4, 5")),
    (lambda d: d.update(report_version=0), ("report_version 0 is not supported",)),
])
def test_malformed_reports_exit_2(tmp_path: Path, real: dict[str, Any], edit, fragments: tuple[str, ...]) -> None:
    bad = copy.deepcopy(real)
    edit(bad)
    base, cur = pair(tmp_path, real, bad)
    assert_one_line_error(run(cur, "--baseline", base), str(cur), *fragments)
    save(tmp_path / "folder/points/p.json", bad)  # in a folder too
    assert_one_line_error(run(tmp_path / "folder", "--baseline", base), "p.json", *fragments)


def test_unreadable_inputs_exit_2(tmp_path: Path, real: dict[str, Any]) -> None:
    base = save(tmp_path / "base.json", real)
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut/r.json").write_text('{"report_version": 2, "config": {')
    assert_one_line_error(run(tmp_path / "cut", "--baseline", base), "r.json: not valid JSON")
    save(tmp_path / "none/results.json", {"points": []})
    assert_one_line_error(run(tmp_path / "none", "--baseline", base), "no replay reports")
    assert_one_line_error(run(tmp_path / "none/results.json", "--baseline", base), "not a replay report")
    assert_one_line_error(run(tmp_path / "nowhere", "--baseline", base), "no such file or folder")
    assert_one_line_error(run(base, "--baseline", base, "--tolerance", "5"), "write 5% for 5 percent")
    assert_one_line_error(run(base, "--baseline", base, "--junit", base / "j.xml"), "--junit", "is not a folder")
    assert_one_line_error(run(base, "--baseline", base, "--junit", tmp_path / "x", "--markdown", tmp_path / "x"),
                          "give two files")
    assert_one_line_error(run(base), "--baseline")


def test_version_1_reports_hash_their_trace(tmp_path: Path, real: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import emu.traces.io

    hashed: list[str] = []

    def fake_sha256(path) -> str:
        hashed.append(str(path))
        return real["trace"]["sha256"]

    monkeypatch.setattr(emu.traces.io, "trace_sha256", fake_sha256, raising=False)
    old = copy.deepcopy(real)
    old["report_version"] = 1
    del old["trace"]["sha256"], old["config"]["stragglers"], old["config"]["design"]
    old["trace"]["path"] = "mlp.json.gz"  # relative: found next to the report
    save(tmp_path / "v1/a.json", old)
    save(tmp_path / "v1/b.json", variant(old, workers=4))
    shutil.copy(real["trace"]["path"], tmp_path / "v1/mlp.json.gz")
    spans = {**real, "report_version": 5}  # iterations of one meaning, spans, on both sides
    cur = save(tmp_path / "cur/a.json", spans)
    save(tmp_path / "cur/b.json", variant(spans, workers=4))
    result = run(tmp_path / "cur", "--baseline", tmp_path / "v1")
    assert result.exit_code == 0, result.output
    assert hashed == [str(tmp_path / "v1/mlp.json.gz")]  # hashed once for both reports
    old["trace"]["path"] = str(tmp_path / "gone.json.gz")
    v1 = save(tmp_path / "old.json", old)
    assert_one_line_error(run(cur, "--baseline", v1), str(v1), "trace.sha256: missing (report_version 1)",
                          "re-run emu replay with this emu to record trace.sha256")


def test_junit(tmp_path: Path, real: dict[str, Any]) -> None:
    save(tmp_path / "base/a.json", real)
    save(tmp_path / "base/b.json", variant(real, workers=4))
    save(tmp_path / "base/c.json", variant(real, workers=8))
    save(tmp_path / "cur/a.json", variant(real, median=median(real) * 2))
    save(tmp_path / "cur/b.json", variant(real, workers=4))
    junit = tmp_path / "out/junit.xml"
    result = run(tmp_path / "cur", "--baseline", tmp_path / "base", "--junit", junit)
    assert result.exit_code == 1, result.output
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "emu check"
    assert (suite.get("tests"), suite.get("failures")) == ("3", "2")
    cases = suite.findall("testcase")
    assert len(cases) == 3 and {c.get("classname") for c in cases} == {"emu.check"}
    failures = {c.get("name"): c.find("failure") for c in cases}
    assert failures["mlp ina x4 100Gbps 5us"] is None
    regression = failures["mlp ina x2 100Gbps 5us"]
    assert regression is not None and regression.get("type") == "REGRESSION"
    assert f"baseline {median(real) / 1000:.3f} ms" in regression.get("message", "")
    assert "change +100.00%" in regression.get("message", "")
    missing = failures["mlp ina x8 100Gbps 5us"]
    assert missing is not None and missing.get("type") == "MISSING"
    keys = {c.get("name"): c.find("properties/property[@name='key']").get("value") for c in cases}
    assert keys["mlp ina x4 100Gbps 5us"] == point_key(variant(real, workers=4))
    times = {c.get("name"): float(c.get("time", "")) for c in cases}
    assert times["mlp ina x2 100Gbps 5us"] == pytest.approx(2 * median(real) / 1e6, abs=1e-6)
    assert times["mlp ina x8 100Gbps 5us"] == 0.0


def test_markdown(tmp_path: Path, real: dict[str, Any]) -> None:
    base, cur = pair(tmp_path, real, variant(real, median=median(real) * 1.5))
    md = tmp_path / "summary.md"
    assert run(cur, "--baseline", base, "--markdown", md).exit_code == 1
    lines = md.read_text().splitlines()
    assert lines[0] == "**emu check failed**: 1 of 1 point(s) failed: 1 regression (tolerance 5%)"
    assert lines[2] == "| point | baseline (ms) | current (ms) | change | verdict |"
    assert lines[4].startswith("| mlp ina x2 100Gbps 5us |") and "| +50.00% | **REGRESSION** |" in lines[4]
    assert run(base, "--baseline", base, "--markdown", md).exit_code == 0
    assert md.read_text().startswith("**emu check passed**: 1 point(s) ok")


def test_point_key() -> None:
    doc = {"trace": {"sha256": "ab" * 32}, "config": {"workers": 8, "latency_us": 5.0, "tdf": 2.0}}
    key = point_key(doc)
    assert len(key) == 16 and int(key, 16) >= 0
    # options added later with a null (or empty) default, and results-neutral keys, pair
    assert point_key({**doc, "config": {**doc["config"], "new_option": None, "stragglers": [], "processes": 3,
                                        "packet_wire_bytes": 1, "design": {"x": 1}, "tdf": None}}) == key
    assert point_key({**doc, "config": {"workers": 8, "latency_us": 5}}) == key  # 5.0 and 5 are one latency
    assert point_key({**doc, "config": {**doc["config"], "workers": 9}}) != key
    assert point_key({**doc, "config": {**doc["config"], "stragglers": ["0:2"]}}) != key
    assert point_key({**doc, "trace": {"sha256": "AB" * 32}}) == key
    assert point_key(doc, ignore_config=True) == point_key({**doc, "config": {}}, ignore_config=True)
    with pytest.raises(ConfigError, match="trace.sha256"):
        point_key({"trace": {}, "config": {}})


def test_point_label() -> None:
    config = {"fabric": "ring", "workers": 64, "bandwidth_bps": 2.5e10, "latency_us": 2.0, "loss": 0.001}
    assert point_label({"trace": {"model": "cnn"}, "config": config}) == "cnn ring x64 25Gbps 2us loss 0.001"
    assert point_label({"trace": {"model": None, "path": "/x/t.json.gz"}, "config": {**config, "loss": 0.0,
                                                                                    "bandwidth_bps": None}}) \
        == "t ring x64 ideal 2us"
    assert point_label({}) == "trace ? x?"


def test_tolerance_syntax() -> None:
    assert parse_tolerance("5%") == pytest.approx(0.05) and parse_tolerance("0.05") == 0.05
    assert parse_tolerance("0") == parse_tolerance("0%") == 0.0 and parse_tolerance("1000%") == 10.0
    for bad in ("-1%", "-0.1", "1001%", "5", "fast", "nan", "inf%"):
        with pytest.raises(ConfigError, match="--tolerance"):
            parse_tolerance(bad)
    assert format_change(0.5) == "+50.00%" and format_change(-2e-5) == "-0.002%" and format_change(None) == "-"


def test_every_version_this_emu_writes_has_a_loader() -> None:
    assert REPORT_VERSION in LOADERS and max(LOADERS) == REPORT_VERSION


def test_odd_names_stay_valid_xml_and_markdown(tmp_path: Path, real: dict[str, Any]) -> None:
    odd = copy.deepcopy(real)
    odd["trace"]["model"] = "a|b<c>\x01"
    base, cur = pair(tmp_path, odd, variant(odd, median=median(odd) * 2))
    junit, md = tmp_path / "j.xml", tmp_path / "s.md"
    assert run(cur, "--baseline", base, "--junit", junit, "--markdown", md).exit_code == 1
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case is not None and case.get("name") == "a|b<c>? ina x2 100Gbps 5us"
    assert "| a\\|b<c>\x01 ina x2 100Gbps 5us |" in md.read_text()


def test_a_report_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    """A report nested 100,000 deep: the same depth guard as the trace loader, not Python's
    'maximum recursion depth exceeded' (issue 37)."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"report_version": 5, "deep": ' + "[" * 100_000 + "0" + "]" * 100_000 + "}")
    result = CliRunner().invoke(cli, ["check", str(deep), "--baseline", str(deep)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"emu: error: {deep}: nests arrays and objects more than 64 deep, which no "
                                     "report does; the file is corrupted: re-run emu replay --report to write it "
                                     "again, or move it out of the folder")


def test_spans_and_periods_are_not_compared(tmp_path: Path, real: dict[str, Any]) -> None:
    """Before report version 6 an iteration was its span, since then its period: a baseline of the
    one and a current report of the other is refused in one line, naming the file and the fix,
    either way round; reports of one meaning compare as before."""
    old = save(tmp_path / "old.json", {**real, "report_version": 5})
    new = save(tmp_path / "new.json", real)
    assert_one_line_error(run(new, "--baseline", old), str(old), "report_version 5 measures an iteration as its span",
                          "write the --baseline reports again with this emu")
    assert_one_line_error(run(old, "--baseline", new), str(old), "write the CURRENT reports again with this emu")
    assert run(old, "--baseline", old).exit_code == 0 and run(new, "--baseline", new).exit_code == 0
