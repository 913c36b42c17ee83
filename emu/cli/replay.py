"""``emu replay``: run a trace on fake workers through an emulated fabric."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from emu.cli import cli
from emu.cli.options import auto, design_options, design_values, trace_path, typed
from emu.cli.output import ProgressBar, err, human_bandwidth, human_bytes, ms, out, warn_design
from emu.emulator import fabric as fabrics
from emu.errors import CheckFailed, ConfigError, EmuError

if TYPE_CHECKING:
    from emu.replay import AdaptiveReport, CompressionReport, FabricReport, ReplayConfig, ReplayReport, Verification


@cli.command()
@click.argument("trace_args", metavar="TRACE...", nargs=-1, required=True)
@click.option("--workers", "-w", "workers_arg", default="8", show_default=True,
              help="Fake workers; with several traces (jobs sharing the fabric) one count a trace, 64,32.")
@click.option("--iters", type=int, help="Iterations to replay (default: the trace's).")
@click.option("--clock", type=click.Choice(["sync", "wall"]), default=None,
              help="sync: synchronized emulated clock, exact and unpaced (the default, BMv2 included); "
                   "wall: paced by the wall clock with time dilation (for a switch that keeps no emulated time).")
@click.option("--tdf", default=None,
              help="Time dilation of the wall clock (wall seconds per emulated second), or auto: "
                   "calibrated (the default there); implies --clock wall.")
@click.option("--payload-scale", default="auto", show_default=True,
              help="Packets on the emulated wire per packet really sent, or auto.")
@click.option("--straggler", "stragglers", multiple=True,
              help="Slow compute: WORKERS:FACTOR (3,7:1.5), random:FRACTION:FACTOR, lognormal:SIGMA.")
@click.option("--sparsity", default="trace", show_default=True,
              help="Payload of float all_reduces: trace (as recorded), none (dense), F (a fraction of non-zero "
                   "blocks per worker; union as for independent workers) or F:U (U non-zero on some worker). ina, ring "
                   "and ps skip the zero blocks (docs/sparse.md).")
@click.option("--sparsity-block", type=int, default=None,
              help="Elements per sparsity block (default: the trace's, else 256).")
@click.option("--compress", default="none", show_default=True,
              help="Gradient compressor of float all_reduces (docs/compression.md): none, fp16, topk[:R], "
                   "randomk[:R], dgc[:R], qsgd[:LEVELS], terngrad, signsgd, efsignsgd, onebit, natural, "
                   "powersgd[:RANK], or adaptive[:FLOOR] (top-k chosen per bucket from the measured bandwidth).")
@click.option("--compress-speed", type=float, default=1.0, show_default=True,
              help="Compression runs this many times faster than on the build machine (its cost model).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of payload, loss and jitter.")
@click.option("--payload", "payload_file", type=click.Path(dir_okay=False),
              help="Send the real ranks' tensors that emu run wrote beside its --trace-out (NAME.payload.npz) "
                   "in place of generated payload.")
@click.option("--processes", type=int, help="Worker host processes; 0: the switch and every host in emu's own process "
                   "(default: 0 up to 32,768 workers on the synchronized clock, else as many as cores, at least 2).")
@click.option("--ps-shards", type=int, help="Parameter-server shards (default: one per worker).")
@click.option("--timeout", type=float, default=1800.0, show_default=True, help="Seconds before giving up.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON report here (one per fabric: NAME-FABRIC.json when several).")
@click.option("--chrome-trace", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every worker's spans in emulated time (Perfetto / chrome://tracing).")
@click.option("--json", "as_json", is_flag=True, help="Print the report(s) as JSON on stdout.")
@click.option("--launcher", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: under torchrun, srun or a PyTorchJob (RANK, WORLD_SIZE, MASTER_ADDR or SLURM_*), join the "
                   "other machines and host a share of the workers (docs/multi-host.md); none: this machine alone.")
@design_options("replay")
@click.pass_context
def replay(ctx: click.Context, trace_args: tuple[str, ...], workers_arg: str, network: str | None, fabric: str,
           iters: int | None, clock: str | None, tdf: str | None, payload_scale: str, stragglers: tuple[str, ...],
           sparsity: str, sparsity_block: int | None, compress: str, compress_speed: float, seed: int,
           payload_file: str | None, processes: int | None, ps_shards: int | None, timeout: float,
           report_path: Path | None, chrome_trace: Path | None, as_json: bool, launcher: str, **flags: Any) -> None:
    """Replay TRACE (a file, or a shipped sample: mlp, cnn, transformer, dlrm, fsdp, tp, pp) on fake workers;
    several traces are jobs sharing the fabric, each also replayed alone for its slowdown.

    \b
      emu replay mlp --workers 8 --fabric ina,ring
      emu replay t.json.gz --workers 64 --fabric ina --bandwidth 100Gbps --report r.json
      emu replay mlp cnn --workers 32,16 --network examples/designs/jobs/shared-spine-4to1.toml
    """
    from emu.replay import replay as run_replay
    from emu.traces import load_trace

    counts = _worker_counts(workers_arg, len(trace_args))
    several = len(trace_args) > 1
    _refuse_for_several(several, flags, payload_file, chrome_trace)
    paths = [trace_path(arg) for arg in trace_args]
    traces = [load_trace(p) for p in paths]
    cluster = _join(launcher, processes, paths, ctx.params, [network, payload_file])
    quiet = cluster is not None and cluster.rank != 0  # machine 0 reports; the others host workers
    if cluster is not None:  # every replay below is spread over the machines; they part at the command's end
        from emu.replay import spread

        ctx.with_resource(spread(cluster))
    configs = _configs(ctx, _base_config(ctx.params, sum(counts)), fabric, network, several, cluster, flags)
    warn_design(configs[0])
    outputs = _outputs(configs, report_path, chrome_trace, quiet)
    payload = None
    if payload_file is not None:
        from emu.emulator.payload.recorded import load_payload

        payload = load_payload(payload_file)
    reports = []
    for config, (out_path, chrome) in zip(configs, outputs, strict=True):
        # the workers replayed (a --mesh sets them: dp=64,tp=2 is 128 whatever --workers said); jobs: each job's
        label = (f"{config.fabric} x{workers_arg if several else config.workers}"
                 + ("" if cluster is None else f" on {cluster.world} machines"))
        with _partial_saved(out_path), ProgressBar(label, quiet=quiet) as bar:
            if several:
                report = _jobs(traces, paths, config, counts, flags, network, bar)
            else:
                report = run_replay(traces[0], config, trace_path=str(paths[0]), chrome_trace=chrome,
                                    on_progress=bar.update, on_status=bar.status, payload=payload,
                                    payload_path=payload_file)
        reports.append(report)
        if out_path is not None:
            report.save(out_path)
            # a partial report an earlier failed run left beside this path is superseded now
            out_path.with_name(f"{out_path.name}.partial").unlink(missing_ok=True)
            err().print(f"wrote {out_path}", markup=False, highlight=False)
    _show(reports, paths[0], several, as_json, cluster if quiet else None)


def _refuse_for_several(several: bool, flags: dict[str, Any], payload_file: str | None,
                        chrome_trace: Path | None) -> None:
    """What one trace and several traces (jobs sharing the fabric) each cannot take."""
    if several and flags.get("mesh") is not None:
        raise ConfigError("--mesh lays out one sharded or split trace: give it with one trace")
    if several and payload_file is not None:
        raise ConfigError("--payload sends one emu run's tensors: give it with one trace")
    if not several and flags.get("allocation") is not None:
        raise ConfigError("--allocation hands a topology's nodes to several jobs: give it with several traces")
    if several and chrome_trace is not None:
        raise ConfigError("--chrome-trace draws one job's workers: give it with one trace")


def _base_config(params: dict[str, Any], workers: int) -> ReplayConfig:
    """The configuration of the command's parameters (click's) but the network's."""
    from emu.replay import Clock, CompressOption, ReplayConfig, SparsityOption, Straggler

    sparse = SparsityOption.parse(params["sparsity"], params["sparsity_block"])
    sparse.check()
    compression = CompressOption(params["compress"], params["compress_speed"])
    compression.check()
    tdf, clock = params["tdf"], params["clock"]
    return ReplayConfig(
        workers=workers, iters=params["iters"], clock=Clock(clock) if clock else (Clock.WALL if tdf is not None else None),
        tdf=None if tdf is None else auto(tdf, float, "--tdf"),
        payload_scale=auto(params["payload_scale"], int, "--payload-scale"),
        stragglers=tuple(Straggler.parse(x) for x in params["stragglers"]), seed=params["seed"],
        processes=params["processes"], ps_shards=params["ps_shards"], timeout_s=params["timeout"], sparsity=sparse,
        compress=compression)


