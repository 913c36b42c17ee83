"""``emu export``: an emu trace in another tool's format (MLCommons Chakra)."""

from __future__ import annotations

from pathlib import Path

import click

from emu.cli import cli
from emu.cli.output import err
from emu.errors import ConfigError


@cli.command()
@click.argument("trace_path", metavar="TRACE")
@click.option("--chakra", "chakra", type=click.Path(path_type=Path), required=True,
              help="The folder to write one Chakra execution trace per rank into (<name>.<rank>.et), readable by "
                   "Chakra's tools and ASTRA-sim (docs/trace-format.md, 'Chakra').")
@click.option("--workers", type=int, default=None,
              help="Lay the job out at this many workers first, as emu replay would, and write one file per "
                   "worker  [default: the trace's ranks]")
@click.option("--mesh", default=None, help="The layout at --workers, e.g. dp=8,tp=2 (docs/parallelism.md).")
@click.option("--name", default=None, help="The files' name before .<rank>.et  [default: the trace's model]")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of a mixture of experts' routing laid out anew (docs/moe.md).")
def export(trace_path: str, chakra: Path, workers: int | None, mesh: str | None, name: str | None, seed: int) -> None:
    """Write a trace as MLCommons Chakra execution traces, one file per rank.

    \b
      emu export mlp --chakra out/
      emu export tp --chakra out/ --workers 16 --mesh dp=8,tp=2
    """
    from emu.cli.options import trace_path as resolve
    from emu.replay import laid_out, parse_mesh
    from emu.traces import load_trace
    from emu.traces.chakra.write import check_folder, safe_name, write_chakra

    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: give 1 or more")
    if mesh is not None and workers is None:
        raise ConfigError("--mesh lays the job out at --workers: give --workers too")
    check_folder(chakra)
    path = resolve(trace_path)
    trace = load_trace(path)
    if workers is not None:
        trace = laid_out(trace, workers, parse_mesh(mesh) if mesh else None, str(path), seed)
    files = write_chakra(trace, chakra, name or safe_name(trace.meta.model or "trace"))
    err().print(f"wrote {len(files)} Chakra traces to {chakra} ({files[0].name} .. {files[-1].name})",
                markup=False, highlight=False, soft_wrap=True)
