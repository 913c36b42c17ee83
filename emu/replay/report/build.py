"""From what the hosts and the switch measured to the replay's report (docs/design.md, "Report").

An iteration counts once every worker finished it; its time runs from the earliest worker's
start to the last worker's end, and its compute and communication are the critical (last)
worker's. Trustworthy: on the synchronized clock, nothing handed over out of order (true by
construction, checked); on the wall clock, p99 lag and reorder error within ``LAG_TOLERANCE``
of the median iteration.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any

import numpy as np

import emu
from emu.emulator.mechanisms import choose
from emu.emulator.protocol.wire import agg_wire_bytes
from emu.replay.config.design import resolved_design
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.messages import CARRIED_UNIT, HostResult
from emu.replay.control.plan import Measured
from emu.replay.host.lag import LagHistogram
from emu.replay.plan.adaptive import adaptive_report
from emu.replay.plan.compression import report as compression_report
from emu.replay.plan.programs import WorkerProgram
from emu.replay.plan.sparsity import Replayed, config_summary, realized_report, replayed_sparse, with_sparsity
from emu.replay.report.model import (
    REPORT_VERSION,
    BridgeReport,
    CompressionReport,
    EmulatorReport,
    FabricReport,
    IterationReport,
    LinkUsage,
    ReplayReport,
    SparsityReport,
    Summary,
    Verification,
)
from emu.traces.io import trace_digest
from emu.traces.model import Trace
from emu.traces.noise import assess, overhead_line, profiler_overhead

LAG_TOLERANCE = 0.01  # of the median iteration: docs/design.md's bar for a trustworthy run


def build_report(trace: Trace, trace_path: str | None, config: ReplayConfig, iters: int, measured: Measured,
                 program: WorkerProgram) -> ReplayReport:
    """``program``: worker 0's, as the run planned it (which of its collectives were sparse)."""
    results = measured.hosts
    records: dict[int, list[list[float]]] = {}
    for r in results:
        for w, d in r.workers.items():
            records[int(w)] = d.iterations
    iterations = _iterations(records, config.workers, iters)
    times = [it.emulated_us for it in iterations]
    median = statistics.median(times) if times else 0.0
    batch = trace.meta.batch_size
    summary = Summary(iteration_us_median=median, iteration_us_p99=float(np.percentile(times, 99)),
                      throughput_samples_per_s=(batch * config.workers / (median / 1e6)) if batch and median else None,
                      bytes_sent=sum(r.bytes_sent for r in results)) if times else None
    elements = sum(r.verify_elements for r in results)
    mismatches = sum(r.verify_mismatches for r in results)
    colls = {int(w): d.colls for r in results for w, d in r.workers.items()}
    compression = _compression(trace, config, records, len(iterations), colls)
    # a quantizer summed in the switch's lanes must unpack to the exact sums of its levels, or its
    # aggregate is wrong however intact the bytes
    lanes_ok = compression is None or compression.switch_exact is not False
    # a switch outside emu whose results differ from the protocol's (emu.p4.bridge) fails the run
    agrees = int(measured.switch.stats.get("bridge_differs", 0)) == 0
    verification = Verification(ok=mismatches == 0 and elements > 0 and lanes_ok and agrees, elements_checked=elements,
                                mismatches=mismatches, segments=sum(r.payload_segments for r in results),
                                segments_without_data=sum(r.empty_segments for r in results),
                                elements_distinct=sum(r.verify_distinct for r in results))
    # the payload's sparsity is reported over the iterations the run was asked for (once, for what
    # was asked and what was sent)
    sparse = replayed_sparse(trace, config, max(1, iters), program)
    return ReplayReport(report_version=REPORT_VERSION, emu_version=emu.__version__,
                        config=_config_doc(trace, config, len(iterations), sparse), trace=_trace_doc(trace, trace_path),
                        iterations=tuple(iterations), summary=summary, verification=verification,
                        emulator=_emulator(config, measured, median), fabric=_fabric(config, measured, records),
                        sparsity=_sent(config, sparse, results), compression=compression)