def _configs(ctx: click.Context, base: ReplayConfig, fabric: str, network: str | None, several: bool,
             cluster: Any, flags: dict[str, Any]) -> list[ReplayConfig]:
    """Each fabric's configuration, checked before anything runs: ``base``, the network flags, the
    design file (typed flags win over it), the mesh's workers."""
    from dataclasses import replace

    from emu.replay import apply_design, load_design

    values, given = design_values(ctx, flags, "replay", skip=frozenset({"fabric"}))
    design = None if network is None else load_design(network)
    if design is not None and design.value("fabric") is not None and not typed(ctx, "fabric"):
        fabric = design.value("fabric")
    chosen = [f.strip() for f in fabric.split(",") if f.strip()]
    if not chosen:
        raise ConfigError(f"--fabric needs at least one of: {', '.join(fabrics.names())}")
    configs = []
    for name in chosen:
        config = apply_design(replace(base, fabric=name), values)
        if design is not None:
            config = replace(design.overlay(config, given | {"fabric"}), design_file=network, design_name=design.name)
        if config.mesh is not None and typed(ctx, "workers_arg") and base.workers != config.mesh.size:
            raise ConfigError(f"--mesh {config.mesh.text()} is {config.mesh.size} workers but --workers is "
                              f"{base.workers}: give one, or the same count")
        if cluster is not None:
            config = cluster.configure(config)
        if not several:
            config.check()
        elif flags.get("allocation") is not None and config.topology is None:
            raise ConfigError("--allocation hands a topology's nodes to the jobs: give a topology too "
                              "(--workers-per-node, or a design's [topology])")
        configs.append(config)
    return configs


