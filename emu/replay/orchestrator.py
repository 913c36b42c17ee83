"""Running a replay of one job: check it, choose the payload scale and the dilation, plan its
processes (which worker each host holds, the switch's setup), run them (``emu.replay.processes``)
and build the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from emu.emulator import physics
from emu.emulator.recorded import RecordedPayload
from emu.emulator.topology import Algorithm, Layout
from emu.errors import ConfigError, RunFailed
from emu.replay import machines
from emu.replay.adaptive import run_passes
from emu.replay.config import REAL_BYTES_PER_ITERATION, Clock, ReplayConfig
from emu.replay.host import HostSetup
from emu.replay.layout import plan_mesh
from emu.replay.messages import HostResult, SwitchResult
from emu.replay.parallelism import ina_pools, on_stream, parallelism_report
from emu.replay.payloads import recorded_payload
from emu.replay.processes import ReplayError, execute
from emu.replay.programs import WorkerProgram, group_table, plan_programs
from emu.replay.remote import check_spreadable
from emu.replay.report import ReplayReport, write_chrome_trace
from emu.replay.results import LAG_TOLERANCE, build_report
from emu.replay.sparsity import with_sparsity
from emu.replay.switchd import SwitchSetup
from emu.traces.model import Trace


def split(n: int, parts: int) -> list[tuple[int, int]]:
    return [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]


def point_to_point(programs: list[WorkerProgram], config: ReplayConfig) -> bool:
    """Whether any collective runs point to point (the rest run on the aggregation stream): the
    first worker's program tells for a trace of one group; a sharded or split job's ranks run
    programs of their own, so one worker of each rank's is asked."""
    one = {prog.rank: prog for prog in (programs if programs and programs[0].seq_offsets else programs[:1])}
    return any(not on_stream(op, config) for prog in one.values() for it in prog.iterations for op in it.colls)


def _worker_hosts(config: ReplayConfig) -> list[np.ndarray]:
    """The workers of each worker host process (``partition``)."""
    return partition(config.layout(), config.workers, config.host_processes)


def partition(layout: Layout | None, workers: int, processes: int) -> list[np.ndarray]:
    """The workers of each of at most ``processes`` host processes: consecutive ranges, or on a
    topology whole nodes (traffic inside a node never leaves its host: emu.replay.wiring), and with
    several leaves whole leaves (their links to the spine are the host's: emu.replay.leaves), as
    many per host as even."""
    if layout is None:
        return [np.arange(a, b) for a, b in split(workers, processes)]
    if layout.leaves > 1:
        leaves = np.unique(layout.leaf)
        parts = min(processes, len(leaves))
        return [np.flatnonzero(np.isin(layout.leaf, leaves[a:b])) for a, b in split(len(leaves), parts)]
    nodes = np.unique(layout.node)
    parts = min(processes, len(nodes))
    return [np.flatnonzero(np.isin(layout.node, nodes[a:b])) for a, b in split(len(nodes), parts)]


UNPACED_TDF = 1e-6  # the calibration probe runs as fast as it can
SAFETY = 1.5  # the first probe's dilation over the bare minimum the work allows
MAX_PROBES = 4
PROBE_ITERS = 2
MARGIN = 1.2
MIN_TDF = 0.05


def scale_for(real_bytes: float) -> int:
    """The smallest power of two R that brings ``real_bytes`` within REAL_BYTES_PER_ITERATION."""
    r = 1
    while real_bytes / r > REAL_BYTES_PER_ITERATION:
        r *= 2
    return r


def choose_payload_scale(trace: Trace, config: ReplayConfig) -> int:
    """The smallest power of two R that keeps the real bytes of an iteration within budget, and no
    coarser than a sparse parameter server's shards allow (``sparse_ps_scale_limit``)."""
    per_worker = max(sum(op.bytes for op in it.colls) for r in trace.ranks for it in r.iterations)
    r = scale_for(per_worker * config.workers)
    limit = sparse_ps_scale_limit(trace, config)
    return r if limit is None else min(r, _power_of_two_below(limit))


# A sparse push lands whole real blocks on the shards: with few of them per shard (each standing
# for R emulated blocks) the load of the busiest shard is a coarse draw, and times grow with R
# (dlrm at 128 workers, 10 Gb/s: 48 ms at R = 64, 26 ms at R = 2; docs/sparse.md). This many real
# blocks per shard keep the load within a few percent of its expectation.
MIN_SPARSE_BLOCKS_PER_SHARD = 32


