"""Running a replay of one job: check it, choose the payload scale and the dilation, plan its
processes (which worker each host holds, the switch's setup), run them (``emu.replay.control.processes``)
and build the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from emu.emulator.links.topology import Hierarchy
from emu.emulator.payload.recorded import RecordedPayload
from emu.errors import ConfigError, RunFailed
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.plan import Measured, RunPlan
from emu.replay.control.processes import ReplayError, execute
from emu.replay.host.runtime import HostSetup
from emu.replay.machines import cluster as machines
from emu.replay.machines.remote import check_spreadable
from emu.replay.plan.adaptive import run_passes
from emu.replay.plan.hosts import distinct_colls, host_layout, ina_pools, point_to_point
from emu.replay.plan.layout import MeshPlan, plan_mesh
from emu.replay.plan.payloads import recorded_payload
from emu.replay.plan.programs import WorkerProgram, group_table, programs_for
from emu.replay.plan.scale import (
    MIN_SPARSE_BLOCKS_PER_SHARD,
    check_scale,
    choose_payload_scale,
    power_of_two_below,
    sparse_ps_scale_limit,
)
from emu.replay.plan.sparsity import with_sparsity
from emu.replay.report.build import LAG_TOLERANCE, build_report
from emu.replay.report.model import ReplayReport, write_chrome_trace
from emu.replay.report.parallelism import parallelism_report
from emu.replay.switch.daemon import SwitchSetup
from emu.traces.model import Trace

UNPACED_TDF = 1e-6  # the calibration probe runs as fast as it can
SAFETY = 1.5  # the first probe's dilation over the bare minimum the work allows
MAX_PROBES = 4
PROBE_ITERS = 2
MARGIN = 1.2
MIN_TDF = 0.05


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
    programs = programs_for(trace, config, trace_path or "trace")  # bad input fails before any process
    calibration = None
    if config.payload_scale is None:
        config = replace(config, payload_scale=choose_payload_scale(trace, config))
    config = replace(config, clock=config.resolved_clock)
    payload, payload_note, real_error = recorded_payload(trace, config, payload, payload_path or "the payload")
    if config.clock == Clock.WALL and config.tdf is None:
        config, calibration = _calibrate(trace, config, trace_path, on_status)
    if config.compress.adaptive:
        report = replay_adaptive(trace, config, trace_path, chrome_trace, on_progress, on_status)
    else:
        # the programs planned above: payload scale and the clock, all that changed since, plan nothing
        report, _ = run_once(trace, config, trace_path, chrome_trace, on_progress, payload, programs)
    if payload is not None or payload_note is not None:
        report = replace(report, verification=replace(
            report.verification, payload="recorded" if payload is not None else "generated", payload_note=payload_note))
    if real_error is not None and report.compression is not None:  # measured on the messages the fabric moved
        report = replace(report, compression=replace(
            report.compression, data="recorded", error=real_error.error, cosine=real_error.cosine,
            error_sample=real_error.sample, error_accumulated=real_error.accumulated,
            switch_exact=real_error.switch_exact))
        if real_error.switch_exact is False:  # the lanes the workers sent would not sum to their levels' sums
            report = replace(report, verification=replace(report.verification, ok=False))
    if calibration is not None:
        report = replace(report, emulator=replace(report.emulator, calibration=calibration))
    limit = sparse_ps_scale_limit(trace, config)
    if limit is not None and config.scale > limit:  # only a payload scale the user chose can be
        report = replace(report, emulator=replace(report.emulator, trustworthy=False, advice=(
            f"--payload-scale {config.scale} leaves the parameter-server shards fewer than "
            f"{MIN_SPARSE_BLOCKS_PER_SHARD} real sparse blocks each, so the busiest shard's load, and the "
            f"iteration time, depend on R: use --payload-scale {power_of_two_below(limit)} or auto")))
    return report


def replay_adaptive(trace: Trace, config: ReplayConfig, trace_path: str | None,
              chrome_trace: str | os.PathLike[str] | None, on_progress: Callable[[float], None] | None,
              on_status: Callable[[str], None] | None) -> ReplayReport:
    """``--compress adaptive``: replay pass after pass until every iteration's choices are those
    its own measurement calls for (emu.replay.plan.adaptive); the last pass's report, with the wall
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


