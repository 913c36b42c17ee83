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
from emu.run.protocol import ComputeClock

if TYPE_CHECKING:
    from emu.run.protocol import Checked
    from emu.run.training import TrainingReport


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--workers", "-w", type=int, required=True, help="Workers of the job (M): the real ranks and the rest.")
@click.option("--real", type=int, default=1, show_default=True,
              help="Real ranks of the script (K, at most the cores; M must be a multiple).")
@click.option("--iters", type=int, help="Iterations to replay (default: those recorded after the warm-up).")
@click.option("--warmup", type=int, default=2, show_default=True,
              help="Optimizer steps not recorded first (DDP builds, then rebuilds, its buckets).")
@click.option("--compute-clock", type=click.Choice([c.value for c in ComputeClock]), default=ComputeClock.THREAD.value,
              show_default=True,
              help="How a real rank's compute is measured: its thread's CPU time, or wall time.")
@click.option("--straggler", "stragglers", multiple=True,
              help="Slow compute in the replay: WORKERS:FACTOR (3,7:1.5), random:FRACTION:FACTOR, lognormal:SIGMA.")
@click.option("--payload-scale", default="auto", show_default=True,
              help="Packets on the emulated wire per packet really sent, or auto.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of payload, loss and jitter.")
@click.option("--compress", default="none", show_default=True,
              help="Compress the real ranks' gradients for real (docs/compression.md): topk[:R], fp16, qsgd[:S], ...; "
                   "the script also runs uncompressed for the loss beside it.")
@click.option("--compress-speed", type=float, default=1.0, show_default=True,
              help="The device compresses and decompresses this many times faster than the real ranks measured.")
@click.option("--no-baseline", is_flag=True, help="With --compress: skip the uncompressed run.")
@click.option("--target-loss", type=float,
              help="The loss whose emulated time to reach is reported (default: the uncompressed run's last).")
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
        compute_clock: str, stragglers: tuple[str, ...], payload_scale: str, seed: int, compress: str,
        compress_speed: float, no_baseline: bool, target_loss: float | None, timeout: float, trace_out: Path | None,
        report_path: Path | None, as_json: bool, args: tuple[str, ...], **flags: Any) -> None:
    """Run K real ranks of a script inside a job of M workers; the rest is emulated.

    \b
      emu run --workers 64 -- python examples/ddp_train.py --steps 8
      emu run --workers 8 --real 2 --fabric ring --bandwidth 10Gbps -- python train.py
      emu run --workers 8 --compress topk:0.01 -- python examples/ddp_learn.py
    """
    import json

    from emu.files import check_writable, write_atomic
    from emu.replay import ReplayConfig, Straggler
    from emu.run.session import RunConfig, train_and_compare

    argv = list(args[1:] if args[:1] == ("--",) else args)
    if not argv:
        raise ConfigError("give the training command after --, e.g. 'emu run --workers 8 -- python train.py'")
    _check_training_options(compress, compress_speed, no_baseline, target_loss)
    for path, option in ((trace_out, "--trace-out"), (report_path, "--report")):
        if path is not None:
            check_writable(path, option)
    base = ReplayConfig(workers=workers, iters=iters, seed=seed, timeout_s=timeout,
                        payload_scale=auto(payload_scale, int, "--payload-scale"),
                        stragglers=tuple(Straggler.parse(x) for x in stragglers))
    config = network_config(ctx, flags, "run", base, network)
    run_config = RunConfig(replay=config, real=real, clock=ComputeClock(compute_clock), warmup=warmup, timeout_s=timeout,
                           compress=compress, compress_speed=compress_speed)
    with ProgressBar(f"run {real} of {workers}") as bar:
        result, baseline, training = train_and_compare(
            argv, run_config, cores=os.cpu_count() or 1, baseline=not no_baseline, target_loss=target_loss,
            on_status=bar.status, on_progress=bar.update, trace_out=trace_out)
    report = result.report
    doc = report.to_dict() if training is None else {**report.to_dict(), "training": training.to_dict()}
    if training is None and target_loss is not None:
        err().print("the script reported no loss (emu.run.report_loss): --target-loss has nothing to reach",
                    markup=False, highlight=False, soft_wrap=True)
    if trace_out is not None:
        err().print(f"wrote {trace_out}", markup=False, highlight=False)
    if result.payload_out is not None:
        err().print(f"wrote {result.payload_out} (the real ranks' tensors: emu replay {trace_out} --payload "
                    f"{result.payload_out})", markup=False, highlight=False, soft_wrap=True)
    if report_path is not None:
        write_atomic(report_path, json.dumps(doc, indent=2) + "\n", "the report")
        err().print(f"wrote {report_path}", markup=False, highlight=False)
    results = [result, *([baseline] if baseline is not None else [])]
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        from emu.cli.replay import _table

        words = argv[1:] if len(argv) > 1 and not argv[0].endswith(".py") else argv
        name = Path(words[1] if words[0] == "-m" and len(words) > 1 else words[0])
        _table([r.report for r in results], name, None if baseline is None else [r.compress for r in results])
        if training is not None:
            _training(training)
        for r in results:
            err().print(_checked_line(r.checked), markup=False, highlight=False, soft_wrap=True)
    failed = [f"{r.compress}: {why}" if baseline is not None else why for r in results for why in (
        *(["the fabric's results did not match their sums"] if not r.report.verification.ok else []),
        *([f"{r.checked.mismatches} of the real ranks' results did not match what the real ranks contributed"]
          if r.checked.mismatches else []))]
    if failed:
        raise CheckFailed(f"verification failed: {'; '.join(failed)}")


