"""The docs run as written (issue 37): every ``emu ...`` command in README.md and docs/*.md is
read by the CLI's own parser and checked as the command would check it before it runs (flags,
values, design files, the files and scripts the repository ships); every wall-time figure the
docs mark comes from benchmarks/docs_figures.py's last run. The slow tier runs the commands whose
output the docs show and compares their emulated numbers (tests/test_docs_outputs.py).

Which commands are checked how:

- a *synopsis* names placeholders (``TRACE``, ``M[,M...]``, ``NAME[:PARAM]``, ``a|b``, ``$trace``)
  or is a line of a diagram (``->``, ``(what-if grids)``, `` / ``): its subcommand and every flag
  it names must exist;
- a *mention* (inline code ending in an option that wants a value, or a bare ``emu replay``):
  the same;
- every other command is *concrete*: parsed by click exactly as typed, then checked by the
  command's own before-the-run code (``emu.cli.replay._configs``, ``emu.cli.sweep.build_grid``,
  ``emu.cli.options.design_values``, the design file's loader). A path under a folder the
  repository ships (examples/, emu/, docs/, tests/, benchmarks/) must exist, and so must the
  script after ``-- python``; any other file name (``job.json.gz``) is the user's own.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHIPPED = ("examples/", "emu/", "docs/", "tests/", "benchmarks/")
PLACEHOLDER = re.compile(r"(^|[\s=,:])([A-Z][A-Z0-9_]*)(?=$|[\s,:.\[\]])|\[|\]|\||\.\.\.|\$\w|->|\(| / ")
OPTION = re.compile(r"^--?[a-z]")


@dataclass(frozen=True)
class DocCommand:
    """One ``emu ...`` command as a doc shows it."""

    file: str
    line: int
    text: str
    inline: bool

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def doc_commands() -> list[DocCommand]:
    """Every ``emu`` command in the docs: inline code and lines of code blocks (fenced or
    indented), continuation lines joined, a shell prompt ``$ `` and trailing comments dropped."""
    found = []
    for path in DOCS:
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        for m in re.finditer(r"`(emu [^`]+)`", text):
            found.append(DocCommand(name, text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()), True))
        found += _block_commands(name, text.splitlines())
    return found


def _block_commands(name: str, lines: list[str]) -> list[DocCommand]:
    """A block's ``emu`` lines (``sudo`` and ``.venv/bin/`` dropped); inside a shell loop
    ``for VAR in A B; do ... done``, one command per value of ``$VAR``."""
    found, fenced, i, loop = [], False, 0, None
    while i < len(lines):
        line, start = lines[i], i
        if line.strip().startswith("```"):
            fenced, loop = not fenced, None
        elif fenced or line.startswith("    "):
            text = re.sub(r"^(\$ )?(sudo )?(\.venv/bin/)?", "", line.strip())
            header = re.fullmatch(r"for (\w+) in ([^;]+); do", text)
            loop = (header.group(1), header.group(2).split()) if header else None if text == "done" else loop
            if text.startswith("emu "):
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                values = loop[1] if loop and f"${loop[0]}" in text else [None]
                found += [DocCommand(name, start + 1, _uncommented(text if v is None else text.replace(f"${loop[0]}", v)),
                                     False) for v in values]
        i += 1
    return found


def _own_words(text: str) -> list[str]:
    """The command's words, up to a shell redirection or pipe (``> out.json``, ``| jq``)."""
    words = shlex.split(text)
    cut = next((i for i, w in enumerate(words) if re.match(r"^(\d?>|\||&&|;)", w)), len(words))
    return words[:cut]


def _uncommented(text: str) -> str:
    return " ".join(shlex.split(text, comments=True)) if "#" in text else " ".join(text.split())


def _group() -> click.Group:
    from emu.cli import cli

    return cli


def _flags(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h", "--debug"}


def _wants_value(command: click.Command, flag: str) -> bool:
    return any(flag in p.opts and isinstance(p, click.Option) and not p.is_flag and not p.count
               for p in command.params)


def _kind(doc: DocCommand, words: list[str], command: click.Command) -> str:
    if PLACEHOLDER.search(doc.text):
        return "synopsis"
    if doc.inline and (len(words) == 2 or _wants_value(command, words[-1])):
        return "mention"
    return "concrete"


COMMANDS = doc_commands()


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths in the docs are relative to the repository's root, as a reader types them there."""
    monkeypatch.chdir(ROOT)


def test_the_docs_name_commands() -> None:
    """The extraction itself: the README's quick tour is among what is checked."""
    assert len(COMMANDS) > 150
    assert any(c.file == "README.md" and c.text.startswith("emu replay mlp --workers 8 --fabric ina,ring")
               for c in COMMANDS)


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda c: f"{c.file}:{c.line}")
def test_a_doc_command_is_one_emu_takes(doc: DocCommand) -> None:
    words = _own_words(doc.text)
    group = _group()
    command = group.commands.get(words[1])
    assert command is not None, f"{doc}: emu has no command {words[1]!r}"
    kind = _kind(doc, words, command)
    own = words[2:words.index("--")] if "--" in words else words[2:]
    unknown = [w.split("=")[0] for w in own if OPTION.match(w) and w.split("=")[0] not in _flags(command)]
    assert unknown == [], f"{doc}: emu {words[1]} has no option {', '.join(unknown)}"
    if kind != "concrete":
        return
    args = [w for w in words[2:] if w != "--debug"]
    try:
        ctx = command.make_context(words[1], args, parent=click.Context(group, info_name="emu"))
    except click.MissingParameter:
        if doc.inline:  # prose naming a form (`emu capture -- python train.py`), not a whole command
            return
        raise
    except click.ClickException as e:
        pytest.fail(f"{doc}: {e.format_message()}")
    _files_exist(doc, words)
    _checked_as_before_the_run(doc, words[1], ctx)


