"""Bad input on the command line: one clear line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.errors import ConfigError
from tests.conftest import A100, GLOO_MLP


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def derived(tmp_path: Path, source: Path, keep) -> Path:
    doc = json.loads(gzip.decompress(source.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if keep(e)]
    path = tmp_path / f"derived-{source.name.removesuffix('.gz')}"
    path.write_text(json.dumps(doc))
    return path


def assert_one_line_error(result, *fragments: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    # status lines (progress, off a terminal) may come first; the error is one line, the last
    assert [line for line in lines if line.startswith("emu: ")] == lines[-1:], result.stderr
    lines = lines[-1:]
    assert lines[0].startswith("emu: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_file(tmp_path: Path) -> None:
    assert_one_line_error(run("capture", "--kineto", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o.json")),
                          "nope.json", "no such file")


def test_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    assert_one_line_error(run("capture", "--kineto", str(bad), "-o", str(tmp_path / "o.json")),
                          "bad.json", "not a JSON file")


def test_json_that_is_not_kineto(tmp_path: Path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"hello": [1, 2]}))
    assert_one_line_error(run("capture", "--kineto", str(bad), "-o", str(tmp_path / "o.json")),
                          "other.json", "not a Kineto trace", "traceEvents")


def test_trace_without_profiler_steps(tmp_path: Path) -> None:
    path = derived(tmp_path, GLOO_MLP / "rank0.json.gz",
                   lambda e: not str(e.get("name", "")).startswith("ProfilerStep"))
    assert_one_line_error(run("capture", "--kineto", str(path), "-o", str(tmp_path / "o.json")),
                          "no ProfilerStep#N events", "prof.step()")


def test_rank_files_of_different_jobs(tmp_path: Path) -> None:
    result = run("capture", "--kineto", str(A100), str(GLOO_MLP / "rank1.json.gz"), "-o", str(tmp_path / "o.json"))
    assert_one_line_error(result, "rank files of different jobs", "backend")


def test_same_rank_twice(tmp_path: Path) -> None:
    copy = tmp_path / "copy.json.gz"
    copy.write_bytes((GLOO_MLP / "rank0.json.gz").read_bytes())
    result = run("capture", "--kineto", str(GLOO_MLP / "rank0.json.gz"), str(copy), "-o", str(tmp_path / "o.json"))
    assert_one_line_error(result, "rank 0 is given twice")


def test_empty_program(tmp_path: Path) -> None:
    path = derived(tmp_path, GLOO_MLP / "rank0.json.gz",
                   lambda e: not str(e.get("name", "")).startswith(("c10d::", "gloo:")))
    assert_one_line_error(run("capture", "--kineto", str(path), "-o", str(tmp_path / "o.json")),
                          "issue no collectives", "empty program")


def test_shapes_not_recorded(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress((GLOO_MLP / "rank0.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    path = tmp_path / "noshapes.json"
    path.write_text(json.dumps(doc))
    assert_one_line_error(run("capture", "--kineto", str(path), "-o", str(tmp_path / "o.json")),
                          "record_shapes=True")


def test_no_mode_and_two_modes(tmp_path: Path) -> None:
    assert_one_line_error(run("capture", "-o", str(tmp_path / "o.json")), "exactly one of")
    assert_one_line_error(run("capture", "--model", "mlp", "--kineto", str(A100), "-o", str(tmp_path / "o.json")),
                          "exactly one of")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run("capture", "--model", "resnet", "-o", "x.json").exit_code == 2
    assert run("capture", "--model", "mlp").exit_code == 2  # -o is required
    assert run("inspect").exit_code == 2


def test_inspect_bad_inputs(tmp_path: Path) -> None:
    assert_one_line_error(run("inspect", str(tmp_path / "none.json")), "none.json", "no such file")
    (tmp_path / "empty.json").write_text(json.dumps({"schema": "emu-trace", "schema_version": 1, "meta": {
        "source": "capture", "world_size": 2, "backend": "gloo", "device": "cpu", "framework": "torch",
        "dtype": "float32", "captured_at": "x"}, "ranks": []}))
    assert_one_line_error(run("inspect", str(tmp_path / "empty.json")), "field 'ranks' is empty")


def test_not_a_python_script(tmp_path: Path) -> None:
    assert_one_line_error(run("capture", "-o", str(tmp_path / "o.json"), "--", "torchrun", "train.py"),
                          "not python")
    assert_one_line_error(run("capture", "-o", str(tmp_path / "o.json"), "--", "python", str(tmp_path / "nope.py")),
                          "no such script")
    # python -c: not "-c: no such script" (issue 37), in capture and in emu run alike
    assert_one_line_error(run("capture", "-o", str(tmp_path / "o.json"), "--", "python", "-c", "print(1)"),
                          "python -c: emu runs a script file or a module", "save the code to train.py")
    assert_one_line_error(run("run", "--workers", "8", "--", "python", "-c", "print(1)"),
                          "python -c: emu runs a script file or a module")


@pytest.mark.parametrize("where", ["first", "after", "end"])
def test_debug_shows_traceback(tmp_path: Path, where: str) -> None:
    """--debug wherever a user types it before -- (issue 37: it worked only before the command)."""
    args = ["inspect", str(tmp_path / "none.json")]
    args = {"first": ["--debug", *args], "after": [args[0], "--debug", args[1]], "end": [*args, "--debug"]}[where]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and result.exception is not None


def test_debug_after_the_separator_is_the_scripts() -> None:
    from emu.cli import _debug_first

    assert _debug_first(["run", "--", "python", "t.py", "--debug"]) == ["run", "--", "python", "t.py", "--debug"]
    assert _debug_first(["capture", "--model", "mlp", "--debug", "-o", "x"]) == \
        ["--debug", "capture", "--model", "mlp", "-o", "x"]
    # the script's, without -- too (capture and run hand what follows the first word to the script)
    assert _debug_first(["capture", "-o", "t.json", "python", "train.py", "--debug"]) == \
        ["capture", "-o", "t.json", "python", "train.py", "--debug"]
    # an option's value, not emu's flag
    assert _debug_first(["export", "mlp", "--chakra", "out", "--name", "--debug"]) == \
        ["export", "mlp", "--chakra", "out", "--name", "--debug"]
    assert _debug_first(["replay", "mlp", "--workers", "2", "--debug"]) == ["--debug", "replay", "mlp", "--workers", "2"]


def test_a_duration_without_a_unit_is_refused() -> None:
    """--latency 5: 5 what? Every other message asks for a unit; 0 needs none (issue 37)."""
    assert_one_line_error(run("replay", "mlp", "--latency", "5"), "--latency '5'", "give a duration with a unit")
    assert_one_line_error(run("replay", "mlp", "--jitter", "2.5"), "give a duration with a unit")
    from emu.emulator.links.spec import parse_duration_us

    assert parse_duration_us("0") == 0.0 and parse_duration_us("5us") == 5.0
    with pytest.raises(ConfigError, match="has no unit: give one, e.g. 7us or 7ms"):
        parse_duration_us("7")


def test_an_unwritable_trace_path_is_refused_before_the_capture(tmp_path: Path) -> None:
    """-o under a file: refused before any rank starts (exit 2), as replay's --report is; a trace
    that cannot be written once made is a failed run (exit 1), as a report is (issue 37)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("capture", "--model", "mlp", "-o", str(blocker / "t.json.gz"))
    assert_one_line_error(result, "-o", "not a folder")
    from emu.errors import RunFailed
    from emu.traces import load_trace, sample_path, save_trace

    with pytest.raises(RunFailed) as info:
        save_trace(load_trace(sample_path("mlp")), blocker / "t.json")
    assert info.value.exit_code == 1 and "cannot write the trace" in str(info.value)


def test_a_design_refused_by_the_run_names_its_file(tmp_path: Path) -> None:
    """A hierarchical ps design: the message names the file, not "--fabric ps" (issue 37)."""
    design = tmp_path / "hps.toml"
    design.write_text('fabric = "ps"\n[topology]\nworkers_per_node = 2\nalgorithm = "hierarchical"\n')
    assert_one_line_error(run("replay", "mlp", "--network", str(design)),
                          f"{design}: topology.algorithm = \"hierarchical\" on the fabric ps", "give \"flat\"")