def run_once(trace: Trace, config: ReplayConfig, trace_path: str | None,
             chrome_trace: str | os.PathLike[str] | None,
             on_progress: Callable[[float], None] | None,
             payload: RecordedPayload | None = None,
             programs: list[WorkerProgram] | None = None) -> tuple[ReplayReport, float]:
    """One replay with a concrete configuration; the report and the seconds the run itself took.
    ``programs``: ``programs_for(trace, config)`` where the caller has them already."""
    plan = plan_run(trace, config, trace_path, chrome_trace is not None, payload, programs)
    report, run_s, results = execute(plan, on_progress)
    cluster = machines.current()
    if chrome_trace is not None and (cluster is None or cluster.rank == 0):  # machine 0 holds every span
        spans = {int(w): [tuple(s) for s in d.spans] for r in results for w, d in r.workers.items()}
        try:
            write_chrome_trace(spans, chrome_trace)
        except RunFailed as exc:
            exc.partial_report = report  # type: ignore[attr-defined]  # the run itself is complete
            raise
    return report, run_s


def plan_run(trace: Trace, config: ReplayConfig, trace_path: str | None, spans: bool,
             payload: RecordedPayload | None = None, programs: list[WorkerProgram] | None = None) -> RunPlan:
    """Every process of one job's replay (``spans``: the workers keep their spans for a chrome trace;
    ``programs``: ``programs_for(trace, config)``, planned here where None)."""
    path = trace_path or "trace"
    if programs is None:
        programs = programs_for(trace, config, path)
    groups = group_table(programs)
    config.network.check_collectives(distinct_colls(programs), config.setting)
    pools, pool_slots = ina_pools(programs, config)
    shape = config.layout()
    if payload is not None and any(op.group is not None for prog in programs for it in prog.iterations[:1]
                                   for op in it.colls):
        raise ConfigError("--payload sends the real ranks' tensors of a job of one group (emu run's), and this "
                          "trace runs collectives on sub-groups: replay it without --payload")
    if pools and shape is not None and shape.leaves > 1 and config.topology is not None \
            and config.topology.algorithm == Hierarchy.HIERARCHICAL:
        raise ConfigError("hierarchical INA on several leaves aggregates the whole job's collectives only: its "
                          f"leaves hold one partial sum a chunk, and {path} aggregates on "
                          f"{len(pools)} sub-groups too; give topology.algorithm = \"flat\" or one leaf")
    iters = config.iters or trace.iterations
    m = config.workers
    hosts = host_layout(shape, [m], [config.shards if config.network.parameter_server else 0], config.host_processes,
                        config.shard_hosts)
    setups = [HostSetup(index=h, role="workers", endpoints=tuple(int(w) for w in ws), config=config,
                        programs=tuple(programs[int(w)] for w in ws), iters=iters, switch_addr="", control_addr="",
                        spans=spans, payload=payload, groups=groups, pools=pools, pool_slots=pool_slots)
              for h, ws in enumerate(hosts.workers)]
    setups += [HostSetup(index=len(hosts.workers) + h, role="ps", endpoints=tuple(m + i for i in range(a, b)),
                         config=config, programs=(), iters=iters, switch_addr="", control_addr="", spans=False,
                         groups=groups)
               for h, (a, b) in enumerate(hosts.shards[0])]
    switch = SwitchSetup(address="", control_addr="", workers=m, slots=config.real_slots, elements=config.elements,
                         fabric=config.fabric, worker_hosts=hosts.spans, endpoint_host=hosts.endpoint_host,
                         sync=config.resolved_clock == Clock.SYNC,
                         lookahead_us=config.lookahead_us(inside_nodes=point_to_point(programs, config)),
                         queue_bound=config.queues_bound_windows(inside_nodes=point_to_point(programs, config)),
                         packet_rate=config.packet_rate, pools=pools, pool_slots=pool_slots)
    reporter = _OneJob(trace, trace_path, config, iters,
                       plan_mesh(trace, m, config.mesh, path, config.moe_imbalance, config.seed), programs)
    return RunPlan(config=config, hosts=tuple(setups), switch=switch, total=iters * m, reporter=reporter,
                   external=True)


@dataclass(frozen=True)
class _OneJob:
    """The report of one job's run (``emu.replay.control.plan.Reporter``)."""

    trace: Trace
    trace_path: str | None
    config: ReplayConfig
    iters: int
    layout: MeshPlan | None
    programs: list[WorkerProgram]

    def build(self, measured: Measured) -> ReplayReport:
        report = build_report(self.trace, self.trace_path, self.config, self.iters, measured, self.programs[0])
        if self.layout is None:
            return report
        done: dict[str, int] = {}
        for r in measured.hosts:
            for role, n in r.completed.items():
                done[role] = done.get(role, 0) + n
        return replace(report, parallelism=parallelism_report(self.trace, self.layout, self.programs, self.config,
                                                              self.iters, done))


__all__ = ["ReplayError", "plan_run", "replay", "run_once"]