def _outputs(configs: list[ReplayConfig], report_path: Path | None, chrome_trace: Path | None,
             quiet: bool) -> list[tuple[Path | None, Path | None]]:
    """Each replay's report and chrome trace (NAME-FABRIC.json when several fabrics), checked
    writable before anything runs; machine 0 writes the reports, every machine's workers record spans."""
    from emu.files import check_writable

    def target(base: Path | None, name: str) -> Path | None:
        return None if base is None or len(configs) == 1 else base.with_name(f"{base.stem}-{name}{base.suffix}")

    out = []
    for config in configs:
        report = None if report_path is None or quiet else target(report_path, config.fabric) or report_path
        chrome = None if chrome_trace is None else target(chrome_trace, config.fabric) or chrome_trace
        for path, option in ((report, "--report"), (chrome, "--chrome-trace")):
            if path is not None and not quiet:
                check_writable(path, option)
        out.append((report, chrome))
    return out


@contextlib.contextmanager
def _partial_saved(out_path: Path | None) -> Iterator[None]:
    """A failed or interrupted replay's partial report is written where the report would go, or,
    where a complete report is there already (an earlier run's good result), beside it as
    ``<name>.partial``, and the line says where."""
    from emu.lifetime import Terminated

    try:
        yield
    except (EmuError, KeyboardInterrupt, Terminated) as exc:
        partial = getattr(exc, "partial_report", None)
        if partial is not None and out_path is not None:
            try:
                # beside, not over, a complete report; named so that `emu check`'s *.json skips it
                target = out_path.with_name(f"{out_path.name}.partial") if _complete_report(out_path) else out_path
                partial.save(target)
                note = "" if partial.complete else " (partial: complete is false)"
                kept = f"; kept the complete report {out_path}" if target != out_path else ""
                err().print(f"wrote {target}{note}{kept}", markup=False, highlight=False, soft_wrap=True)
            except EmuError as save_error:  # the run's own failure is what the exit code says
                err().print(f"emu: error: {save_error}", markup=False, highlight=False, soft_wrap=True)
        raise