def sparse_ps_scale_limit(trace: Trace, config: ReplayConfig) -> int | None:
    """The largest R at which the largest sparse parameter-server all_reduce still gives every shard
    ``MIN_SPARSE_BLOCKS_PER_SHARD`` real blocks (at least 1), or None where nothing runs sparse there."""
    if not config.network.parameter_server:
        return None
    from emu.emulator.sparse_p2p import ps_sparse
    from emu.replay.sparsity import with_sparsity

    largest = None
    for rank in with_sparsity(trace, config.workers, config.sparsity):
        for it in rank.iterations:
            for op in it.colls:
                if op.sparsity is not None and ps_sparse(op.sparsity, config.workers, op.dtype.itemsize) \
                        and (largest is None or op.count > largest.count):
                    largest = op
    if largest is None or largest.sparsity is None:
        return None
    blocks = largest.count / largest.sparsity.block_elements
    return max(1, int(blocks / (config.shards * MIN_SPARSE_BLOCKS_PER_SHARD)))


def check_scale(trace: Trace, config: ReplayConfig) -> None:
    """A real ring (or sharded parameter server) past the fabric's limit is millions of messages
    per collective: refuse it and give the analytic estimate instead."""
    if not config.network.beyond_p2p_limit(config.workers):
        return
    limit = config.network.p2p_worker_limit
    largest = max((op for r in trace.ranks for it in r.iterations for op in it.colls), key=lambda op: op.bytes)
    estimate = physics.ring_time_us(largest.count, largest.dtype.itemsize, config.workers, config.link)
    raise ConfigError(
        f"--fabric {config.fabric} --workers {config.workers}: a real {config.fabric} of more than {limit} "
        f"workers is {physics.ring_messages(config.workers):,} messages per collective, which emu does not "
        f"replay; the analytic estimate for the largest collective ({largest.bytes / 1e6:.1f} MB) on a ring is "
        f"{estimate / 1000:.2f} ms (docs/physics.md); use --fabric ina or at most {limit} workers")


def _calibrate(trace: Trace, config: ReplayConfig, trace_path: str | None,
               on_status: Callable[[str], None] | None) -> tuple[ReplayConfig, dict]:
    """Choose the smallest dilation at which the emulator keeps up (docs/design.md: ``--tdf auto``).

    One iteration unpaced measures the work ``W``: the dilation cannot be below the one that
    spreads ``W`` over the emulated iteration, so the first probe runs at 1.5 times that. Each
    probe (two iterations, paced) measures the p99 lag and the reorder error. Lag builds up
    while the links are busy: with ``B`` the emulated time an endpoint's link is busy per
    iteration and ``A`` the wall work of those bursts, ``lag(d) = A / d - B``; a probe at ``d0``
    gives ``A = d0 (lag0 + B)``, and the next probe runs where the model puts the lag at half
    the tolerance (with a 20% margin), until a probe is within it (at most ``MAX_PROBES``).
    The run then gets ``MARGIN`` more: it may drift further than the probes' first iterations.
    """
    def status(text: str) -> None:
        if on_status is not None:
            on_status(text)

    status(f"calibrating: measuring the work (payload scale {config.payload_scale})")
    unpaced = (replace(config, clock=Clock.SYNC, tdf=None, iters=1) if config.network.synchronizable
               else replace(config, tdf=UNPACED_TDF, iters=1))
    probe, work_s = run_once(trace, unpaced, trace_path, None, None)
    iteration = probe.iterations[0].emulated_us
    target = 0.5 * LAG_TOLERANCE * iteration
    endpoints = config.workers + (config.shards if config.network.parameter_server else 0)
    busy = max(1.0, float(config.link.serialization_us(probe.summary.bytes_sent / (2 * endpoints))))
    tdf = max(MIN_TDF, SAFETY * work_s * 1e6 / iteration)
    probes = []
    iters = min(PROBE_ITERS, config.iters or trace.iterations)
    for _ in range(MAX_PROBES):
        status(f"calibrating: {iters} iteration(s) at tdf {tdf:.3g}")
        paced, _ = run_once(trace, replace(config, tdf=tdf, iters=iters), trace_path, None, None)
        worst = max(paced.emulator.lag_us_p99, paced.emulator.reorder_error_us)
        probes.append({"tdf": tdf, "lag_us_p99": paced.emulator.lag_us_p99,
                       "reorder_error_us": paced.emulator.reorder_error_us})
        if worst <= target:
            break
        tdf = max(2.0 * tdf, 1.2 * tdf * (worst + busy) / (busy + target))
    tdf *= MARGIN
    status(f"replaying (tdf {tdf:.3g}, payload scale {config.payload_scale})")
    return replace(config, tdf=tdf), {
        "probe_work_s": work_s, "probe_iteration_us": iteration, "link_busy_us": busy, "probes": probes,
        "chosen_tdf": tdf, "chosen_payload_scale": float(config.payload_scale or 1)}


