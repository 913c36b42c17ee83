"""``emu predict``: the analytic estimate of a grid, in milliseconds, without replaying anything."""

from __future__ import annotations

import json
from typing import Any

import click

from emu.cli import cli
from emu.cli.output import err, ms, out, warn_design
from emu.cli.sweep import build_grid, grid_options, split_axes


@cli.command()
@grid_options("predict")
@click.option("--json", "as_json", is_flag=True, help="Print the estimates as JSON on stdout.")
@click.pass_context
def predict(ctx: click.Context, as_json: bool, **params: Any) -> None:
    """The closed-form estimate of TRACE... over a grid (docs/physics.md, "Predictions").

    \b
      emu predict mlp --workers 8,64,512 --fabric ina,ring --bandwidth 25Gbps,100Gbps
    """
    from emu.study.predict import predict as estimate

    pts, traces = build_grid(ctx, params, "predict")
    rows = []
    warned = set()
    for p in pts:
        if (p.config.topology, p.config.workers) not in warned:
            warned.add((p.config.topology, p.config.workers))
            warn_design(p.config)
        e = estimate(traces.get(p.trace), p.config)
        c = p.config
        rows.append({"trace": p.label, "stragglers": " ".join(s.text for s in c.stragglers), "design": p.design, "fabric": c.fabric, "workers": c.workers,
                     "bandwidth_bps": None if c.link.bandwidth_bps == float("inf") else c.link.bandwidth_bps,
                     "latency_us": c.link.latency_us, "loss": c.link.loss,
                     "iteration_us_median": e.iteration_us_median, "iteration_us_p99": e.iteration_us_p99,
                     "compute_us": e.compute_us, "comm_us": e.comm_us, "exposed_comm_us": e.exposed_comm_us,
                     "method": e.method})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    from rich.table import Table

    shown, fixed = split_axes(rows, lambda r, k: r.get(k))
    t = Table(title="analytic estimate, median iteration" + (f" ({', '.join(fixed)})" if fixed else ""))
    for name in shown:
        t.add_column(name, justify="right" if name == "workers" else "left")
    for name in ("ms", "compute ms", "exposed comm ms"):
        t.add_column(name, justify="right")
    for r in rows:
        t.add_row(*[fn(r) for fn in shown.values()], ms(r["iteration_us_median"]), ms(r["compute_us"]),
                  ms(r["exposed_comm_us"]))
    out().print(t)
    err().print("each collective's closed-form time (docs/physics.md, \"Predictions\") on the trace's schedule of "
                "compute, issues and waits; queueing between overlapping collectives, jitter, stragglers' noise and "
                "point-to-point loss beyond one chain's expectation are left out (--json gives each point's method)", markup=False, highlight=False, soft_wrap=True)