def _files_exist(doc: DocCommand, words: list[str]) -> None:
    missing = [w for w in words[2:] if w.startswith(SHIPPED) and not (ROOT / w).exists()]
    if "--" in words:
        script = words[words.index("--") + 1:]
        if script[:1] == ["python"] and len(script) > 1 and script[1] != "-c":
            missing += [script[1]] if not (ROOT / script[1]).exists() else []
    assert missing == [], f"{doc}: the repository ships no {', '.join(missing)}"


def _checked_as_before_the_run(doc: DocCommand, name: str, ctx: click.Context) -> None:
    """What the command checks before it starts work, by its own code; files of the user's own
    (not in the repository) stand where a trace is needed only to be named."""
    from emu.errors import EmuError

    try:
        with ctx:
            {"replay": _replay_checked, "sweep": _grid_checked, "predict": _grid_checked,
             "run": _run_checked}.get(name, lambda c: None)(ctx)
    except EmuError as e:
        pytest.fail(f"{doc}: {e}")


def _shipped(path: str | None) -> str | None:
    """The path where the repository ships it, None for a file of the user's own."""
    return path if path is not None and path.startswith(SHIPPED) else None


def _replay_checked(ctx: click.Context) -> None:
    import inspect

    from emu.cli.replay import _base_config, _configs, _refuse_for_several, _worker_counts, replay

    named = set(inspect.signature(replay.callback).parameters)
    params = ctx.params
    params["network"] = _shipped(params["network"])
    flags = {k: v for k, v in params.items() if k not in named}
    counts = _worker_counts(params["workers_arg"], len(params["trace_args"]))
    several = len(params["trace_args"]) > 1
    _refuse_for_several(several, flags, params["payload_file"], params["chrome_trace"])
    _configs(ctx, _base_config(params, sum(counts)), params["fabric"], params["network"], several, None, flags)


def _grid_checked(ctx: click.Context) -> None:
    from emu.cli.sweep import build_grid
    from emu.traces import SAMPLES

    if all(t in SAMPLES or (ROOT / t).exists() for t in ctx.params["traces"]):
        build_grid(ctx, ctx.params, ctx.info_name)


def _run_checked(ctx: click.Context) -> None:
    from emu.cli.options import design_values
    from emu.replay import load_design

    design_values(ctx, ctx.params, "run")
    if _shipped(ctx.params["network"]) is not None:
        load_design(ctx.params["network"])


def test_a_wrong_doc_command_is_caught() -> None:
    """The checks fail where they should: an unknown flag, a bad value, a missing shipped file."""
    bad = [DocCommand("x.md", 1, "emu replay mlp --workerz 8", False),
           DocCommand("x.md", 1, "emu replay mlp --fabric nosuch", False),
           DocCommand("x.md", 1, "emu replay mlp --bandwidth fast", False),
           DocCommand("x.md", 1, "emu replay mlp --network examples/designs/nosuch.toml", False),
           DocCommand("x.md", 1, "emu run --workers 8 -- python train.py", False),
           DocCommand("x.md", 1, "emu sweep mlp --workers 8 --fabric ina --latency 5 --out s", False),
           DocCommand("x.md", 1, "emu replay TRACE --workerz M", False),  # a synopsis's flags
           DocCommand("x.md", 1, "emu replay --nosuch", True)]  # a mention's
    for doc in bad:
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            test_a_doc_command_is_one_emu_takes(doc)


def _figures_module():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "benchmarks" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_quoted_wall_time_is_the_figures_scripts() -> None:
    """A wall time in the docs stands between markers benchmarks/docs_figures.py writes from
    docs/figures.json (its machine, date and commit); every figure it measures is shown somewhere."""
    import json

    figures_module = _figures_module()
    kept = json.loads(figures_module.FIGURES_JSON.read_text())["figures"]
    shown = set()
    for path in DOCS:
        for m in figures_module.MARKER.finditer(path.read_text()):
            name = m.group(1)
            assert name in figures_module.BY_ID, f"{path.name}: marker {name!r} names no figure of docs_figures.py"
            assert name in kept, f"{path.name}: figure {name!r} was never measured (docs/figures.json)"
            assert m.group(2) == figures_module.rendered(kept[name]), (
                f"{path.name}: figure {name!r} reads {m.group(2)!r}; run benchmarks/docs_figures.py --write-docs")
            shown.add(name)
    assert set(figures_module.BY_ID) - shown == set(), "figures no doc shows"
    for name, entry in kept.items():
        assert {"seconds", "date", "commit", "machine", "commands"} <= set(entry), name


