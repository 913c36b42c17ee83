"""``emu sweep``: replay a grid of traces and network designs; and the grid options ``emu predict``
shares with it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from emu.cli import cli
from emu.cli.options import design_options
from emu.cli.output import ProgressBar, err, human_bandwidth, ms, out
from emu.errors import ConfigError

if TYPE_CHECKING:
    from emu.study.grid import Point, TraceCache
    from emu.study.sweep import Row


def grid_options(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a grid (emu.study.grid): the design keys' flags (comma lists of fabric,
    bandwidth, latency and loss are axes, ``--network`` repeats), and the options every point shares."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.argument("traces", nargs=-1, required=True, metavar="TRACE..."),
            click.option("--workers", "-w", default="8", show_default=True, help="Worker counts, e.g. 8,64,512."),
            design_options(command, networks_axis=True),
            click.option("--straggler", "stragglers", multiple=True,
                         help="Slow compute (emu replay --straggler); repeat for an axis."),
            click.option("--sparsity", default="trace", show_default=True,
                         help="Payload of float all_reduces for every point (emu replay --sparsity): trace, none, F "
                              "or F:U."),
            click.option("--sparsity-block", type=int, default=None,
                         help="Elements per sparsity block (default: the trace's, else 256)."),
            click.option("--compress", default="none", show_default=True,
                         help="Gradient compressor for every point (emu replay --compress), e.g. topk:0.01."),
            click.option("--compress-speed", type=float, default=1.0, show_default=True,
                         help="Compression runs this many times faster than on the build machine."),
            click.option("--iters", type=int, help="Iterations per point (default: the trace's)."),
            click.option("--seed", type=int, default=0, show_default=True, help="Seed of payload, loss and jitter."),
            click.option("--ps-shards", type=int, help="Parameter-server shards (default: one per worker)."),
            click.option("--payload-scale", default="auto", show_default=True,
                         help="Packets on the emulated wire per packet really sent, or auto (emu replay)."),
            click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds per point."),
        ]
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


AXES = frozenset({"fabric", "link.bandwidth", "link.latency", "link.loss"})  # the keys a comma list spans


def build_grid(ctx: click.Context, params: dict[str, Any], command: str) -> tuple[list[Point], TraceCache]:
    """Every point of the grid the options describe (checked before anything runs), and the traces."""
    from emu.cli.options import auto, design_values, trace_path, typed
    from emu.replay import CompressOption, ReplayConfig, SparsityOption, apply_design
    from emu.study.grid import Grid, TraceCache, float_axis, int_axis, points, text_axis, unique

    traces = unique([str(trace_path(t)) for t in params["traces"]])
    values, given = design_values(ctx, params, command, skip=AXES)
    base = apply_design(ReplayConfig(iters=params["iters"], seed=params["seed"], ps_shards=params["ps_shards"],
                                     payload_scale=auto(params["payload_scale"], int, "--payload-scale"),
                                     timeout_s=params["timeout"],
                                     sparsity=SparsityOption.parse(params["sparsity"], params["sparsity_block"]),
                                     compress=CompressOption(params["compress"], params["compress_speed"])), values)
    given |= {key for key, name in (("fabric", "fabric"), ("link.bandwidth", "bandwidth"), ("link.latency", "latency"),
                                    ("link.loss", "loss")) if typed(ctx, name)}
    networks = tuple(params["networks"])
    # Without a design file an untyped axis takes its flag's default; with one, the file's value.
    def axis(name: str, parse, text: str) -> tuple:
        return parse(text, f"--{name}") if typed(ctx, name) or not networks else (None,)

    workers = int_axis(params["workers"], "--workers")
    if base.mesh is not None:  # the layout sets the workers; a typed count must agree
        if typed(ctx, "workers") and workers != (base.mesh.size,):
            raise ConfigError(f"--mesh {base.mesh.text()} is {base.mesh.size} workers but --workers is "
                              f"{params['workers']}: give one, or the same count")
        workers = (base.mesh.size,)
    grid = Grid(traces=traces, workers=workers, fabrics=axis("fabric", text_axis, params["fabric"]),
                bandwidths=axis("bandwidth", text_axis, params["bandwidth"]),
                latencies=axis("latency", text_axis, params["latency"]),
                losses=axis("loss", float_axis, params["loss"]),
                networks=unique(list(networks)) or (None,), stragglers=unique(list(params["stragglers"])) or (None,),
                base=base, given=frozenset(given))
    cache = TraceCache()
    return points(grid, cache), cache


@cli.command()
@grid_options("sweep")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder of the study: one report per point, results.csv, results.json, plots/. "
                   "Run again to resume.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--no-predict", is_flag=True, help="Skip the analytic estimate beside each point.")
@click.pass_context
def sweep(ctx: click.Context, out_dir: Path, no_plots: bool, no_predict: bool, **params: Any) -> None:
    """Replay TRACE... over a grid: every comma list is an axis.

    \b
      emu sweep mlp --workers 8,64 --fabric ina,ring --bandwidth 10Gbps --out study
      emu sweep mlp transformer --network a.toml --network b.toml --workers 8,64 --out study
    """
    from emu.files import check_writable
    from emu.study.sweep import Status, run_sweep

    pts, traces = build_grid(ctx, params, "sweep")
    check_writable(out_dir / "results.json", "--out")
    err().print(f"sweep: {len(pts)} points into {out_dir}", markup=False, highlight=False)

    def done(i: int, point, row) -> None:
        what = {Status.REPLAYED: f"{ms(row.iteration_us_median)} ms", Status.FAILED: f"FAILED ({row.reason})",
                Status.ESTIMATE: f"{ms(row.iteration_us_median)} ms (analytic estimate)"}[row.status]
        resumed = " (resumed)" if row.status == Status.REPLAYED and row.attempts == 0 else ""
        err().print(f"[{i + 1}/{len(pts)}] {point.slug}: {what}{resumed}", markup=False, highlight=False,
                    soft_wrap=True)

    with ProgressBar(f"sweep ({len(pts)} points)") as bar:
        result = run_sweep(pts, out_dir, traces, with_prediction=not no_predict, on_point=done,
                           on_start=lambda i, p: bar.status(f"{i + 1}/{len(pts)} {p.slug}"),
                           on_progress=bar.update,
                           on_note=lambda text: err().print(f"note: {text}", markup=False, highlight=False,
                                                            soft_wrap=True), plots=not no_plots)
    rows = list(result.rows)
    _table(rows)
    for line in _speedups(rows):
        out().print(line, markup=False, highlight=False, soft_wrap=True)
    failed = [r for r in rows if r.status == Status.FAILED or r.verification_ok is False]
    failing = (f"{len(failed)} of {len(rows)} points failed or did not verify: see results.csv and the logs in "
               "points/ (run again to retry them)") if failed else None
    if result.plots_error is not None:
        from emu.errors import RunFailed

        if failing:
            err().print(f"emu: {failing}", markup=False, highlight=False, soft_wrap=True)
        raise RunFailed(f"the tables were written; the plots were not: {result.plots_error}")
    if not no_plots:
        err().print(f"wrote {out_dir / 'results.csv'}, {out_dir / 'results.json'} and {len(result.plots)} plots "
                    f"in {out_dir / 'plots'}", markup=False, highlight=False, soft_wrap=True)
    if failing:
        from emu.errors import CheckFailed

        raise CheckFailed(failing)


def split_axes(rows: list[Any], get: Callable[[Any, str], Any]) -> tuple[dict[str, Callable[[Any], str]], list[str]]:
    """The axes that vary between rows (columns: name -> cell function) and, as "name value" texts,
    those that do not (for the title). ``get(row, axis)`` reads an axis of a row."""
    axes = {"trace": lambda r: get(r, "trace"), "design": lambda r: get(r, "design") or "-",
            "fabric": lambda r: get(r, "fabric"), "workers": lambda r: str(get(r, "workers")),
            "bandwidth": lambda r: human_bandwidth(get(r, "bandwidth_bps")),
            "latency": lambda r: f"{get(r, 'latency_us'):g} us", "loss": lambda r: f"{get(r, 'loss'):g}",
            "stragglers": lambda r: get(r, "stragglers") or "-"}
    shown = {k: fn for k, fn in axes.items() if k in ("fabric", "workers") or len({fn(r) for r in rows}) > 1}
    fixed = [f"{k} {fn(rows[0])}" for k, fn in axes.items() if k not in shown and fn(rows[0]) != "-"] if rows else []
    return shown, fixed


def _table(rows: list[Row]) -> None:
    from rich.table import Table

    from emu.study.sweep import Status

    shown, fixed = split_axes(rows, getattr)
    t = Table(title="sweep: median iteration" + (f" ({', '.join(fixed)})" if fixed else ""))
    for name in shown:
        t.add_column(name, justify="right" if name == "workers" else "left")
    ref = next((r.speedup_over for r in rows if r.speedup_over), None)
    for name in ("ms", "predicted", "error", f"vs {ref}" if ref else "speedup", "efficiency", "source"):
        t.add_column(name, justify="left" if name == "source" else "right")
    for r in rows:
        t.add_row(*[fn(r) for fn in shown.values()],
                  ms(r.iteration_us_median), "-" if r.status == Status.ESTIMATE else ms(r.predicted_us),
                  "-" if r.predict_error is None else f"{100 * r.predict_error:+.1f}%",
                  "-" if r.speedup is None else f"{r.speedup:.2f}x" + (" (est.)" if r.speedup_estimated else ""),
                  "-" if r.scaling_efficiency is None else f"{100 * r.scaling_efficiency:.0f}%",
                  {Status.REPLAYED: "replay" if r.verification_ok else "replay, VERIFICATION FAILED",
                   Status.ESTIMATE: "estimate", Status.FAILED: "FAILED"}[r.status])
    out().print(t)


def _speedups(rows: list[Row]) -> list[str]:
    """One line per fabric (or design) and setting: how much faster it is than the reference, by
    workers; the setting names every axis that varies in the study besides fabric and workers."""
    shown, _ = split_axes(rows, getattr)
    setting = [fn for name, fn in shown.items() if name not in ("trace", "fabric", "workers", "design")]
    lines: dict[tuple, list[str]] = {}
    for r in rows:
        if r.speedup is None or r.fabric == r.speedup_over:
            continue
        where = (r.trace, r.design or r.fabric, r.speedup_over, *(fn(r) for fn in setting))
        est = " (against an analytic estimate)" if r.speedup_estimated else ""
        lines.setdefault(where, []).append(f"{r.speedup:.2f}x at {r.workers} workers{est}")
    return [f"{trace}: {name} over {ref}" + (f" ({', '.join(rest)})" if rest else "") + f": {', '.join(parts)}"
            for (trace, name, ref, *rest), parts in lines.items()]
