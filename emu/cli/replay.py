"""``emu replay``: run a trace on fake workers through an emulated fabric."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from emu.cli import cli
from emu.cli.options import auto, topology_from, topology_options, trace_path, typed
from emu.cli.output import Progress, err, human_bandwidth, human_bytes, ms, out
from emu.emulator import fabric as fabrics
from emu.errors import CheckFailed, ConfigError, EmuError

if TYPE_CHECKING:
    from emu.replay import AdaptiveReport, CompressionReport


@cli.command()
@click.argument("trace_args", metavar="TRACE...", nargs=-1, required=True)
@click.option("--workers", "-w", "workers_arg", default="8", show_default=True,
              help="Fake workers; with several traces (jobs sharing the fabric) one count a trace, 64,32.")
@click.option("--mesh", default=None,
              help="The layout of a sharded or split trace: its mesh with new sizes for the data-parallel "
                   "dimensions, e.g. dp=64,tp=2 (the workers are its product; docs/parallelism.md).")
@click.option("--allocation", type=click.Choice(["contiguous", "interleaved"]), default=None,
              help="Several traces on a topology: hand each job whole nodes in turn (interleaved: the jobs share "
                   "leaves) or in blocks (contiguous, the default); docs/topology.md.")
@click.option("--network", "network", type=click.Path(dir_okay=False),
              help="A network design file (TOML: fabric, [link], [switch]); flags typed beside it win.")
@click.option("--fabric", default="ina", show_default=True,
              help=f"{fabrics.listing()}; a comma-separated list replays each and compares them.")
@click.option("--bandwidth", default="100Gbps", show_default=True, help="Link bandwidth, e.g. 10Gbps, 400Gbit.")
@click.option("--bandwidth-schedule", default=None,
              help="A bandwidth that changes over emulated time, TIME:BANDWIDTH steps from 0s, e.g. "
                   "0s:100Gbps,20ms:10Gbps (replaces --bandwidth; docs/physics.md).")
@click.option("--latency", default="5us", show_default=True, help="One-way link latency, e.g. 5us, 1ms.")
@click.option("--loss", type=float, default=0.0, show_default=True, help="Packet loss probability per link.")
@click.option("--jitter", default="0us", show_default=True, help="Uniform extra delay per packet, up to this.")
@click.option("--iters", type=int, help="Iterations to replay (default: the trace's).")
@click.option("--clock", type=click.Choice(["sync", "wall"]), default=None,
              help=f"sync: synchronized emulated clock, exact and unpaced (default for {fabrics.listing(True)}); "
                   f"wall: paced by the wall clock with time dilation (default for {fabrics.listing(False)}).")
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
@click.option("--slots", type=int, help="INA slot pool (the window); default covers 2x the bandwidth-delay product.")
@click.option("--elements", type=click.Choice(["64", "256"]), default="64", show_default=True,
              help="int32 elements per aggregation packet.")
@click.option("--packet-rate", default=None,
              help="Contributions the switch's pipeline processes a second (1.2Gpps, 5e8); default: unlimited "
                   "(docs/topology.md).")
@click.option("--processes", type=int, help="Worker host processes (default: min(workers, cores)).")
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
@topology_options
@click.pass_context
def replay(ctx: click.Context, trace_args: tuple[str, ...], workers_arg: str, mesh: str | None, allocation: str | None,
           network: str | None, fabric: str, bandwidth: str,
           bandwidth_schedule: str | None, latency: str, loss: float, jitter: str,
           iters: int | None, clock: str | None, tdf: str | None, payload_scale: str, stragglers: tuple[str, ...],
           sparsity: str, sparsity_block: int | None, compress: str, compress_speed: float, seed: int,
           payload_file: str | None, slots: int | None, elements: str, packet_rate: str | None,
           processes: int | None, ps_shards: int | None, timeout: float, report_path: Path | None,
           chrome_trace: Path | None, as_json: bool, launcher: str, **shape: Any) -> None:
    """Replay TRACE (a file, or a shipped sample: mlp, cnn, transformer, dlrm) on fake workers;
    several traces are jobs sharing the fabric, each also replayed alone for its slowdown.

    \b
      emu replay mlp --workers 8 --fabric ina,ring
      emu replay t.json.gz --workers 64 --fabric ina --bandwidth 100Gbps --report r.json
      emu replay mlp cnn --workers 32,16 --network examples/designs/jobs/shared-spine-4to1.toml
    """
    import json
    from dataclasses import replace

    from emu.emulator.links import LinkSpec, parse_bandwidth, parse_duration_us, parse_schedule
    from emu.files import check_writable
    from emu.lifetime import Terminated
    from emu.replay import Clock, CompressOption, ReplayConfig, SparsityOption, Straggler, parse_mesh
    from emu.replay import replay as run_replay
    from emu.traces import load_trace

    counts = _worker_counts(workers_arg, len(trace_args))
    workers = sum(counts)
    several = len(trace_args) > 1
    layout = None if mesh is None else parse_mesh(mesh)
    if layout is not None and several:
        raise ConfigError("--mesh lays out one sharded or split trace: give it with one trace")
    if several and payload_file is not None:
        raise ConfigError("--payload sends one emu run's tensors: give it with one trace")
    if not several and allocation is not None:
        raise ConfigError("--allocation hands a topology's nodes to several jobs: give it with several traces")
    if several and chrome_trace is not None:
        raise ConfigError("--chrome-trace draws one job's workers: give it with one trace")
    paths = [trace_path(arg) for arg in trace_args]
    traces = [load_trace(p) for p in paths]
    cluster = _join(launcher, processes, paths, ctx.params, [network, payload_file])
    quiet = cluster is not None and cluster.rank != 0  # machine 0 reports; the others host workers
    if cluster is not None:  # every replay below is spread over the machines; they part at the command's end
        from emu.replay import spread

        ctx.with_resource(spread(cluster))
    path, trace = paths[0], traces[0]
    payload = None
    if payload_file is not None:
        from emu.emulator.recorded import load_payload

        payload = load_payload(payload_file)
    design = None
    given: frozenset[str] = frozenset()
    if network is not None:
        from emu.replay import FLAG_KEYS, load_design

        design = load_design(network)
        given = frozenset(key for name, key in FLAG_KEYS.items() if typed(ctx, name))
        if design.fabric is not None and "fabric" not in given:
            fabric = design.fabric
    chosen = [f.strip() for f in fabric.split(",") if f.strip()]
    if not chosen:
        raise ConfigError(f"--fabric needs at least one of: {', '.join(fabrics.names())}")

    def target(base: Path | None, name: str) -> Path | None:
        return None if base is None or len(chosen) == 1 else base.with_name(f"{base.stem}-{name}{base.suffix}")

    for name in chosen if not quiet else ():  # found before anything runs, not after
        if report_path is not None:
            check_writable(target(report_path, name) or report_path, "--report")
        if chrome_trace is not None:
            check_writable(target(chrome_trace, name) or chrome_trace, "--chrome-trace")
    topology = topology_from(shape)
    sparse = SparsityOption.parse(sparsity, sparsity_block)
    sparse.check()
    compression = CompressOption(compress, compress_speed)
    compression.check()
    schedule: tuple[tuple[float, float], ...] = ()
    if bandwidth_schedule is not None:
        if typed(ctx, "bandwidth"):
            raise ConfigError("--bandwidth-schedule sets the bandwidth over time: drop --bandwidth (its first step "
                              "is the bandwidth from 0s)")
        schedule = parse_schedule(bandwidth_schedule)
    link = LinkSpec(bandwidth_bps=schedule[0][1] if schedule else parse_bandwidth(bandwidth),
                    latency_us=parse_duration_us(latency), loss=loss, jitter_us=parse_duration_us(jitter, "--jitter"),
                    schedule=schedule)
    reports = []
    for name in chosen:
        config = ReplayConfig(workers=workers, fabric=name, link=link, iters=iters,
                              clock=Clock(clock) if clock else (Clock.WALL if tdf is not None else None),
                              tdf=None if tdf is None else auto(tdf, float, "--tdf"), payload_scale=auto(payload_scale, int, "--payload-scale"),
                              stragglers=tuple(Straggler.parse(x) for x in stragglers), seed=seed, slots=slots,
                              elements=int(elements), processes=processes, ps_shards=ps_shards, timeout_s=timeout,
                              sparsity=sparse, compress=compression, topology=topology,
                              packet_rate=None if packet_rate is None else _packet_rate(packet_rate),
                              mesh=layout)
        if design is not None:
            config = replace(design.overlay(config, given | {"fabric"}), design_file=network, design_name=design.name)
        if config.mesh is not None:  # the layout sets the workers; a typed count must agree
            if typed(ctx, "workers_arg") and workers != config.mesh.size:
                raise ConfigError(f"--mesh {config.mesh.text()} is {config.mesh.size} workers but --workers is "
                                  f"{workers}: give one, or the same count")
            config = replace(config, workers=config.mesh.size)
        if cluster is not None:
            config = cluster.configure(config)
        if not several:
            config.check()
        elif allocation is not None and config.topology is None:
            raise ConfigError("--allocation hands a topology's nodes to the jobs: give a topology too "
                              "(--workers-per-node, or a design's [topology])")
        # every machine's workers record spans alike (machine 0 writes them all)
        chrome = None if chrome_trace is None else target(chrome_trace, name) or chrome_trace
        out_path = None if report_path is None or quiet else target(report_path, name) or report_path
        try:
            on = "" if cluster is None else f" on {cluster.world} machines"
            with Progress(f"{name} x{workers_arg}{on}", quiet=quiet) as bar:
                if several:
                    from emu.emulator.topology import Allocation
                    from emu.replay import Jobs, replay_jobs

                    chosen = (Allocation(allocation) if allocation is not None
                              else design.allocation if design is not None and design.allocation is not None
                              else Allocation.CONTIGUOUS)
                    report = replay_jobs(traces, config, Jobs(counts, chosen), [str(p) for p in paths],
                                         on_progress=bar.update, on_status=bar.status)
                else:
                    report = run_replay(trace, config, trace_path=str(path), chrome_trace=chrome,
                                        on_progress=bar.update, on_status=bar.status, payload=payload,
                                        payload_path=payload_file)
        except (EmuError, KeyboardInterrupt, Terminated) as exc:
            partial = getattr(exc, "partial_report", None)
            if partial is not None and out_path is not None:
                try:
                    partial.save(out_path)
                    note = "" if partial.complete else " (partial: complete is false)"
                    err().print(f"wrote {out_path}{note}", markup=False, highlight=False)
                except EmuError as save_error:  # the run's own failure is what the exit code says
                    err().print(f"emu: {save_error}", markup=False, highlight=False)
            raise
        reports.append(report)
        if out_path is not None:
            report.save(out_path)
            err().print(f"wrote {out_path}", markup=False, highlight=False)
    if quiet:
        assert cluster is not None
        err().print(f"machine {cluster.rank} of {cluster.world} ({cluster.me.hostname}) hosted its share of the "
                    f"workers; machine 0 ({cluster.machines[0].hostname}) printed the results", markup=False,
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


def _table(reports, path: Path) -> None:
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
    for r in reports:
        t.add_column(r.config["fabric"], justify="right")

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
        + f" ({r.verification.elements_checked:,} checked"
        + (", real ranks' tensors)" if r.verification.payload == "recorded" else ")"))
    if any(r.parallelism is not None for r in reports):
        row("layout", lambda r: "-" if r.parallelism is None else _layout(r.parallelism))
        row("groups", lambda r: "-" if r.parallelism is None else "; ".join(
            f"{g.role or 'group'}: {g.groups} of {g.size}, {'/'.join(g.ran)}{' in nodes' if g.inside_nodes else ''}"
            for g in r.parallelism.groups))
    if any(r.sparsity is not None for r in reports):
        row("non-zero blocks", lambda r: "dense" if r.sparsity is None else
            f"{100 * r.sparsity.nonzero_fraction:.1f}% per worker, {100 * r.sparsity.union_fraction:.1f}% on some "
            f"(sent: {100 * r.sparsity.sent_fraction:.0f}%)")
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
    row("packets lost (resent)", lambda r: f"{r.fabric.packets_lost:,}")
    row("fallbacks", lambda r: ", ".join(f"{k} x{v}" for k, v in sorted(r.fabric.fallbacks.items())) or "-")
    row("clock", lambda r: r.emulator.clock if r.emulator.tdf is None else f"wall, dilation {r.emulator.tdf:g}")
    row("payload scale", lambda r: str(r.emulator.payload_scale))
    if any(r.emulator.lag_us_p99 is not None for r in reports):
        row("emulator lag p99", lambda r: "-" if r.emulator.lag_us_p99 is None else f"{ms(r.emulator.lag_us_p99)} ms")
    row("trustworthy", lambda r: "yes" if r.emulator.trustworthy else "NO")
    row("wall time", lambda r: f"{r.emulator.wall_s:.1f} s")
    out().print(t)
    for r in reports:
        if r.emulator.advice:
            err().print(f"{r.config['fabric']}: not trustworthy: {r.emulator.advice}", markup=False,
                        highlight=False, soft_wrap=True)
        if r.verification.payload_note:
            err().print(f"{r.config['fabric']}: {r.verification.payload_note}", markup=False, highlight=False,
                        soft_wrap=True)


def _packet_rate(text: str) -> float:
    from emu.replay import parse_packet_rate

    try:
        return parse_packet_rate(text)
    except ValueError:
        raise ConfigError(f"--packet-rate {text!r}: give packets a second (1.2Gpps, 500Mpps, 2e9)") from None


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
