"""``emu capture``: a built-in model, existing Kineto traces, or an unmodified script."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from emu.cli import cli
from emu.cli.output import err, ms
from emu.errors import ConfigError
from emu.traces.samples import BUILT_IN, PARALLEL_MODELS

if TYPE_CHECKING:
    from emu.traces.model import Trace


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", type=click.Choice(BUILT_IN),
              help="Run a built-in workload on gloo: DDP (mlp, cnn, transformer, dlrm), FSDP's fully_shard "
                   "(fsdp), tensor parallel in data parallel (tp: dp x tp=2), a two-stage pipeline in data "
                   "parallel (pp: pp=2 x dp) or a mixture of experts (moe: ep=4, 16 experts, top-2, uneven "
                   "all_to_alls).")
@click.option("--kineto", is_flag=True,
              help="Import existing profiler traces: the arguments are files or folders, one file per rank.")
@click.option("--chakra", is_flag=True,
              help="Import MLCommons Chakra execution traces: the arguments are .et files or folders, one file "
                   "per rank (docs/trace-format.md, 'Chakra'; needs the protobuf package).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The emu trace to write (.json or .json.gz).")
@click.option("--world-size", type=int, default=None,
              help="Rank processes to start  [default: 4 for fsdp, tp, pp and moe, else 2]; with --chakra, the "
                   "job's ranks where the files do not say (default: the files given)")
@click.option("--iters", "--profile-steps", "iters", type=int, default=5, show_default=True,
              help="Steps to record after the warm-up.")
@click.option("--warmup", type=int, default=3, show_default=True,
              help="Steps to skip first (DDP's first steps differ from the steady state).")
@click.option("--bucket-cap-mb", type=float, default=25.0, show_default=True,
              help="DDP bucket size of the built-in workloads.")
@click.option("--batch-size", type=int, help="Per-rank batch size of the built-in workloads.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of weights and data.")
@click.option("--no-sparsity", is_flag=True,
              help="Do not measure the built-in workloads' gradient block sparsity (a DDP hook in the "
                   "backward pass; docs/capture.md gives its cost). Scripts and imports never have it.")
@click.option("--keep-kineto", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the ranks' Kineto files and logs in this folder.")
@click.option("--timeout", type=float, default=1800.0, show_default=True,
              help="Seconds before the ranks are stopped.")
@click.option("--windows", type=int, default=3, show_default=True,
              help="Profiled windows to take at most: while the steps vary 10%% or more, the ranks run again and "
                   "the steadiest window is kept (1: take one).")
@click.option("--busy-ok", is_flag=True,
              help="Record the machine's load and the steps' spread (meta.noise) without warning about them "
                   "(CI, where load is the norm).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def capture(model: str | None, kineto: bool, chakra: bool, output: Path, world_size: int | None, iters: int, warmup: int,
            bucket_cap_mb: float, batch_size: int | None, seed: int, no_sparsity: bool,
            keep_kineto: Path | None, timeout: float, windows: int, busy_ok: bool, args: tuple[str, ...]) -> None:
    """Record what a data-parallel run does as an emu trace.

    \b
      emu capture --model mlp -o mlp.json.gz
      emu capture --kineto traces/ -o job.json.gz
      emu capture --chakra et/ -o job.json.gz
      emu capture --world-size 2 -o t.json.gz -- python train.py --lr 0.1
    """
    from emu.capture import CaptureConfig, capture_model, capture_script, import_kineto
    from emu.files import check_writable

    check_writable(output, "-o")  # before the work: a capture's minutes are not lost to a bad path
    imported = kineto or chakra
    if sum((model is not None, kineto, chakra, bool(args) and not imported)) != 1:
        raise ConfigError("give exactly one of --model NAME, --kineto FILE..., --chakra FILE..., or -- python train.py")
    if chakra:
        from emu.traces.chakra import import_chakra

        with err().status("importing Chakra traces"):
            trace = import_chakra(list(args), world_size=world_size)
        _written(trace, output, busy_ok)
        return
    if world_size is None:
        world_size = 4 if model in PARALLEL_MODELS else 2
    config = CaptureConfig(world_size=world_size, profile_steps=iters, warmup=warmup,
                           timeout_s=timeout, keep_kineto=keep_kineto, windows=windows)
    console = err()
    if kineto:
        with console.status("importing Kineto traces"):
            trace = import_kineto(list(args))
    else:
        what = f"--model {model}" if model else " ".join(args)
        with console.status(f"capturing {what} on {world_size} ranks") as status:
            def tick(elapsed: float) -> None:
                status.update(f"capturing {what} on {world_size} ranks ({elapsed:.0f} s)")

            if model:
                trace = capture_model(model, config, batch_size=batch_size,
                                      bucket_cap_mb=bucket_cap_mb, seed=seed, sparsity=not no_sparsity,
                                      on_tick=tick)
            else:
                trace = capture_script(list(args), config, on_tick=tick)
    _written(trace, output, busy_ok)


def _written(trace: Trace, output: Path, busy_ok: bool) -> None:
    """Save the trace and say what it holds, and whether its steps are a quiet machine's."""
    from emu.traces import save_trace, summarize
    from emu.traces.noise import profiled_step_us

    console = err()
    save_trace(trace, output)
    s = summarize(trace)
    console.print(f"wrote {output}: {s.model or 'trace'}, ranks {len(s.ranks_in_file)} of "
                  f"{s.world_size}, {s.iterations} iterations, median step {ms(s.step_us_median)} ms",
                  markup=False, highlight=False, soft_wrap=True)
    noise = trace.meta.noise
    if s.profiler_overhead is not None and noise is not None and noise.unprofiled_step_us:
        n = noise.unprofiled_steps
        console.print(f"without the profiler, {n} step{'s' if n != 1 else ''} past the window: median "
                      f"{ms(noise.unprofiled_step_us)} ms against the profiled ones' {ms(profiled_step_us(trace))} ms "
                      f"({s.profiler_overhead:+.1%}: the profiler's overhead and the machine's drift)",
                      markup=False, highlight=False, soft_wrap=True)
    if noise is not None and noise.windows > 1:
        console.print(f"took {noise.windows} profiled windows (the steps varied 10% or more), kept the steadiest: "
                      f"its steps vary {noise.step_cv:.1%}", markup=False, highlight=False, soft_wrap=True)
    if noise is not None and noise.busy and not busy_ok:
        for line in noise.busy:
            console.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)
        console.print("warning: the trace says so (meta.noise), and so will its replays' reports; capture again on a "
                      "quiet machine for step times to trust (docs/capture.md, 'Noise')", markup=False,
                      highlight=False, soft_wrap=True)
