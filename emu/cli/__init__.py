"""The ``emu`` command line: a thin click layer over the library.

One module per command; this one holds the group and turns an ``EmuError`` into
one line on stderr and its exit code (2 bad input, 1 a run that failed or a
negative check, 130 interrupted, 143 terminated); click's usage errors become one line too. ``--debug`` (or ``EMU_DEBUG=1``) shows the traceback instead.
Commands import their heavy dependencies inside the function, and ``emu.replay`` imports the
name asked for only, so that ``emu --help`` does not import the replay's runtime (0.21 s on the
build machine, was 0.41 s).
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
        from emu.lifetime import Terminated, recorded, terminate_as_interrupt

        def line(text: str) -> None:
            err().print(f"emu: {text}", markup=False, highlight=False, soft_wrap=True)

        try:
            # a record of what this run starts, for `emu clean` after a SIGKILL
            words = [*getattr(ctx, "_protected_args", []), *ctx.args]
            name = " ".join(["emu", *[w for w in words if not w.startswith("-")][:1]])
            with terminate_as_interrupt(), recorded(name):
                return super().invoke(ctx)
        except EmuError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            line(f"error: {exc}")
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            line("interrupted")
            ctx.exit(130)
        except Terminated:
            line("terminated")
            ctx.exit(143)

    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:  # type: ignore[override]
        """click's main without its usage block: a bad option is one line and exit code 2."""
        import sys

        standalone = extra.pop("standalone_mode", True)
        try:
            rv = super().main(args=_debug_first(sys.argv[1:] if args is None else list(args)), prog_name=prog_name,
                              standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (emu {exc.ctx.command_path.split(' ', 1)[1]} --help)" if exc.ctx and " " in exc.ctx.command_path \
                else " (emu --help)"
            click.echo(f"emu: error: {exc.format_message()}{hint}", err=True)
            rv = exc.exit_code
        except click.ClickException as exc:
            click.echo(f"emu: error: {exc.format_message()}", err=True)
            rv = exc.exit_code
        except click.exceptions.Abort:
            click.echo("emu: interrupted", err=True)
            rv = 130
        if not standalone:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _debug_first(args: list[str]) -> list[str]:
    """``--debug`` wherever a user types it among emu's own options (``emu replay x --debug``),
    moved to where the group's option is read (``emu --debug replay x``). Not past ``--``, not as
    the value of an option that takes one, and not past the first word of a command that hands the
    rest to a script (``emu capture -o t.json python train.py --debug``: the script's)."""
    sub = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    command = cli.commands.get(args[sub]) if sub is not None else None
    if command is None:
        return args
    takes_value = {name for p in command.params if isinstance(p, click.Option) and not p.is_flag
                   for name in (*p.opts, *p.secondary_opts)}
    hands_on = any(isinstance(p, click.Argument) and p.nargs == -1 and isinstance(p.type, click.types.UnprocessedParamType)
                   for p in command.params)
    kept, hoist, i = args[:sub + 1], False, sub + 1
    while i < len(args):
        a = args[i]
        if a == "--" or (hands_on and not a.startswith("-")):
            kept += args[i:]
            break
        if a == "--debug":
            hoist = True
        else:
            kept.append(a)
            if a in takes_value and i + 1 < len(args):
                kept.append(args[i + 1])
                i += 1
        i += 1
    return ["--debug", *kept] if hoist else args


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="EMU_DEBUG", help="Show tracebacks of errors.")
@click.version_option(__version__, prog_name="emu")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Emulate data-parallel training networks on one machine."""
    ctx.obj = {"debug": debug or os.environ.get("EMU_DEBUG") == "1"}


from emu.cli import capture as _capture  # noqa: E402,F401  (commands register themselves)
from emu.cli import check as _check  # noqa: E402,F401
from emu.cli import clean as _clean  # noqa: E402,F401
from emu.cli import export as _export  # noqa: E402,F401
from emu.cli import inspect as _inspect  # noqa: E402,F401
from emu.cli import predict as _predict  # noqa: E402,F401
from emu.cli import replay as _replay  # noqa: E402,F401
from emu.cli import run as _run  # noqa: E402,F401
from emu.cli import sweep as _sweep  # noqa: E402,F401
from emu.cli import validate as _validate  # noqa: E402,F401


def main() -> None:
    cli(prog_name="emu")