def _complete_report(path: Path) -> bool:
    """Whether ``path`` holds a complete replay report (one an interrupted run must not replace)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "report_version" in doc and doc.get("complete") is True


def _jobs(traces: list, paths: list[Path], config: ReplayConfig, counts: tuple[int, ...], flags: dict[str, Any],
          network: str | None, bar: ProgressBar) -> ReplayReport:
    """Several traces: jobs sharing the fabric (emu.replay.jobs)."""
    from emu.emulator.links.topology import Allocation
    from emu.replay import DESIGN_KEYS, Jobs, load_design, replay_jobs
    from emu.replay.config.keys import flag_value

    key = next(k for k in DESIGN_KEYS if k.key == "jobs.allocation")
    allocation = (flag_value(key, flags["allocation"]) if flags.get("allocation") is not None
                  else load_design(network).value("jobs.allocation") if network is not None else None)
    return replay_jobs(traces, config, Jobs(counts, allocation or Allocation.CONTIGUOUS), [str(p) for p in paths],
                       on_progress=bar.update, on_status=bar.status)


def _show(reports: list[ReplayReport], path: Path, several: bool, as_json: bool, hosted: Any) -> None:
    """The reports on stdout (a table, or JSON); exit code 1 where verification failed."""
    import json

    if hosted is not None:
        err().print(f"machine {hosted.rank} of {hosted.world} ({hosted.me.hostname}) hosted its share of the "
                    f"workers; machine 0 ({hosted.machines[0].hostname}) printed the results", markup=False,
                    highlight=False)
    elif as_json:
        docs = [r.to_dict() for r in reports]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    else:
        _table(reports, path)
        if several:
            _jobs_table(reports)
    failed = [r for r in reports if not r.verification.ok]
    if failed:
        raise CheckFailed(f"verification failed on {', '.join(r.config['fabric'] for r in failed)}: "
                          f"{sum(r.verification.mismatches for r in failed)} mismatched elements")


# options a machine may give otherwise than machine 0: where it writes (only machine 0 does) and
# its own processes
_OWN_OPTIONS = {"report_path", "chrome_trace", "processes", "launcher", "as_json"}


def _join(launcher: str, processes: int | None, paths: list[Path], params: dict[str, Any],
          files: list[str | None]):
    """The machines of the launcher's environment, joined and agreed on the traces, the options
    and the files they name (None: alone)."""
    if launcher == "none":
        return None
    import hashlib
    import os

    from emu.replay import JOIN_TIMEOUT_S, from_environment, join
    from emu.traces.io import trace_sha256

    env = from_environment(os.environ)
    if env is None or env.world_size == 1:
        return None
    err().print(f"machine {env.rank} of {env.world_size}: joining the rendezvous at {env.master_addr}:"
                f"{env.master_port} ({env.launcher})", markup=False, highlight=False)
    wait = os.environ.get("EMU_JOIN_TIMEOUT")
    try:
        timeout_s = JOIN_TIMEOUT_S if wait is None else float(wait)
    except ValueError:
        raise ConfigError(f"EMU_JOIN_TIMEOUT={wait!r} is not a number of seconds") from None
    cluster = join(env, processes, os.environ.get("EMU_SECRET") or None, os.environ.get("EMU_ADDRESS") or None,
                   timeout_s=timeout_s)
    if not os.environ.get("EMU_SECRET") and not all(m.address.startswith("127.") for m in cluster.machines):
        err().print("emu: EMU_SECRET is not set, so the run's key was handed out through the rendezvous store, "
                    "which anyone who reaches MASTER_PORT can read: set the same EMU_SECRET on every machine "
                    "(docs/multi-host.md)", markup=False, highlight=False)
    try:
        cluster.agree("traces, options or files", {
            "traces": [trace_sha256(p) for p in paths],
            "options": {k: v for k, v in params.items() if k not in _OWN_OPTIONS},
            "files": [None if f is None else hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files]})
    except EmuError as exc:  # the others learn why at once
        cluster.close(str(exc))
        raise
    return cluster


def _layout(par) -> str:
    """The mesh a sharded or split trace ran at, and whether every collective was accounted for."""
    scaled = f" ({', '.join(par.scaled)} scaled from {par.trace_mesh})" if par.scaled else ""
    done = "every collective accounted for" if par.accounted else "COLLECTIVES MISSING"
    return f"{par.mesh or 'as traced'}{scaled}; {done}"


def _table(reports, path: Path, columns: list[str] | None = None) -> None:
    """The reports side by side, each column named by its fabric (or ``columns``)."""
    from rich.table import Table

    first = reports[0]
    schedule = first.config.get("bandwidth_schedule")
    bandwidth = (" then ".join(f"{human_bandwidth(bps)} from {t_us / 1000:g} ms" for t_us, bps in schedule)
                 if schedule else human_bandwidth(first.config["bandwidth_bps"]))
    shape = (first.config.get("design") or {}).get("topology")
    where = "" if shape is None else (f", {shape['workers_per_node']}/node {shape['placement'] if isinstance(shape['placement'], str) else 'listed'}"
                                      f" ({shape['nics_per_node']} NIC{'s' if shape['nics_per_node'] > 1 else ''})")
    jobs = first.config.get("jobs")
    who = (f"{first.config['workers']} workers" if jobs is None else
           f"{len(jobs['workers'])} jobs of {'+'.join(map(str, jobs['workers']))} workers (the first's times)")
    t = Table(title=f"{path.name}: {who}{where}, {bandwidth}, "
                    f"{first.config['latency_us']:g} us")
    t.add_column("")
    for i, r in enumerate(reports):
        t.add_column(r.config["fabric"] if columns is None else f"{columns[i]} ({r.config['fabric']})", justify="right")

    def row(name: str, fn) -> None:
        t.add_row(name, *[fn(r) for r in reports])

    row("iteration (median)", lambda r: f"{ms(r.summary.iteration_us_median)} ms")
    row("iteration (p99)", lambda r: f"{ms(r.summary.iteration_us_p99)} ms")
    row("compute", lambda r: f"{ms(_median([i.compute_us for i in r.iterations]))} ms")
    row("communication", lambda r: f"{ms(_median([i.comm_us for i in r.iterations]))} ms")
    row("exposed communication", lambda r: f"{ms(_median([i.exposed_comm_us for i in r.iterations]))} ms")
    row("throughput", lambda r: "-" if r.summary.throughput_samples_per_s is None
        else f"{r.summary.throughput_samples_per_s:,.0f} samples/s")
    row("bytes on the wire", lambda r: human_bytes(r.summary.bytes_sent))
    row("verification", lambda r: ("ok" if r.verification.ok else "FAILED")
        + f" ({_checked(r.verification)}"
        + (", real ranks' tensors" if r.verification.payload == "recorded" else "")
        + (f", {r.verification.segments_without_data:,} segments empty" if r.verification.segments_without_data
           else "") + ")")
    if any(r.parallelism is not None for r in reports):
        row("layout", lambda r: "-" if r.parallelism is None else _layout(r.parallelism))
        row("groups", lambda r: "-" if r.parallelism is None else "; ".join(
            f"{g.role or 'group'}: {g.groups} of {g.size}, {'/'.join(g.ran)}{' in nodes' if g.inside_nodes else ''}"
            for g in r.parallelism.groups))
    if any(r.sparsity is not None for r in reports):
        row("non-zero blocks", lambda r: "dense" if r.sparsity is None else
            f"{100 * r.sparsity.nonzero_fraction:.1f}% per worker, {100 * r.sparsity.union_fraction:.1f}% on some "
            f"(sent {100 * r.sparsity.sent_fraction:.0f}% of the dense values as values and indices, counted on "
            f"the links; headers {human_bytes(r.sparsity.header_bytes)} more)")
    if any(r.compression is not None for r in reports):
        row("compression", lambda r: "none" if r.compression is None else _compression(r.compression))
        if any(r.compression is not None and r.compression.adaptive is not None for r in reports):
            row("adaptive choices", lambda r: "-" if r.compression is None or r.compression.adaptive is None
                else _choices(r.compression.adaptive))
        row("compress + decompress", lambda r: "-" if r.compression is None else
            f"{ms(r.compression.compress_us)} + {ms(r.compression.decompress_us)} per iteration")
    row("busiest link", lambda r: "-" if r.fabric.busiest_link is None else
        f"{r.fabric.busiest_link['name']} ({r.fabric.busiest_link['kind']}): "
        f"{100 * r.fabric.busiest_link['utilisation']:.0f}%")
    row("packets lost (resent)", lambda r: _lost(r.fabric))
    row("fallbacks", lambda r: ", ".join(f"{k} x{v}" for k, v in sorted(r.fabric.fallbacks.items())) or "-")
    if any(r.fabric.bridge is not None for r in reports):
        row("switch outside emu", lambda r: "-" if r.fabric.bridge is None else _bridge(r.fabric.bridge))
    row("clock", lambda r: r.emulator.clock if r.emulator.tdf is None else f"wall, dilation {r.emulator.tdf:g}")
    row("payload scale", lambda r: str(r.emulator.payload_scale))
    if any(r.emulator.lag_us_p99 is not None for r in reports):
        row("emulator lag p99", lambda r: "-" if r.emulator.lag_us_p99 is None else f"{ms(r.emulator.lag_us_p99)} ms")
    row("trustworthy", lambda r: "yes" if r.emulator.trustworthy else "NO")
    row("wall time", lambda r: f"{r.emulator.wall_s:.1f} s")
    out().print(t)
    _notes(reports)


def _notes(reports) -> None:
    """What a reader of the table must know, on stderr: the trace's noise, and per report what the
    emulation could not check or vouch for."""
    for line in reports[0].trace.get("noise", ()):
        err().print(f"the trace: {line} (its compute times carry that; docs/capture.md, 'Noise')", markup=False,
                    highlight=False, soft_wrap=True)
    for r in reports:
        if r.emulator.advice:
            err().print(f"{r.config['fabric']}: not trustworthy: {r.emulator.advice}", markup=False,
                        highlight=False, soft_wrap=True)
        if r.verification.payload_note:
            err().print(f"{r.config['fabric']}: {r.verification.payload_note}", markup=False, highlight=False,
                        soft_wrap=True)
        v = r.verification
        if v.segments_without_data:
            err().print(f"{r.config['fabric']}: {v.segments_without_data:,} of {v.segments:,} point-to-point segments "
                        f"carried no real element at payload scale {r.emulator.payload_scale} (a chunk of the real "
                        "tensor is empty): their bytes crossed the emulated links, no value of theirs was checked; "
                        "a smaller --payload-scale checks more", markup=False, highlight=False, soft_wrap=True)


def _bridge(b) -> str:
    agrees = "every result as the protocol's" if b.differs == 0 else f"{b.differs:,} RESULTS DIFFER from the protocol's"
    return (f"{b.frames:,} frames in, {b.results:,} out, {agrees}; {b.resent:,} resent for real drops"
            + (f", {b.barrier_resends:,} barriers again" if b.barrier_resends else ""))


def _worker_counts(text: str, traces: int) -> tuple[int, ...]:
    """--workers: one count, or one a trace (one count for several traces gives each job as many)."""
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or (traces == 1 and len(counts) != 1):
        raise ConfigError(f"--workers {text!r}: give a number of workers" + (", one a trace (64,32)" if traces > 1 else ""))
    if len(counts) == 1:
        counts = counts * traces
    if len(counts) != traces:
        raise ConfigError(f"--workers {text!r} gives {len(counts)} counts for {traces} traces: give one a trace, "
                          "in the traces' order")
    return counts


def _jobs_table(reports) -> None:
    from rich.table import Table

    for r in reports:
        t = Table(title=f"{r.config['fabric']}: {len(r.jobs)} jobs sharing the fabric "
                        f"({r.config['jobs']['slot_policy']} slots"
                        + (f", {r.config['jobs']['allocation']} nodes)" if r.config['jobs']['allocation'] else ")"))
        for name in ("job", "trace", "workers", "nodes", "slots", "alone", "shared", "slowdown", "verification"):
            t.add_column(name, justify="left" if name in ("trace", "nodes") else "right")
        for j in r.jobs:
            shared = j.shared_us
            t.add_row(str(j.job), Path(j.trace["path"]).name, str(j.workers), _nodes(j.nodes), str(j.slots),
                      "-" if j.alone_us is None else f"{ms(j.alone_us)} ms",
                      "-" if shared is None else f"{ms(shared)} ms",
                      "-" if j.slowdown is None else f"{j.slowdown:.3f}x",
                      "ok" if j.verification.ok else "FAILED")
        out().print(t)


def _nodes(nodes: list[int] | None) -> str:
    """'0-3, 8-11' for the nodes a job holds."""
    if not nodes:
        return "-"
    runs: list[list[int]] = []
    for n in nodes:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _checked(v: Verification) -> str:
    """Distinct elements checked, and the deliveries where they differ (each worker checks what it
    receives)."""
    if v.elements_distinct and v.elements_distinct != v.elements_checked:
        return f"{v.elements_distinct:,} elements, {v.elements_checked:,} checks"
    return f"{v.elements_checked:,} checked"


def _lost(f: FabricReport) -> str:
    """Emulated packets lost, saying which were modelled (drawn and timed, no message dropped)."""
    if not f.packets_lost:
        return "0"
    if f.packets_lost_modelled >= f.packets_lost:
        return f"{f.packets_lost:,} (modelled)"
    if f.packets_lost_modelled:
        return f"{f.packets_lost:,} ({f.packets_lost - f.packets_lost_modelled:,} real, {f.packets_lost_modelled:,} modelled)"
    return f"{f.packets_lost:,} (real)"


def _compression(c: CompressionReport) -> str:
    if c.adaptive is not None:
        return (f"{c.compressor} ({c.adaptive.passes} pass{'es' if c.adaptive.passes > 1 else ''}): "
                f"{c.ratio:.1f}x fewer bytes a worker, mean of the iterations")
    if c.error is None or c.cosine is None:
        return f"{c.compressor}: no all_reduce it compresses"
    return (f"{c.compressor} ({c.aggregation}{', in the switch' if c.in_switch else ''}"
            f"{'; its lanes NOT exact' if c.switch_exact is False else ''}): "
            f"{c.ratio:.1f}x fewer bytes a worker, error {c.error:.3g}, cosine {c.cosine:.3f}")


def _choices(a: AdaptiveReport) -> str:
    """Runs of iterations with the same choices: '0-2 none/none, 3-5 topk:0.01/none'."""
    runs: list[list] = []
    for step in a.steps:
        if runs and runs[-1][2] == step.choices:
            runs[-1][1] = step.iteration
        else:
            runs.append([step.iteration, step.iteration, step.choices])
    return ", ".join(f"{lo}{'' if lo == hi else f'-{hi}'} {'/'.join(ch)}" for lo, hi, ch in runs)


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else 0.0