def _iterations(records: dict[int, list[list[float]]], workers: int, iters: int) -> list[IterationReport]:
    """Each iteration every worker finished (a partial run's last may not be): its period (the last
    end of the iteration before, or the first's earliest start, to its last end), its span (its
    earliest start to its last end), the critical (last) worker's compute and communication.

    The period is what a real job's step-to-step time measures, and the periods add up to the run;
    where workers end an iteration apart (a parameter server answers them one after another), the
    next span holds that skew too (docs/FIDELITY.md, "An iteration's span and its period")."""
    if len(records) < workers:
        iters = 0
    iters = min([iters, *(len(rec) for rec in records.values())])
    out = []
    last_end = None
    for i in range(iters):
        rows = {w: rec[i] for w, rec in records.items() if i < len(rec)}
        start = min(row[0] for row in rows.values())
        crit = max(rows, key=lambda w: (rows[w][1], -w))
        s, e, comp, blocked, comm = rows[crit]
        out.append(IterationReport(index=i, emulated_us=e - (start if last_end is None else last_end),
                                   compute_us=comp, comm_us=comm, exposed_comm_us=blocked, critical_worker=crit,
                                   start_offset_us=s - start, span_us=e - start))
        last_end = e
    return out


def _trust(config: ReplayConfig, results: list[HostResult], median: float
           ) -> tuple[bool, str | None, float | None, float | None]:
    """Whether the run can be trusted, the advice where not, and the wall clock's p99 and largest lag."""
    reordered = sum(r.reordered for r in results)
    reorder_error = max((r.reorder_error_us for r in results), default=0.0)
    if config.resolved_clock == Clock.SYNC:
        # Order is guaranteed by construction; the links still count inversions, as a self-check.
        if reordered == 0:
            return True, None, None, None
        return False, (f"{reordered} link hand-overs happened out of emulated-time order on the synchronized clock, "
                       "which should be impossible: please report it with this trace and command"), None, None
    lag = LagHistogram()
    for r in results:
        if r.lag:
            lag.merge(LagHistogram.from_dict(r.lag))
    lag_p99, lag_max = lag.quantile(0.99), lag.max_us
    # docs/design.md: p99 lag within 1% of the iteration and nothing handled out of emulated order.
    # A packet-level inversion is measured as the most it can shift an endpoint's times; it must
    # stay within the same 1% (docs/design-notes.md).
    if lag_p99 <= LAG_TOLERANCE * median and reorder_error <= LAG_TOLERANCE * median:
        return True, None, lag_p99, lag_max
    return False, (f"the emulator trailed the emulated schedule (p99 lag {lag_p99:.0f} us; out-of-order "
                   f"hand-overs could shift times by up to {reorder_error:.0f} us) against a {median:.0f} us "
                   f"iteration: raise --tdf (now {config.dilation:g}) or --payload-scale (now {config.scale}), "
                   "or use the synchronized clock (--clock sync)"), lag_p99, lag_max


def _emulator(config: ReplayConfig, measured: Measured, median: float) -> EmulatorReport:
    results, switch, wall_s = measured.hosts, measured.switch, measured.wall_s
    trustworthy, advice, lag_p99, lag_max = _trust(config, results, median)
    sync = config.resolved_clock == Clock.SYNC
    return EmulatorReport(
        clock=config.resolved_clock.value, tdf=None if sync else config.dilation, payload_scale=config.scale,
        lag_us_p99=lag_p99, lag_us_max=lag_max, trustworthy=trustworthy, reordered=sum(r.reordered for r in results),
        reorder_error_us=max((r.reorder_error_us for r in results), default=0.0), wall_s=wall_s,
        cpu_percent=100.0 * measured.cpu_s / wall_s / (os.cpu_count() or 1) if wall_s else 0.0,
        processes=measured.processes, events=sum(r.events for r in results), advice=advice,
        windows=switch.windows if sync else None, real_bytes=float(sum(r.real_bytes for r in results)))


