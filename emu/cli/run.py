"""``emu run``: real ranks of an unmodified script inside a job of M workers (docs/run.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from emu.cli import cli
from emu.cli.options import auto, design_options, network_config
from emu.cli.output import ProgressBar, err
from emu.errors import CheckFailed, ConfigError

if TYPE_CHECKING:
    from emu.run.protocol import Checked


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--workers", "-w", type=int, required=True, help="Workers of the job (M): the real ranks and the rest.")
@click.option("--real", type=int, default=1, show_default=True,
              help="Real ranks of the script (K, at most the cores; M must be a multiple).")
@click.option("--iters", type=int, help="Iterations to replay (default: those recorded after the warm-up).")
@click.option("--warmup", type=int, default=2, show_default=True,
              help="Optimizer steps not recorded first (DDP builds, then rebuilds, its buckets).")
@click.option("--compute-clock", type=click.Choice(["thread", "wall"]), default="thread", show_default=True,
              help="How a real rank's compute is measured: its thread's CPU time, or wall time.")
@click.option("--straggler", "stragglers", multiple=True,
              help="Slow compute in the replay: WORKERS:FACTOR (3,7:1.5), random:FRACTION:FACTOR, lognormal:SIGMA.")
@click.option("--payload-scale", default="auto", show_default=True,
              help="Packets on the emulated wire per packet really sent, or auto.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of payload, loss and jitter.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Seconds the script may run.")
@click.option("--trace-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the real ranks' program as an emu trace, to replay later without the script.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON report here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@design_options("run")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, workers: int, real: int, network: str | None, iters: int | None, warmup: int,
        compute_clock: str, stragglers: tuple[str, ...], payload_scale: str, seed: int, timeout: float,
        trace_out: Path | None, report_path: Path | None, as_json: bool, args: tuple[str, ...], **flags: Any) -> None:
    """Run K real ranks of a script inside a job of M workers; the rest is emulated.

    \b
      emu run --workers 64 -- python examples/ddp_train.py --steps 8
      emu run --workers 8 --real 2 --fabric ring --bandwidth 10Gbps -- python train.py
    """
    import json

    from emu.files import check_writable
    from emu.replay import ReplayConfig, Straggler
    from emu.run.session import RunConfig, run_job

    argv = list(args[1:] if args[:1] == ("--",) else args)
    if not argv:
        raise ConfigError("give the training command after --, e.g. 'emu run --workers 8 -- python train.py'")
    for path, option in ((trace_out, "--trace-out"), (report_path, "--report")):
        if path is not None:
            check_writable(path, option)
    base = ReplayConfig(workers=workers, iters=iters, seed=seed, timeout_s=timeout,
                        payload_scale=auto(payload_scale, int, "--payload-scale"),
                        stragglers=tuple(Straggler.parse(x) for x in stragglers))
    config = network_config(ctx, flags, "run", base, network)
    run_config = RunConfig(replay=config, real=real, clock=compute_clock, warmup=warmup, timeout_s=timeout)
    with ProgressBar(f"run {real} of {workers}") as bar:
        result = run_job(argv, run_config, cores=os.cpu_count() or 1, on_status=bar.status, on_progress=bar.update,
                         trace_out=trace_out)
    report = result.report
    if trace_out is not None:
        err().print(f"wrote {trace_out}", markup=False, highlight=False)
    if result.payload_out is not None:
        err().print(f"wrote {result.payload_out} (the real ranks' tensors: emu replay {trace_out} --payload "
                    f"{result.payload_out})", markup=False, highlight=False, soft_wrap=True)
    if report_path is not None:
        report.save(report_path)
        err().print(f"wrote {report_path}", markup=False, highlight=False)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from emu.cli.replay import _table

        words = argv[1:] if len(argv) > 1 and not argv[0].endswith(".py") else argv
        _table([report], Path(words[1] if words[0] == "-m" and len(words) > 1 else words[0]))
        err().print(_checked_line(result.checked), markup=False, highlight=False, soft_wrap=True)
    failed = [*(["the fabric's results did not match their sums"] if not report.verification.ok else []),
              *([f"{result.checked.mismatches} of the real ranks' results did not match what the real ranks "
                 "contributed"] if result.checked.mismatches else [])]
    if failed:
        raise CheckFailed(f"verification failed: {'; '.join(failed)}")


def _checked_line(checked: Checked) -> str:
    """What the real ranks checked of their results (``emu.run.protocol.Checked``), in one line."""
    from emu.run.protocol import UNCHECKED

    line = (f"real ranks' results checked in their own processes: {checked.results:,} ({checked.elements:,} "
            f"elements), {checked.mismatches} mismatched")
    if checked.unchecked:
        line += "; not checked: " + ", ".join(f"{n:,} ({UNCHECKED[why]})" for why, n in checked.unchecked)
    return line
