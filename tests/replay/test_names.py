"""``emu.replay``'s names, imported from their modules when first asked for (its docstring)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import emu.replay


def test_every_exported_name_resolves_to_its_module_s_object() -> None:
    from emu.replay.config.design import apply
    from emu.replay.config.keys import KEYS
    from emu.replay.orchestrator import replay

    for name in emu.replay.__all__:
        assert getattr(emu.replay, name) is not None, name
    assert emu.replay.apply_design is apply and emu.replay.DESIGN_KEYS is KEYS and emu.replay.replay is replay
    assert set(emu.replay.__all__) <= set(dir(emu.replay))


def test_the_three_lists_of_names_agree() -> None:
    """``__all__``, the table ``__getattr__`` reads and the imports type checkers read name the same
    objects from the same modules: one cannot drift from the others unseen."""
    tree = ast.parse(Path(emu.replay.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    static = {(a.asname or a.name): (imp.module, a.name) for imp in block.body if isinstance(imp, ast.ImportFrom)
              for a in imp.names}
    assert static == emu.replay._WHERE
    assert sorted(emu.replay.__all__) == sorted(emu.replay._WHERE)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        emu.replay.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_the_command_line_s_help_does_not_import_the_replay_s_runtime() -> None:
    """Every command's options come from the design keys' table: building them (``emu --help``)
    imports that table, not the switch, the hosts or zmq."""
    runtime = ("zmq", "emu.replay.orchestrator", "emu.replay.host.runtime", "emu.replay.switch.daemon")
    code = f"import sys, emu.cli; print([m for m in {runtime!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
