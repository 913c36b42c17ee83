"""Several jobs sharing one fabric (docs/topology.md, "Several jobs").

``emu replay A.json B.json --workers 64,32`` runs the jobs at once on one fabric: each job runs its
own trace on its own workers, with its own collectives, its own share of the switch's slot pool
and its own verification; what they share is the switch and, on a topology, the leaves' links to
the spine. Then each job runs alone on the same fabric, at the same place, with the same share of
the pool, and the report gives each job's iteration time shared and alone, and the slowdown: what
the other jobs' traffic cost it (with nothing shared, exactly 1).

Decisions (docs/topology.md says why):

- **Jobs hold whole nodes**, as cluster schedulers allocate them: a node's NICs and ports carry
  one job's traffic. ``allocation`` hands the fabric's nodes out ``contiguous`` (job 0 first, then
  job 1, ...) or ``interleaved`` (node by node in turn, so that jobs share leaves); a job's
  workers sit on its nodes as the topology's ``placement`` says (packed, spread, random); a listed
  placement gives every worker's node, job after job, and no node may hold two jobs.
- **The slot pool is partitioned statically**: each of J jobs gets ``slots // J`` slots, as
  SwitchML partitions its pool among jobs. ATP's first-come sharing (with a fallback to the
  hosts when a slot is taken) is not built. A job alone keeps its share, so the slowdown is the
  neighbours' traffic alone; what the share itself costs, a replay of the job with ``--slots``
  tells.
- Job j's workers are numbered from 0 in the job (its headers carry j), its seed is ``seed + j``,
  and options that name workers (``--straggler``) apply to each job's own numbering. The jobs
  share one payload scale, so that the shared and alone replays send the same rows.
- The top of the report is job 0's (its trace, iterations and summary) with the whole fabric's
  utilisation, switch counters, verification and emulator figures; ``jobs`` gives every job.
- ``--compress adaptive``: every job chooses for itself from what its own buckets got, and the
  shared run is repeated until every job's choices are those its measurements call for
  (``_adaptive_shared``); each job alone runs its own passes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from emu.emulator import fabric as fabrics
from emu.emulator.links.topology import Allocation, Layout, Placement, SlotPolicy
from emu.emulator.protocol.wire import MAX_WORKERS_SOFTWARE
from emu.errors import ConfigError, RunFailed
from emu.lifetime import Terminated
from emu.replay.config.design import resolved_design
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.plan import Measured, RunPlan
from emu.replay.control.processes import execute
from emu.replay.host.runtime import HostSetup
from emu.replay.orchestrator import replay_adaptive, run_once
from emu.replay.plan.adaptive import corrected, initial_plan
from emu.replay.plan.hosts import host_layout, point_to_point
from emu.replay.plan.layout import has_subgroups
from emu.replay.plan.programs import WorkerProgram, programs_for
from emu.replay.plan.scale import check_scale, scale_for, sparse_ps_scale_limit
from emu.replay.plan.sparsity import with_sparsity
from emu.replay.report.build import build_report, utilisation
from emu.replay.report.model import CompressionReport, JobReport, ReplayReport, Verification
from emu.replay.switch.daemon import SwitchSetup
from emu.traces.model import Trace

MAX_JOBS = 16  # each job adds its parameter-server processes, and every process gates every clock window


@dataclass(frozen=True)
class Jobs:
    """The jobs sharing the fabric: each job's workers, and how nodes and slots are shared."""

    workers: tuple[int, ...]
    allocation: Allocation = Allocation.CONTIGUOUS
    slot_policy: SlotPolicy = SlotPolicy.STATIC

    def check(self, config: ReplayConfig) -> None:
        """Refuse what several jobs cannot share: ``config`` is the fabric's, with every job's workers."""
        if not 2 <= len(self.workers) <= MAX_JOBS:
            raise ConfigError(f"several jobs are 2 to {MAX_JOBS} traces, each with its --workers")
        if min(self.workers) < 1:
            raise ConfigError(f"--workers {','.join(map(str, self.workers))}: every job needs at least 1 worker")
        shards = sum(config.ps_shards or m for m in self.workers) if config.network.parameter_server else 0
        if sum(self.workers) + shards > MAX_WORKERS_SOFTWARE:
            raise ConfigError(f"--workers {','.join(map(str, self.workers))}: the jobs' workers (and parameter-"
                              f"server shards) together must be at most {MAX_WORKERS_SOFTWARE}")
        if config.network.external:
            raise ConfigError(f"--fabric {config.fabric}: several jobs share a software fabric "
                              f"({fabrics.listing(True)}); the P4 program's job table holds one job")
        if config.resolved_clock != Clock.SYNC:
            raise ConfigError("several jobs replay on the synchronized clock only (their shared and alone times "
                              f"must be exact to compare): drop --clock wall and --tdf, and use {fabrics.listing(True)}")
        if self.pool(config) // len(self.workers) < 1:
            raise ConfigError(f"--slots {config.emulated_slots}: a static partition among {len(self.workers)} jobs "
                              "needs at least one slot a job")

    def pool(self, config: ReplayConfig) -> int:
        """The switch's pool (emulated slots), sized for the fabric the jobs' nodes make (its leaves,
        and so the spine's round trip), which the jobs share."""
        placed = self.nodes(config)
        if placed is None or config.topology is None:
            return config.emulated_slots
        return replace(config, topology=replace(config.topology, fabric_nodes=placed[1])).emulated_slots

    def nodes(self, config: ReplayConfig) -> tuple[list[np.ndarray], int] | None:
        """Per job, the fabric's node of each of its workers, and the fabric's nodes (None without
        a topology)."""
        topo = config.topology
        if topo is None:
            return None
        g = topo.workers_per_node
        if topo.placement == Placement.LIST:
            listed = np.asarray(topo.nodes, np.int64)
            if len(listed) != sum(self.workers):
                raise ConfigError(f"topology.placement lists {len(listed)} nodes for {sum(self.workers)} workers "
                                  f"(the jobs' {','.join(map(str, self.workers))}): give one node per worker, job "
                                  "after job")
            ends = np.cumsum(self.workers)
            per_job = np.split(listed, ends[:-1])
            for j, nodes in enumerate(per_job):
                for i, other in enumerate(per_job[:j]):
                    both = np.intersect1d(nodes, other)
                    if len(both):
                        raise ConfigError(f"topology.placement puts jobs {i} and {j} on node {int(both[0])}: a node "
                                          "holds one job's workers (jobs hold whole nodes)")
            return per_job, int(listed.max()) + 1
        need = [-(-m // g) for m in self.workers]
        owned: list[list[int]] = [[] for _ in self.workers]
        if self.allocation == Allocation.CONTIGUOUS:
            first = np.r_[0, np.cumsum(need)[:-1]]
            owned = [list(range(int(a), int(a) + n)) for a, n in zip(first, need, strict=True)]
        else:
            node = 0
            for turn in range(max(need)):
                for j, n in enumerate(need):
                    if turn < n:
                        owned[j].append(node)
                        node += 1
        per_job = []
        for j, (m, mine) in enumerate(zip(self.workers, owned, strict=True)):
            # the job's own placement over its nodes, numbered 0.., then on the fabric's nodes
            local = replace(topo, fabric_nodes=None).layout(m, config.seed + j)
            per_job.append(np.asarray(mine, np.int64)[local.node])
        return per_job, sum(need)

    def configs(self, config: ReplayConfig) -> list[ReplayConfig]:
        """Each job's configuration in the shared run: its workers, seed, nodes and share of the pool."""
        placed = self.nodes(config)
        share = self.pool(config) // len(self.workers)
        out = []
        for j, m in enumerate(self.workers):
            topo = config.topology
            if placed is not None and topo is not None:
                per_job, fabric_nodes = placed
                topo = replace(topo, placement=Placement.LIST, nodes=tuple(int(n) for n in per_job[j]),
                               fabric_nodes=fabric_nodes)
            cfg = replace(config, workers=m, seed=config.seed + j, topology=topo, slots=share)
            cfg.check()
            out.append(cfg)
        return out


def payload_scale(traces: list[Trace], config: ReplayConfig, jobs: Jobs) -> int:
    """One R for every job: the smallest power of two that keeps the jobs' real bytes of an
    iteration, together, within budget (and no coarser than a sparse parameter server allows)."""
    if config.payload_scale is not None:
        return config.payload_scale
    real = sum(max(sum(op.bytes for op in it.colls) for r in t.ranks for it in r.iterations) * m
               for t, m in zip(traces, jobs.workers, strict=True))
    r = scale_for(real)
    for t, m in zip(traces, jobs.workers, strict=True):
        limit = sparse_ps_scale_limit(t, replace(config, workers=m))
        while limit is not None and r > max(1, limit):
            r //= 2
    return r


def replay_jobs(traces: list[Trace], config: ReplayConfig, jobs: Jobs, trace_paths: list[str] | None = None,
                on_progress: Callable[[float], None] | None = None,
                on_status: Callable[[str], None] | None = None) -> ReplayReport:
    """Replay ``traces`` at once on one fabric, job j on ``jobs.workers[j]`` workers, then each alone
    (module docstring); the report's ``jobs`` gives each job's times shared and alone."""
    paths = trace_paths or [f"trace {j}" for j in range(len(traces))]
    if len(traces) != len(jobs.workers) or len(paths) != len(traces):
        raise ConfigError(f"{len(traces)} traces and {len(jobs.workers)} worker counts: give one --workers "
                          "value per trace (64,32), or one for all")
    if config.mesh is not None:
        raise ConfigError(f"a mesh ({config.mesh.text()}: --mesh, or a design's parallelism.mesh) lays out one "
                          "sharded or split trace, and several traces are jobs of one group each: drop it")
    # every job runs as many iterations (the shorter traces' are reused cyclically), and the shared
    # time counts only iterations that ran while every job still ran (``_report``)
    config = replace(config, workers=sum(jobs.workers), iters=config.iters or max(t.iterations for t in traces))
    config.check()
    config.network.check_available()
    jobs.check(config)
    config = replace(config, payload_scale=payload_scale(traces, config, jobs), clock=Clock.SYNC)
    configs = jobs.configs(config)
    for t, cfg, path in zip(traces, configs, paths, strict=True):  # bad input fails before any process
        check_scale(t, cfg)
        if has_subgroups(t):
            raise ConfigError(f"{path} is sharded or split (its collectives run on groups of a mesh), and jobs that "
                              "share the fabric each run their collectives on the whole job: replay it alone "
                              "(docs/parallelism.md)")
        programs_for(t, cfg, path)

    def status(text: str) -> None:
        if on_status is not None:
            on_status(text)

    status(f"{len(traces)} jobs sharing the fabric (payload scale {config.scale})")
    if config.compress.adaptive:
        shared = _adaptive_shared(traces, paths, config, jobs, configs, on_progress, status)
    else:
        shared = _shared(traces, paths, config, jobs, configs, on_progress)
    assert shared.jobs is not None
    entries = list(shared.jobs)
    wall = shared.emulator.wall_s
    verification = shared.verification
    for j, (t, cfg, path) in enumerate(zip(traces, configs, paths, strict=True)):
        status(f"job {j} alone ({cfg.workers} workers)")
        try:
            solo = replay_adaptive(t, cfg, path, None, None, None) if cfg.compress.adaptive else \
                run_once(t, cfg, path, None, None)[0]
        except (RunFailed, KeyboardInterrupt, Terminated) as exc:
            # the shared run is whole: keep it, with the jobs measured alone so far
            reason = {KeyboardInterrupt: "interrupted", Terminated: "terminated"}.get(type(exc), str(exc))
            exc.partial_report = replace(  # type: ignore[union-attr]
                shared, jobs=tuple(entries), verification=verification,
                emulator=replace(shared.emulator, wall_s=wall), complete=False, reason=f"job {j} alone: {reason}")
            raise
        wall += solo.emulator.wall_s
        # the same iterations as the shared time's (iterations differ: the first starts every worker at once)
        first = [it.emulated_us for it in solo.iterations[:entries[j].overlapped]]
        alone_us = statistics.median(first) if first else None
        shared_us = entries[j].shared_us
        entries[j] = replace(entries[j], alone_us=alone_us,
                             slowdown=shared_us / alone_us if shared_us is not None and alone_us else None)
        if not solo.verification.ok:  # a replay alone that failed fails the report
            verification = replace(verification, ok=False,
                                   mismatches=verification.mismatches + solo.verification.mismatches)
    return replace(shared, jobs=tuple(entries), verification=verification,
                   emulator=replace(shared.emulator, wall_s=wall))


def _shared(traces: list[Trace], paths: list[str], config: ReplayConfig, jobs: Jobs, configs: list[ReplayConfig],
            on_progress: Callable[[float], None] | None) -> ReplayReport:
    """The jobs at once: one switch with a pool a job, hosts holding whole leaves (or nodes) of any
    job, the leaves' links shared (emu.replay.host.jobs)."""
    report, _, _ = execute(_plan(traces, paths, config, jobs, configs), on_progress)
    return report


def _adaptive_shared(traces: list[Trace], paths: list[str], config: ReplayConfig, jobs: Jobs,
                     configs: list[ReplayConfig], on_progress: Callable[[float], None] | None,
                     status: Callable[[str], None]) -> ReplayReport:
    """``--compress adaptive`` with several jobs: the shared run pass after pass until every job's
    choices are those its own measurements call for (emu.replay.plan.adaptive). A job's choice at
    an iteration's start reads only what happened before it, in every job; so each pass corrects
    the one job whose first wrong choice came earliest in emulated time (from there on, as one
    job's passes do), everything before that instant replays identically, and every pass settles
    at least one more choice. A choice's instant is when its iteration's reading was complete: the
    last end of the iteration before (``_read_by``); the choice acts only after the agreement that
    follows, which waits for every worker, so nothing it changes comes before its instant."""
    ranks = [with_sparsity(t, cfg.workers, cfg.sparsity) for t, cfg in zip(traces, configs, strict=True)]
    plans = [initial_plan(r, cfg, config.iters) for r, cfg in zip(ranks, configs, strict=True)]
    wall = 0.0
    for p in range(1, len(traces) * config.iters + 2):
        cfgs = [replace(cfg, compress=replace(cfg.compress, plan=plan)) for cfg, plan in zip(configs, plans, strict=True)]
        report = _shared(traces, paths, config, jobs, cfgs, on_progress)
        wall += report.emulator.wall_s
        assert report.jobs is not None
        wrong = []
        for j, entry in enumerate(report.jobs):
            assert entry.compression is not None and entry.compression.adaptive is not None
            steps = entry.compression.adaptive.steps
            nxt = corrected(plans[j], [s.bandwidth_bps for s in steps], ranks[j], cfgs[j])
            if nxt is not None:
                t = next(i for i in range(len(nxt)) if nxt[i] != plans[j][i])
                wrong.append((_read_by(entry, t), j, t, nxt))
        if not wrong:
            return _with_passes(report, p, wall)
        _, j, t, plans[j] = min(wrong, key=lambda w: (w[0], w[1]))
        status(f"adaptive compression: pass {p}: job {j} measured other rates before iteration {t} than its "
               "choices assumed; replaying again")
    raise AssertionError("the adaptive passes did not settle: each must fix at least one more choice")


def _read_by(entry: JobReport, t: int) -> float:
    """When job ``entry``'s reading for iteration ``t`` was complete: its iteration ``t - 1``'s last
    end (its earliest worker's start plus its span); 0 for the first, which reads nothing, and
    never for an iteration that did not end (a partial run's)."""
    if t == 0:
        return 0.0
    if t - 1 >= len(entry.iterations) or entry.compression is None or entry.compression.adaptive is None:
        return math.inf
    start = entry.compression.adaptive.steps[t - 1].start_us
    return math.inf if start is None else start + entry.iterations[t - 1].span_us


def _with_passes(report: ReplayReport, passes: int, wall_s: float) -> ReplayReport:
    """The last pass's report, saying how many passes it took and their wall time in all."""
    def counted(c: CompressionReport | None) -> CompressionReport | None:
        if c is None or c.adaptive is None:
            return c
        return replace(c, adaptive=replace(c.adaptive, passes=passes))

    assert report.jobs is not None
    return replace(report, compression=counted(report.compression),
                   jobs=tuple(replace(e, compression=counted(e.compression)) for e in report.jobs),
                   emulator=replace(report.emulator, wall_s=wall_s))


def _plan(traces: list[Trace], paths: list[str], config: ReplayConfig, jobs: Jobs,
          configs: list[ReplayConfig]) -> RunPlan:
    programs = [programs_for(t, cfg, path) for t, cfg, path in zip(traces, configs, paths, strict=True)]
    iters = [config.iters or t.iterations for t in traces]
    counts = [cfg.workers for cfg in configs]
    layouts = [cfg.layout() for cfg in configs]
    layout = None
    if layouts[0] is not None:
        lays = [lay for lay in layouts if lay is not None]
        layout = Layout(node=np.concatenate([lay.node for lay in lays]), nic=np.concatenate([lay.nic for lay in lays]),
                        leaf=np.concatenate([lay.leaf for lay in lays]), leaves=lays[0].leaves)
    ps = config.network.parameter_server
    hosts = host_layout(layout, counts, [cfg.shards if ps else 0 for cfg in configs], config.host_processes,
                        config.shard_hosts)
    common = dict(switch_addr="", control_addr="", spans=False)
    setups = []
    for h, ws in enumerate(hosts.workers):
        parts = []
        for j in np.unique(hosts.job_of[ws]):
            mine = hosts.local_of[ws[hosts.job_of[ws] == j]]
            parts.append(HostSetup(index=h, role="workers", endpoints=tuple(int(w) for w in mine),
                                   config=configs[j], programs=tuple(programs[j][int(w)] for w in mine),
                                   iters=iters[j], job=int(j), **common))
        setups.append(HostSetup(index=h, role="workers", endpoints=tuple(int(w) for w in ws), config=config,
                                programs=(), iters=max(iters), parts=tuple(parts), jobs=tuple(configs), **common))
    index = len(hosts.workers)
    for j, spans in enumerate(hosts.shards):
        for a, b in spans:
            setups.append(HostSetup(index=index, role="ps", endpoints=tuple(counts[j] + i for i in range(a, b)),
                                    config=configs[j], programs=(), iters=iters[j], job=j, **common))
            index += 1
    sw = SwitchSetup(address="", control_addr="", workers=sum(counts), slots=config.real_slots,
                     elements=config.elements, fabric=config.fabric, worker_hosts=hosts.spans,
                     endpoint_host=hosts.endpoint_host, sync=True,
                     lookahead_us=min(cfg.lookahead_us(inside_nodes=point_to_point(p, cfg))
                                      for cfg, p in zip(configs, programs, strict=True)),
                     queue_bound=all(cfg.queues_bound_windows(inside_nodes=point_to_point(p, cfg))
                                     for cfg, p in zip(configs, programs, strict=True)),
                     job_workers=tuple(counts), job_slots=tuple(cfg.real_slots for cfg in configs),
                     job_base=tuple(int(b) for b in hosts.base), packet_rate=config.packet_rate)
    total = sum(i * m for i, m in zip(iters, counts, strict=True))
    return RunPlan(config=config, hosts=tuple(setups), switch=sw, total=total,
                   reporter=_Shared(traces, paths, config, jobs, configs, iters, programs))


@dataclass(frozen=True)
class _Shared:
    """The report of the jobs' shared run (``emu.replay.control.plan.Reporter``)."""

    traces: list[Trace]
    paths: list[str]
    config: ReplayConfig
    jobs: Jobs
    configs: list[ReplayConfig]
    iters: list[int]
    programs: list[list[WorkerProgram]]

    def build(self, measured: Measured) -> ReplayReport:
        return _report(self, measured)


def _report(run: _Shared, measured: Measured) -> ReplayReport:
    """Each job's report from its own results; on top, job 0's with the whole run's fabric,
    verification and emulator figures. A job's shared time is the median of its iterations that
    ended while every job still ran (after the first job ends, the others run on alone): its first
    ``overlapped`` ones, whose alone times ``replay_jobs`` compares them with."""
    traces, paths, config, jobs, configs, iters = run.traces, run.paths, run.config, run.jobs, run.configs, run.iters
    results, switch = measured.hosts, measured.switch
    per_job = [build_report(t, path, cfg, n, replace(measured, hosts=[r for r in results if r.job == j]),
                            run.programs[j][0])
               for j, (t, path, cfg, n) in enumerate(zip(traces, paths, configs, iters, strict=True))]
    top = per_job[0]
    records = {(r.job, w): d.iterations for r in results for w, d in r.workers.items()}
    # per job and iteration: its start (earliest worker) and end (last worker)
    spans = []
    for j, r in enumerate(per_job):
        rows = [rec for (job, _), rec in records.items() if job == j]
        spans.append([(min(rec[i][0] for rec in rows), max(rec[i][1] for rec in rows)) for i in range(len(r.iterations))])
    together = min((s[-1][1] for s in spans if s), default=0.0)  # when the first job ended
    elements = sum(r.verify_elements for r in results)
    mismatches = sum(r.verify_mismatches for r in results)
    verification = Verification(ok=all(r.verification.ok for r in per_job), elements_checked=elements,
                                mismatches=mismatches, segments=sum(r.payload_segments for r in results),
                                segments_without_data=sum(r.empty_segments for r in results),
                                elements_distinct=sum(r.verify_distinct for r in results))
    fallbacks: dict[str, int] = {}
    for r in results:
        for k, v in r.fallbacks.items():
            fallbacks[k] = fallbacks.get(k, 0) + v
    fabric = replace(top.fabric, retransmissions=sum(r.retransmissions for r in results),
                     lost=sum(r.lost for r in results), packets_lost=sum(r.packets_lost for r in results),
                     packets_lost_modelled=sum(r.packets_lost_modelled for r in results),
                     fallbacks=fallbacks, slots=sum(cfg.real_slots for cfg in configs), slots_emulated=jobs.pool(config),
                     **utilisation(results, records, switch.pipeline_busy_us if config.packet_rate else None))
    emulator = replace(top.emulator, events=sum(r.events for r in results),
                       real_bytes=float(sum(r.real_bytes for r in results)),
                       reordered=sum(r.reordered for r in results),
                       trustworthy=all(r.emulator.trustworthy for r in per_job),
                       advice=next((r.emulator.advice for r in per_job if r.emulator.advice), None))
    cfg_doc = {**top.config, "workers": config.workers, "seed": config.seed, "slots": jobs.pool(config),
               "processes": config.host_processes, "design": resolved_design(config),
               "jobs": {"workers": list(jobs.workers), "traces": list(paths),
                        "allocation": None if config.topology is None else jobs.allocation.value,
                        "slot_policy": jobs.slot_policy.value}}
    cfg_doc["design"]["switch"]["slots"] = jobs.pool(config)
    entries = []
    for j, (t, path, cfg, r) in enumerate(zip(traces, paths, configs, per_job, strict=True)):
        overlapped = [it.emulated_us for it, (_, end) in zip(r.iterations, spans[j], strict=True) if end <= together]
        entries.append(JobReport(
            job=j, trace={"path": path, "model": t.meta.model, "sha256": r.trace["sha256"]}, workers=cfg.workers,
            nodes=None if cfg.topology is None else sorted({int(n) for n in cfg.topology.nodes}),
            slots=cfg.emulated_slots, iterations=r.iterations, summary=r.summary, verification=r.verification,
            overlapped=len(overlapped), shared_us=statistics.median(overlapped) if overlapped else None,
            alone_us=None, slowdown=None, compression=r.compression))
    return replace(top, config=cfg_doc, verification=verification, fabric=fabric, emulator=emulator,
                   jobs=tuple(entries))


__all__ = ["Allocation", "Jobs", "SlotPolicy", "replay_jobs"]