def replay(trace: Trace, config: ReplayConfig, *, trace_path: str | None = None,
           chrome_trace: str | os.PathLike[str] | None = None,
           on_progress: Callable[[float], None] | None = None,
           on_status: Callable[[str], None] | None = None,
           payload: RecordedPayload | None = None, payload_path: str | None = None) -> ReplayReport:
    """Replay ``trace`` on ``config.workers`` fake workers; returns the report.

    With ``payload_scale`` left None, R keeps the real bytes of an iteration near
    ``REAL_BYTES_PER_ITERATION``. On the wall clock with ``tdf`` left None, a short
    calibration chooses the dilation first (``_calibrate``). ``payload``: the real ranks' tensors
    (``emu run``), which the workers send in place of generated payload (``recorded_payload``).
    """
    config.check()
    config.network.check_available()
    spread = machines.current()
    if spread is not None and spread.world > 1:
        check_spreadable(config)  # before any calibration or pass
    check_scale(trace, config)
    plan_programs(trace, config.workers, trace_path or "trace", config.sparsity, config.compress,
                  switch_sums=config.switch_sums, mesh=config.mesh)  # bad input fails before any process
    calibration = None
    if config.payload_scale is None:
        config = replace(config, payload_scale=choose_payload_scale(trace, config))
    config = replace(config, clock=config.resolved_clock)
    payload, payload_note = recorded_payload(trace, config, payload, payload_path or "the payload")
    if config.clock == Clock.WALL and config.tdf is None:
        config, calibration = _calibrate(trace, config, trace_path, on_status)
    if config.compress.adaptive:
        report = _adaptive(trace, config, trace_path, chrome_trace, on_progress, on_status)
    else:
        report, _ = run_once(trace, config, trace_path, chrome_trace, on_progress, payload)
    if payload is not None or payload_note is not None:
        report = replace(report, verification=replace(
            report.verification, payload="recorded" if payload is not None else "generated", payload_note=payload_note))
    if calibration is not None:
        report = replace(report, emulator=replace(report.emulator, calibration=calibration))
    limit = sparse_ps_scale_limit(trace, config)
    if limit is not None and config.scale > limit:  # only a payload scale the user chose can be
        report = replace(report, emulator=replace(report.emulator, trustworthy=False, advice=(
            f"--payload-scale {config.scale} leaves the parameter-server shards fewer than "
            f"{MIN_SPARSE_BLOCKS_PER_SHARD} real sparse blocks each, so the busiest shard's load, and the "
            f"iteration time, depend on R: use --payload-scale {_power_of_two_below(limit)} or auto")))
    return report


def _adaptive(trace: Trace, config: ReplayConfig, trace_path: str | None,
              chrome_trace: str | os.PathLike[str] | None, on_progress: Callable[[float], None] | None,
              on_status: Callable[[str], None] | None) -> ReplayReport:
    """``--compress adaptive``: replay pass after pass until every iteration's choices are those
    its own measurement calls for (emu.replay.adaptive); the last pass's report, with the wall
    time of them all."""
    reports: list[ReplayReport] = []

    def one(cfg: ReplayConfig) -> list[float]:
        report, _ = run_once(trace, cfg, trace_path, chrome_trace, on_progress)
        reports.append(report)
        assert report.compression is not None and report.compression.adaptive is not None
        return [step.bandwidth_bps for step in report.compression.adaptive.steps]

    # the buckets are the all_reduces the job's sparsity leaves compressible (a sparse tensor is not)
    ranks = with_sparsity(trace, config.workers, config.sparsity)
    _, passes = run_passes(config, ranks, config.iters or trace.iterations, one, on_status)
    last = reports[-1]
    assert last.compression is not None and last.compression.adaptive is not None
    compression = replace(last.compression, adaptive=replace(last.compression.adaptive, passes=passes))
    return replace(last, compression=compression,
                   emulator=replace(last.emulator, wall_s=sum(r.emulator.wall_s for r in reports)))


def _power_of_two_below(n: int) -> int:
    r = 1
    while r * 2 <= n:
        r *= 2
    return r


