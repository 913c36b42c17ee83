"""The installed ``emu`` command offers every command of docs/design.md's contract."""

from __future__ import annotations

import subprocess
import sys

CONTRACT = ("capture", "inspect", "replay", "run", "sweep", "predict", "check", "validate", "clean")


def test_every_contract_command_is_registered_in_a_fresh_process() -> None:
    # A fresh interpreter: a test that imports a command module itself cannot hide a missing import.
    result = subprocess.run([sys.executable, "-m", "emu", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert set(CONTRACT) <= listed, f"missing: {set(CONTRACT) - listed}"
    # every command's help in one more fresh interpreter (a help runs no command body, so one
    # interpreter sees what one per command would, at a tenth of the start-ups)
    script = ("import sys\nfrom emu.cli import cli\nfor c in sys.argv[1:]:\n    print('=== ' + c)\n"
              "    cli.main([c, '--help'], prog_name='emu', standalone_mode=False)\n")
    sub = subprocess.run([sys.executable, "-c", script, *CONTRACT], capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    for command, text in zip(CONTRACT, sub.stdout.split("=== ")[1:], strict=True):
        assert text.startswith(command) and f"Usage: emu {command}" in text, (command, text[:200])
