"""The ``emu`` command line: a thin click layer over the library.

One module per command; this one holds the group and turns an ``EmuError`` into
one line on stderr and its exit code (2 bad input, 1 failed check, 130
interrupted). ``--debug`` (or ``EMU_DEBUG=1``) shows the traceback instead.
Commands import their heavy dependencies inside the function so that
``emu --help`` is instant.
"""

from __future__ import annotations

import os
from typing import Any

import click

from emu import __version__
from emu.errors import EmuError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        from emu.cli.output import err

        try:
            return super().invoke(ctx)
        except EmuError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            err().print(f"emu: error: {exc}", markup=False, highlight=False, soft_wrap=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            err().print("emu: interrupted", markup=False, highlight=False)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="EMU_DEBUG", help="Show tracebacks of errors.")
@click.version_option(__version__, prog_name="emu")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Emulate data-parallel training networks on one machine."""
    ctx.obj = {"debug": debug or os.environ.get("EMU_DEBUG") == "1"}


from emu.cli import capture as _capture  # noqa: E402,F401  (commands register themselves)
from emu.cli import inspect as _inspect  # noqa: E402,F401
from emu.cli import replay as _replay  # noqa: E402,F401
from emu.cli import validate as _validate  # noqa: E402,F401


def main() -> None:
    cli(prog_name="emu")