def test_the_figures_script_measures_a_figure(tmp_path: Path) -> None:
    """The script itself, on its quickest figure: a real run, timed, written with its machine."""
    import json
    import subprocess
    import sys

    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "docs_figures.py"), "--only", "what-if-predict",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    entry = json.loads(out.read_text())["figures"]["what-if-predict"]
    assert 0 < entry["seconds"] < 120 and "cores" in entry["machine"] and entry["commands"][0].startswith("emu predict")


def _toml_blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


@pytest.mark.parametrize("name, line, block", _toml_blocks(), ids=lambda v: str(v) if isinstance(v, (str, int)) and
                         len(str(v)) < 40 else "toml")
def test_a_doc_design_is_one_emu_loads(tmp_path: Path, name: str, line: int, block: str) -> None:
    """Every design a doc shows loads as a design; one named after a shipped file is that file."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from emu.replay import load_design

    design = tmp_path / "design.toml"
    design.write_text(block)
    load_design(str(design))
    shown = tomllib.loads(block)
    shipped = sorted((ROOT / "examples" / "designs").rglob(f"{shown.get('name', '-')}.toml"))
    if shipped:
        assert tomllib.loads(shipped[0].read_text()) == shown, f"{name}:{line}: differs from {shipped[0].name}"


def test_every_test_the_docs_cite_exists() -> None:
    """docs/reliability.md and the others name the test proving each row: ``tests/x.py::test_y``
    (a test of that file) or a bare ``test_y`` (a test of some file); each must exist."""
    defined = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M):
            defined.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    missing = []
    for path in DOCS:
        text = path.read_text()
        for file, name in re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", text):
            if file not in defined.get(name, set()):
                missing.append(f"{path.name}: {file}::{name}")
        for name in re.findall(r"`(test_\w+)(?:\[[^\]]*\])?`", text):
            if name not in defined:
                missing.append(f"{path.name}: {name}")
        for file in re.findall(r"`(tests/[\w/]+\.py)`", text):
            if not (ROOT / file).exists():
                missing.append(f"{path.name}: {file}")
    assert missing == [], "the docs cite tests that do not exist:\n" + "\n".join(missing)


WALL_TIME = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:s|min|minutes|seconds)\b")
DATE = re.compile(r"20\d\d-\d\d-\d\d")
LOGS = ("design-notes.md", "FIDELITY.md")  # dated logs: each measurement with its run (their headers say so)
# Durations the docs give that are no wall time of a run: settings, emulated times, syntax.
NOT_MEASURED = ("(1800 s)", "after 5 s", "0s:100Gbps", "qsgd 3.9 s", "qsgd 313 ms (1.1 s)", "within 120 s",
                "every 0.5 s", "quiet for 10 s", "for 10 s", "quiet for\n     4 s", "in 5 s", "its 5 s timeout",
                "from 0s", "(2 s + 2L)", "86,400 s")


def test_a_wall_time_in_the_docs_says_when_it_was_measured() -> None:
    """Every wall time in README.md and docs/*.md is a figure of benchmarks/docs_figures.py (a
    marker), or stands in a paragraph (or the two before it, a table's caption) that dates it;
    the logs (design-notes.md, FIDELITY.md) date their runs themselves."""
    undated = []
    for path in DOCS:
        if path.name in LOGS:
            continue
        text = re.sub(r"<!-- fig:.*?<!-- /fig -->", "", path.read_text(), flags=re.S)
        for allowed in NOT_MEASURED:
            text = text.replace(allowed, "")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        paragraphs = re.split(r"\n\s*\n", text)
        for i, para in enumerate(paragraphs):
            if any(DATE.search(p) for p in paragraphs[max(0, i - 2):i + 1]):
                continue
            undated += [f"{path.name}: ...{para[max(0, m.start() - 40):m.end()]}" for m in WALL_TIME.finditer(para)]
    assert undated == [], "wall times with no date (mark them for docs_figures.py, or date them):\n" + "\n".join(undated)


def test_every_marker_is_whole() -> None:
    """A marker the regular expression would skip (unclosed, misspelt, nested) is an error, and
    docs/figures.json keeps no figure the script does not know."""
    import json

    figures_module = _figures_module()
    for path in DOCS:
        text = path.read_text()
        found = figures_module.MARKER.findall(text)
        assert text.count("<!-- fig:") == len(found) == text.count("<!-- /fig -->"), f"{path.name}: a broken marker"
        assert not [t for _, t in found if "<!--" in t], f"{path.name}: a marker inside a marker"
    kept = json.loads(figures_module.FIGURES_JSON.read_text())["figures"]
    assert set(kept) <= set(figures_module.BY_ID), "docs/figures.json keeps figures docs_figures.py does not measure"