def _fabric(config: ReplayConfig, measured: Measured, records: dict[int, list[list[float]]]) -> FabricReport:
    results, switch = measured.hosts, measured.switch
    stats = switch.stats
    fallbacks: dict[str, int] = {}
    for r in results:
        for k, v in r.fallbacks.items():
            fallbacks[k] = fallbacks.get(k, 0) + v
    return FabricReport(
        name=config.fabric, packets=int(stats.get("packets", 0)),
        retransmissions=sum(r.retransmissions for r in results),
        duplicates=int(stats.get("duplicates", 0)), slots=config.real_slots, slots_emulated=config.emulated_slots,
        results=int(stats.get("results", 0)), answered=int(stats.get("answered", 0)),
        dropped=int(stats.get("dropped", 0)), lost=sum(r.lost for r in results),
        packets_lost=sum(r.packets_lost for r in results),
        packets_lost_modelled=sum(r.packets_lost_modelled for r in results), segments=switch.segments, fallbacks=fallbacks,
        invalid=int(stats.get("invalid", 0)), malformed=int(stats.get("malformed", 0)),
        stale=int(stats.get("stale", 0)), bridge=_bridge(stats),
        **utilisation(results, records, switch.pipeline_busy_us if config.packet_rate else None))


def _bridge(stats: dict[str, int]) -> BridgeReport | None:
    """The bridge's counters (emu.p4.bridge.BridgeStats: ``bridge_*``), where the switch is outside emu."""
    if "bridge_frames" not in stats:
        return None
    return BridgeReport(**{f.name: int(stats.get(f"bridge_{f.name}", 0)) for f in dataclasses.fields(BridgeReport)})


def _config_doc(trace: Trace, config: ReplayConfig, iters: int, sparse: Replayed) -> dict[str, Any]:
    """The report's ``config``: the options as used."""
    link = config.link
    sync = config.resolved_clock == Clock.SYNC
    return {"workers": config.workers, "fabric": config.fabric, "iters": iters,
            "bandwidth_bps": None if math.isinf(link.bandwidth_bps) else link.bandwidth_bps,
            "bandwidth_schedule": [list(step) for step in link.schedule] or None,
            "latency_us": link.latency_us, "loss": link.loss, "jitter_us": link.jitter_us,
            "clock": config.resolved_clock.value, "tdf": None if sync else config.dilation,
            "payload_scale": config.scale, "seed": config.seed,
            "slots": config.emulated_slots, "elements": config.elements,
            "packet_wire_bytes": agg_wire_bytes(config.elements), "rto_us": config.timeout_rto_us,
            "processes": config.host_processes, "ps_shards": config.shards if config.network.parameter_server else None,
            "stragglers": [st.text for st in config.stragglers] or None, "design": resolved_design(config),
            "sparsity": config_summary(trace, config, sparse),
            "compress": {"compressor": config.compress.label, "speed": config.compress.speed}
            if config.compress.active else None}


def _trace_doc(trace: Trace, trace_path: str | None) -> dict[str, Any]:
    meta = trace.meta
    return {"path": trace_path, "model": meta.model, "source": meta.source.value,
            "world_size": meta.world_size, "backend": meta.backend, "params": meta.params,
            "batch_size": meta.batch_size, "iterations": trace.iterations, "sha256": trace_digest(trace),
            "gaps": list(meta.gaps),  # what the source lacked (a live trace: how its compute was measured)
            # how much longer the capture's profiled steps took than its own unprofiled ones (where it
            # timed them: meta.noise.unprofiled_step_us)
            **({"profiler_overhead": round(o, 4)} if (o := profiler_overhead(trace)) is not None else {}),
            # why the trace's steps may not be a quiet machine's (meta.noise, or for a trace written
            # before it, the spread of its steps), and the profiler's overhead where it reaches
            # PROFILER_OVERHEAD: only where there is a reason
            **({"noise": lines} if (lines := _noise_lines(trace)) else {})}


def _noise_lines(trace: Trace) -> list[str]:
    lines = list((trace.meta.noise or assess(trace)).busy)
    overhead = overhead_line(trace)
    return lines + [overhead] if overhead else lines