ROWS = 12  # loss points printed at most, besides the last and the target's


def _check_training_options(compress: str, speed: float, no_baseline: bool, target_loss: float | None) -> None:
    import math

    from emu.run.compress import live_compressor

    plain = live_compressor(compress).name == "none"
    for given, option in ((speed != 1.0, "--compress-speed"), (no_baseline, "--no-baseline")):
        if given and plain:
            raise ConfigError(f"{option} applies to --compress, which is none: give --compress NAME, e.g. topk:0.01")
    if target_loss is not None and not math.isfinite(target_loss):
        raise ConfigError(f"--target-loss must be a finite number, got {target_loss}")


def _training(training: TrainingReport) -> None:
    """The loss curves beside each other, and when each reached the target."""
    from rich.table import Table

    from emu.cli.output import out

    t = Table(title="the script's loss (emu.run.report_loss) against emulated time")
    t.add_column("steps", justify="right")
    for c in training.curves:
        t.add_column(f"{c.compressor}: time", justify="right")
        t.add_column(f"{c.compressor}: loss", justify="right")
    steps = sorted({p.steps for c in training.curves for p in c.points})
    if len(steps) > ROWS:  # every n-th, the last, and where each run reached the target (the JSON has all)
        hits = {h.steps for c in training.curves if training.target_loss is not None
                for h in [c.reached(training.target_loss)] if h is not None}
        steps = sorted({*steps[::-(-len(steps) // ROWS)], steps[-1], *hits})
    by = [{p.steps: p for p in c.points} for c in training.curves]
    for s in steps:
        cells = [(f"{by[i][s].emulated_us / 1000:,.1f} ms", f"{by[i][s].loss:.4f}") if s in by[i] else ("-", "-")
                 for i in range(len(by))]
        t.add_row(str(s), *[x for pair in cells for x in pair])
    out().print(t)
    if training.target_loss is None:
        return
    parts = []
    for c in training.curves:
        hit = c.reached(training.target_loss)
        parts.append(f"{c.compressor}: not reached in {c.points[-1].steps if c.points else 0} steps" if hit is None
                     else f"{c.compressor}: {hit.emulated_us / 1000:,.1f} ms ({hit.steps} steps)")
    charged = max((p.charged_mean for c in training.curves for p in c.points), default=0)
    note = (f"; {charged} of the steps (the warm-up's, and any past the replayed iterations) at the replayed "
            "iterations' mean" if charged else "")
    out().print(f"time to loss {training.target_loss:.4f} ({training.target_from}): {'; '.join(parts)}{note}",
                markup=False, highlight=False, soft_wrap=True)


def _checked_line(checked: Checked) -> str:
    """What the real ranks checked of their results (``emu.run.protocol.Checked``), in one line."""
    from emu.run.protocol import UNCHECKED

    line = (f"real ranks' results checked in their own processes: {checked.results:,} ({checked.elements:,} "
            f"elements), {checked.mismatches} mismatched")
    if checked.unchecked:
        line += "; not checked: " + ", ".join(f"{n:,} ({UNCHECKED[why]})" for why, n in checked.unchecked)
    return line
