"""``python -m emu``: the same as the ``emu`` command."""

from emu.cli import main

main()