def _compression(trace: Trace, config: ReplayConfig, records: dict[int, list[list[float]]],
                 iters: int, colls: dict[int, list[list[float]]]) -> CompressionReport | None:
    """``iters``: the iterations every worker completed (a partial run's last may be unfinished);
    ``colls``: each worker's collectives' times, where adaptive compression measures them."""
    if not config.compress.active:
        return None
    # which all_reduces compress depends on their sparsity as the job resolved it (a sparse tensor
    # stays as it is), so on the programs the workers ran, before compression
    ranks = with_sparsity(trace, config.workers, config.sparsity)
    if config.compress.adaptive and config.compress.plan is not None:
        plan = config.compress.plan
        ends = {w: [row[1] for row in rec[:iters]] for w, rec in records.items()}
        starts = [min(rec[t][0] for rec in records.values()) for t in range(iters)]
        return adaptive_report(ranks, config, plan, ends, starts, colls)
    return compression_report(ranks, config.workers, config.compress.compressor, config.compress.speed, config.seed,
                              switch_sums=config.switch_sums, packet_elements=config.elements,
                              samples=trace.gradient_samples)


def _sent(config: ReplayConfig, replayed: Replayed, results: list[HostResult]) -> SparsityReport | None:
    """The realized sparsity, with what the fabric sent of the sparse all_reduces (docs/sparse.md):
    which ran sparse (each mechanism's own choice), and the bytes of blocks, values and indices,
    and of headers that crossed the links (``HostResult.carried``, counted where they were sent),
    against the values the dense algorithm sends (``Mechanism.sent``'s ``dense``)."""
    report = realized_report(config, replayed)
    if report is None:
        return None
    carried: dict[str, list[int]] = {}
    for r in results:
        for seq, (payload, header) in r.carried.items():
            got = carried.setdefault(seq, [0, 0])
            got[0] += payload
            got[1] += header
    setting = config.setting
    sparse = dense = 0
    sent = headers = full = 0.0
    for seq, op, s in replayed:
        got = choose(op, setting).sent(op, setting, seq, s)
        sparse, dense = sparse + got.sparse, dense + (not got.sparse)
        payload, header = carried.get(str(seq), (0, 0))
        sent, headers, full = sent + payload / CARRIED_UNIT, headers + header / CARRIED_UNIT, full + got.dense
    return dataclasses.replace(report, sent_fraction=sent / full if full else 1.0, sparse_collectives=sparse,
                               dense_collectives=dense, sent_bytes=sent, header_bytes=headers, dense_bytes=full)


def utilisation(results: list[HostResult], records: dict[Any, list[list[float]]],
                pipeline_busy_us: float | None = None) -> dict[str, Any]:
    """Each kind of link's busy time over the replay's emulated span (first start to last end), and
    the switch's aggregation pipeline's where it has a packet rate (``records``: each worker's
    iterations, by any key)."""
    starts = [it[0] for rec in records.values() for it in rec]
    ends = [it[1] for rec in records.values() for it in rec]
    span = max(ends) - min(starts) if starts else 0.0
    if span <= 0:
        return {}
    kinds: dict[str, list[Any]] = {}
    if pipeline_busy_us is not None:
        kinds["switch pipeline"] = [1, int(round(pipeline_busy_us * 1e3)), pipeline_busy_us, "switch", 0]
    for r in results:
        for kind, (n, busy_ns, top, name, number) in r.links.items():
            have = kinds.setdefault(kind, [0, 0, -1.0, "", 0])
            have[0] += int(n)
            have[1] += int(busy_ns)  # integers: the same sum on any process layout
            if (float(top), -int(number)) > (have[2], -have[4]):  # ties: the lowest number, on any layout
                have[2], have[3], have[4] = float(top), str(name), int(number)
    usage = {kind: LinkUsage(links=n, mean=busy_ns / 1e3 / n / span, max=top / span, busiest=name)
             for kind, (n, busy_ns, top, name, _) in kinds.items() if n}
    if not usage:
        return {}
    kind = max(usage, key=lambda k: usage[k].max)
    return {"utilisation": usage,
            "busiest_link": {"kind": kind, "name": usage[kind].busiest, "utilisation": usage[kind].max}}
