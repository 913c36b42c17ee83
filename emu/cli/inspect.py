"""``emu inspect``: what a trace holds, as a table or as JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from emu.cli import cli
from emu.cli.output import human_bytes, ms, out
from emu.traces.summary import SparsityStats


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def sparsity_line(sp: SparsityStats) -> str:
    """E.g. '9.3% of 256-element blocks non-zero per rank, 16.0% on some rank (median of 10
    all_reduces; bytes-weighted 9.3%, 16.0%)'."""
    blocks = "blocks" if sp.block_elements is None else f"{sp.block_elements}-element blocks"
    of = (f"{sp.all_reduces} all_reduces" if sp.all_reduces == sp.all_reduces_total
          else f"the {sp.all_reduces} of {sp.all_reduces_total} all_reduces measured")
    tensors = f"; {sp.sparse_tensors} of sparse tensors, a row a block" if sp.sparse_tensors else ""
    return (f"{_pct(sp.nonzero_median)} of {blocks} non-zero per rank, {_pct(sp.union_median)} on some rank "
            f"(median of {of}; bytes-weighted {_pct(sp.nonzero_weighted)}, {_pct(sp.union_weighted)}{tensors})")


def noise_line(s) -> str:
    """The steps' spread, and the machine's load where the capture measured it."""
    text = (f"steps vary {s.step_cv:.1%}, their compute {s.compute_cv:.1%}, the ranks' compute {s.rank_cv:.1%} "
            "from each other (std over mean)")
    if s.noise is not None and s.noise.other_cores is not None:
        text += f"; other processes used {s.noise.other_cores:.2f} cores during them"
        if s.noise.steal:
            text += f", the hypervisor {s.noise.steal:.0%}"
    if s.noise is not None and s.noise.unprofiled_step_us:
        text += (f"; {s.noise.unprofiled_steps} steps past the window without the profiler: median "
                 f"{s.noise.unprofiled_step_us / 1e3:.1f} ms")
        if s.profiler_overhead is not None:
            text += f", the profiled ones {s.profiler_overhead:+.1%}"
    return text


def imbalance_line(per_step: tuple[float, ...]) -> str:
    """E.g. '1.33x the mean at most (per step: 1.20, 1.33)': the largest all_to_all split over the mean."""
    steps = ", ".join(f"{x:.2f}" for x in per_step[:12]) + (", ..." if len(per_step) > 12 else "")
    return f"largest split {max(per_step):.2f}x the mean (per step: {steps}; 1.00: even)"


@cli.command()
@click.argument("trace_path", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def inspect(trace_path: Path, as_json: bool) -> None:
    """Summarize a trace: ranks, iterations, step and compute time, collectives, overlap, and the
    gradients' block sparsity where the capture measured it."""
    from rich.table import Table

    from emu.cli.options import trace_path as resolve
    from emu.traces import load_trace, summarize

    trace_path = resolve(str(trace_path))  # a shipped sample's name works too, as in replay
    s = summarize(load_trace(trace_path))
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(s), indent=2))
        return
    console = out()
    head = Table(title=f"{trace_path}", show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    pct = "-" if s.overlap_pct is None else f"{s.overlap_pct:.0f}%"
    for key, value in (
        ("model", s.model or "-"), ("source", f"{s.source} ({s.backend}, {s.device})"),
        ("ranks", f"{len(s.ranks_in_file)} in file of world size {s.world_size}"),
        ("iterations", str(s.iterations)),
        ("parameters", "-" if s.params is None else f"{s.params:,}"),
        ("batch size", "-" if s.batch_size is None else str(s.batch_size)),
        *((("mesh", s.mesh),) if s.mesh is not None else ()),
        *((("experts", f"{s.experts} ({s.params_per_expert:,} parameters each)"),) if s.experts is not None else ()),
        ("step (median)", f"{ms(s.step_us_median)} ms (min {ms(s.step_us_min)}, max {ms(s.step_us_max)})"),
        ("compute (median)", f"{ms(s.compute_us_median)} ms"),
        ("communication (median)", f"{ms(s.comm_us_median)} ms"),
        ("exposed communication", f"{ms(s.exposed_comm_us_median)} ms"),
        ("overlap with compute", pct),
    ):
        head.add_row(key, value)
    if s.sparsity is not None:
        head.add_row("gradient sparsity", sparsity_line(s.sparsity))
    if s.all_to_all_imbalance:
        head.add_row("all_to_all imbalance", imbalance_line(s.all_to_all_imbalance))
    head.add_row("step spread", noise_line(s))
    for line in s.noise.busy if s.noise is not None else ():
        head.add_row("noise", line)
    for gap in s.gaps:  # what the source lacked: never filled in silently
        head.add_row("gap", gap)
    console.print(head)
    colls = Table(title="collectives per iteration (rank 0 of the file)")
    roles = any(c.role is not None for c in s.collectives)  # a sharded or split job's: by its groups' roles
    for name in ("kind", *(("group",) if roles else ()), "dtype", "count", "elements", "bytes"):
        colls.add_column(name, justify="left" if name in ("kind", "group", "dtype") else "right")
    for c in s.collectives:
        colls.add_row(c.kind, *((c.role or "-",) if roles else ()), c.dtype, str(c.per_iteration),
                      f"{c.elements_per_iteration:,}", human_bytes(c.bytes_per_iteration))
    console.print(colls)
