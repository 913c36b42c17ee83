"""The house rules the code keeps (docs/design.md, "Package layout"): short functions, and the
layers above replay using its public names only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EMU = Path(__file__).resolve().parents[1] / "emu"
MAX_FUNCTION_LINES = 80


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(EMU.rglob("*.py"))]


def test_no_function_is_longer_than_80_lines() -> None:
    long = [f"{p.relative_to(EMU.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for p, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], "split these functions:\n" + "\n".join(long)


def test_the_layers_above_replay_use_its_public_names() -> None:
    """emu.run, emu.study, emu.validate and the CLI import ``emu.replay`` itself, never its modules
    (the design keys' table, which the CLI reads to make its options, excepted)."""
    allowed = {"emu.replay", "emu.replay.config.keys"}
    found = []
    for p, tree in _modules():
        layer = p.relative_to(EMU).parts[0]
        if layer not in ("run", "study", "validate", "cli"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("emu.replay"):
                if node.module not in allowed:
                    found.append(f"{p.relative_to(EMU.parent)}:{node.lineno} {node.module}")
    assert found == [], "import these from emu.replay:\n" + "\n".join(found)


def test_nothing_imports_the_cli() -> None:
    """The CLI is the top: only it and ``python -m emu`` (emu/__main__.py) import it."""
    found = [f"{p.relative_to(EMU.parent)}:{node.lineno}" for p, tree in _modules()
             if p.relative_to(EMU).parts[0] not in ("cli", "__main__.py") for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("emu.cli")]
    assert found == []


def test_make_install_rebuilds_a_venv_copied_from_another_folder(tmp_path: Path) -> None:
    """A checkout copied with its .venv ran the other tree's code, and `make install` said "Nothing
    to be done" (issue 37): a .venv whose pip names another folder is removed and built again."""
    import shutil
    import subprocess

    root = Path(__file__).parent.parent
    if shutil.which("make") is None:
        pytest.skip("no make here")
    shutil.copy(root / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pip").write_text("#!/elsewhere/checkout/.venv/bin/python3\n")
    (tmp_path / ".venv" / ".installed").write_text("")
    done = subprocess.run(["make", "-n", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "was built for another folder (#!/elsewhere/checkout/.venv/bin/python3); building it again" in done.stdout
    assert not (tmp_path / ".venv").exists() and "-m venv .venv" in done.stdout
    (bin_dir).mkdir(parents=True)  # a .venv of this very folder is left alone
    (bin_dir / "pip").write_text(f"#!{tmp_path}/.venv/bin/python3\n")
    (tmp_path / ".venv" / ".installed").write_text("")
    done = subprocess.run(["make", "-n", "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "another folder" not in done.stdout and (bin_dir / "pip").exists()
