"""The output the docs show, run again (issue 37's slow tier): every code block whose lines begin
with a shell prompt (``$ emu ...`` followed by what it printed) is run as written in a fresh
folder, and every line the doc shows must be among what the command prints now, with the same
numbers: the emulated ones are exact on any machine, so a doc that quotes them stays true or
this fails. A ``$ echo $?`` line checks the exit code. Where a block needs files a command before
it made (docs/ci.md's reports), that command's block runs first (``SETUP``). Wall times are never
in these blocks: benchmarks/docs_figures.py keeps those (tests/test_docs.py). The tables a
benchmark wrote (docs/topology.md's, docs/compression.md's, ...) are that benchmark's output, named
with its command beside each; rerunning the benchmark reproduces them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_docs import DOCS, ROOT

NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
BOX = re.compile(r"[│┃┏┓┗┛┡┩└┘┳┻╇━─┼╋┯┷┠┨├┤\s]+")
# a block's setup: the first line of the doc's block that makes its inputs, run before it
SETUP = {("docs/ci.md", "emu check current --baseline baseline"): "for trace in mlp transformer; do"}


@dataclass(frozen=True)
class Shown:
    """One ``$ command`` of a doc and the lines it printed there."""

    file: str
    line: int
    command: str
    printed: tuple[str, ...]
    exit_code: int | None  # a following ``$ echo $?``

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.command}"


def shown_outputs() -> list[Shown]:
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        name = str(path.relative_to(ROOT))
        for i, line in enumerate(lines):
            if line.startswith("$ emu "):
                printed, j = [], i + 1
                while j < len(lines) and not lines[j].startswith(("$ ", "```")):
                    printed.append(lines[j])
                    j += 1
                code = int(lines[j + 1]) if lines[j].startswith("$ echo $?") else None
                found.append(Shown(name, i + 1, line[2:], tuple(printed), code))
    return found


def _key(line: str) -> str:
    """A printed line without its numbers, table borders and padding: what pairs a doc's line with
    the command's."""
    return BOX.sub(" ", NUMBER.sub("#", line)).strip()


def _setup(shown: Shown, cwd: Path, env: dict) -> None:
    first = next((v for (f, c), v in SETUP.items() if f == shown.file and shown.command.startswith(c)), None)
    if first is None:
        return
    text = (ROOT / shown.file).read_text()
    block = text[text.index(first):]
    block = block[:block.index("```")]
    block = block.split(shown.command)[0]  # the commands before the one the doc shows
    done = subprocess.run(["bash", "-e", "-c", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{shown}: its setup failed:\n{done.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("shown", shown_outputs(), ids=lambda s: f"{s.file}:{s.line}")
def test_a_shown_output_is_what_the_command_prints(tmp_path: Path, shown: Shown) -> None:
    for folder in ("examples",):  # the doc's paths are the repository's
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "250",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    _setup(shown, tmp_path, env)
    done = subprocess.run(shlex.split(shown.command), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    if shown.exit_code is not None:
        assert done.returncode == shown.exit_code, f"{shown}: exit {done.returncode}\n{done.stderr[-2000:]}"
    printed = {}
    for line in (done.stdout + done.stderr).splitlines():
        printed.setdefault(_key(line), []).append(line)
    for line in shown.printed:
        if not re.search(r"\w", line):
            continue  # a border
        candidates = printed.get(_key(line))
        assert candidates, f"{shown}: prints no line like\n  {line}\nit printed:\n{done.stdout}{done.stderr}"
        assert any(NUMBER.findall(c) == NUMBER.findall(line) for c in candidates), (
            f"{shown}: the doc shows\n  {line}\nthe command prints\n  " + "\n  ".join(candidates))


def test_the_docs_show_outputs() -> None:
    """What the slow tier runs: the shown outputs of docs/moe.md, docs/ci.md and docs/what-if.md."""
    files = {s.file for s in shown_outputs()}
    assert {"docs/moe.md", "docs/ci.md", "docs/what-if.md"} <= files
    assert all(s.printed for s in shown_outputs())