def run_once(trace: Trace, config: ReplayConfig, trace_path: str | None,
         chrome_trace: str | os.PathLike[str] | None,
         on_progress: Callable[[float], None] | None,
         payload: RecordedPayload | None = None) -> tuple[ReplayReport, float]:
    """One replay with a concrete configuration; the report and the seconds the run itself took."""
    programs = plan_programs(trace, config.workers, trace_path or "trace", config.sparsity, config.compress,
                             switch_sums=config.switch_sums, mesh=config.mesh)
    groups = group_table(programs)
    pools, pool_slots = ina_pools(programs, config)
    shape = config.layout()
    if payload is not None and any(op.group is not None for prog in programs for it in prog.iterations[:1]
                                   for op in it.colls):
        raise ConfigError("--payload sends the real ranks' tensors of a job of one group (emu run's), and this "
                          "trace runs collectives on sub-groups: replay it without --payload")
    if pools and shape is not None and shape.leaves > 1 and config.topology is not None \
            and config.topology.algorithm == Algorithm.HIERARCHICAL:
        raise ConfigError("hierarchical INA on several leaves aggregates the whole job's collectives only: its "
                          f"leaves hold one partial sum a chunk, and {trace_path or 'the trace'} aggregates on "
                          f"{len(pools)} sub-groups too; give topology.algorithm = \"flat\" or one leaf")
    iters = config.iters or trace.iterations
    m = config.workers
    held = _worker_hosts(config)
    worker_hosts = [(int(ws[0]), int(ws[-1]) + 1) for ws in held]  # their spans (bmv2 routes by them)
    ps_hosts = split(config.shards, min(config.shards, 2)) if config.network.parameter_server else []
    endpoint_host = [0] * m
    for h, ws in enumerate(held):
        for w in ws:
            endpoint_host[int(w)] = h
    endpoint_host += [len(held) + h for h, (a, b) in enumerate(ps_hosts) for _ in range(a, b)]

    def plan(switch_addr: str, control_addr: str) -> tuple[list[HostSetup], SwitchSetup]:
        setups = [HostSetup(index=h, role="workers", endpoints=tuple(int(w) for w in ws), config=config,
                            programs=tuple(programs[int(w)] for w in ws), iters=iters, switch_addr=switch_addr,
                            control_addr=control_addr, spans=chrome_trace is not None, payload=payload,
                            groups=groups, pools=pools, pool_slots=pool_slots)
                  for h, ws in enumerate(held)]
        setups += [HostSetup(index=len(worker_hosts) + h, role="ps", endpoints=tuple(m + i for i in range(a, b)),
                             config=config, programs=(), iters=iters, switch_addr=switch_addr,
                             control_addr=control_addr, spans=False, groups=groups)
                   for h, (a, b) in enumerate(ps_hosts)]
        sw = SwitchSetup(address=switch_addr, control_addr=control_addr, workers=m, slots=config.real_slots,
                         elements=config.elements, fabric=config.fabric,
                         worker_hosts=tuple(worker_hosts), endpoint_host=tuple(endpoint_host),
                         sync=config.resolved_clock == Clock.SYNC,
                         lookahead_us=config.lookahead_us(inside_nodes=point_to_point(programs, config)),
                         packet_rate=config.packet_rate, pools=pools, pool_slots=pool_slots)
        return setups, sw

    layout = plan_mesh(trace, m, config.mesh, trace_path or "trace")

    def build(results: list[HostResult], switch: SwitchResult, wall_s: float, cpu_s: float,
              processes: int) -> ReplayReport:
        report = build_report(trace, trace_path, config, iters, results, switch, wall_s, cpu_s, processes)
        if layout is None:
            return report
        done: dict[str, int] = {}
        for r in results:
            for role, n in r.completed.items():
                done[role] = done.get(role, 0) + n
        return replace(report, parallelism=parallelism_report(trace, layout, programs, config, iters, done))

    report, run_s, results = execute(config, plan, iters * m, build, on_progress,
                                     external=lambda: config.network.external_switch(m, config.real_slots))
    cluster = machines.current()
    if chrome_trace is not None and (cluster is None or cluster.rank == 0):  # machine 0 holds every span
        spans = {int(w): [tuple(s) for s in d.spans] for r in results for w, d in r.workers.items()}
        try:
            write_chrome_trace(spans, chrome_trace)
        except RunFailed as exc:
            exc.partial_report = report  # type: ignore[attr-defined]  # the run itself is complete
            raise
    return report, run_s


__all__ = ["ReplayError", "replay", "asdict"]
