"""Compression that adapts to the network (``--compress adaptive[:FLOOR]``; docs/compression.md).

Kimad's idea: a worker measures the bandwidth it has and compresses each bucket as much as that
bandwidth calls for, and no more. Here, per iteration and per gradient bucket, the workers choose
among no compression and top-k at the ratios of ``LADDER`` down to ``FLOOR`` (the most the user
lets them drop) the least aggressive whose time, as the network's closed forms
(``emu.emulator.physics.forms``) predict it at the measured bandwidth with compress and decompress
included, stays within the bucket's budget: its uncompressed time at the link's bandwidth at
time 0 (Kimad's time budget, set by the network the job was tuned for). Where nothing fits, the
fastest candidate: on a fast link compressing costs more compute than it saves.

Measuring and agreeing. Every collective needs the same size on every worker, so the workers
must agree. Each worker measures its link's rate at the instant its iteration ends (an ideal NIC
counter: the link's bandwidth then, ``--bandwidth-schedule``, with no noise); at the start of the
next iteration they agree on the least of these with a 4-byte all_reduce, which the replay runs
for its time (a sum standing in for the minimum: the same bytes), and every worker applies the
same rule to it.
The first iteration uses the link's bandwidth at time 0.

Exact by passes. emu's programs are planned before the run, so the replay runs in passes
(optimistic, as Time Warp does): a pass plans every iteration with the choices known so far,
holding the last one; after it, the measurements its run made are compared with those choices;
at the first iteration whose choice differs, the plan is corrected from there on and the run
repeated. The agreement all_reduce means no worker starts iteration ``t`` before every worker
finished ``t - 1``, so what iteration ``t`` measures does not depend on later choices, the
corrected prefix replays identically, and the passes end, each fixing at least one more
iteration (usually two or three passes in all: one per change of choice). The final pass's
choices are exactly those its own measurements call for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from emu.emulator import mechanisms
from emu.emulator.compression.compressors import Compressor, NoCompression, TopK, cost_us, parse_compress
from emu.emulator.links.spec import LinkSpec
from emu.replay.config.options import ADAPTIVE_FLOOR, ReplayConfig
from emu.replay.plan.compression import compress_iteration, compressed, compressible, members
from emu.replay.report.model import AdaptiveReport, AdaptiveStep, CompressionReport
from emu.traces.model import Coll, CollKind, Dtype, Iteration, RankProgram, Wait

LADDER = (0.1, 0.03, 0.01, 0.003, 0.001)  # top-k ratios, least to most aggressive
BUDGET_SLACK = 1e-9  # a candidate at exactly the budget fits, whatever the float rounding


# per replayed iteration, per compressible bucket in program order: the compressor chosen for it
# (``none`` or ``topk:R``); ``CompressOption.plan`` carries it into a pass
Plan = tuple[tuple[str, ...], ...]


def candidates(floor: float) -> list[Compressor]:
    """No compression, then top-k at each ratio of the ladder down to ``floor`` (and at ``floor``)."""
    ratios = sorted({r for r in LADDER if r >= floor} | {floor}, reverse=True)
    return [NoCompression(), *(TopK(param=r) for r in ratios if r < 1)]


def predicted_us(op: Coll, comp: Compressor, bandwidth_bps: float, config: ReplayConfig) -> float:
    """One bucket's time at ``bandwidth_bps`` with ``comp``: compress, the collective alone on the
    links (the fabric's closed form, with the bucket's sparsity where it stays uncompressed),
    decompress."""
    m = members(op, config.workers)
    link = LinkSpec(bandwidth_bps=bandwidth_bps, latency_us=config.link.latency_us)
    coll = op if comp.name == "none" else compressed(op, comp, config.workers, config.switch_sums)
    wire = mechanisms.time_us(coll, replace(config.setting, link=link, workers=m))  # as predict times it
    if comp.name == "none":
        return wire
    before, after = cost_us(comp, op.count, m, config.compress.speed)
    return before + wire + after


def choose(ops: list[Coll], bandwidth_bps: float, config: ReplayConfig) -> tuple[str, ...]:
    """Per bucket, the least aggressive candidate whose predicted time at ``bandwidth_bps`` is
    within the bucket's budget, its uncompressed time at the link's bandwidth at time 0 (Kimad's
    time budget: compress no more than it takes to keep the time the job had); where none is,
    the fastest."""
    cands = candidates(config.compress.floor)
    start = config.link.bandwidth_at(0.0)
    out = []
    for op in ops:
        budget = predicted_us(op, cands[0], start, config)
        times = [predicted_us(op, c, bandwidth_bps, config) for c in cands]
        fits = [i for i, t in enumerate(times) if t <= budget * (1 + BUDGET_SLACK)]
        best = fits[0] if fits else min(range(len(cands)), key=lambda i: (times[i], i))
        out.append(cands[best].label)
    return tuple(out)


def buckets(it: Iteration) -> list[Coll]:
    """The all_reduces adaptive compression may compress, in program order."""
    probe = TopK(param=ADAPTIVE_FLOOR)
    return [op for op in it.colls if compressible(op, probe)]


def initial_plan(ranks: tuple[RankProgram, ...], config: ReplayConfig, iters: int) -> Plan:
    """Every iteration's choices at the link's bandwidth at time 0."""
    return tuple(_wanted(ranks, [config.link.bandwidth_at(0.0)] * iters, config))


def _wanted(ranks: tuple[RankProgram, ...], seen: list[float], config: ReplayConfig) -> list[tuple[str, ...]]:
    """Per iteration, the choices its agreed bandwidth calls for."""
    its = ranks[0].iterations
    memo: dict[tuple[int, float], tuple[str, ...]] = {}
    out = []
    for t, bw in enumerate(seen):
        key = (t % len(its), bw)
        if key not in memo:
            memo[key] = choose(buckets(its[key[0]]), bw, config)
        out.append(memo[key])
    return out


def planned_ranks(ranks: tuple[RankProgram, ...], plan: Plan, workers: int, world_size: int, speed: float,
                  switch_sums: bool) -> tuple[RankProgram, ...]:
    """The rank programs over every iteration of the plan (one per replayed iteration), each
    beginning with the agreement's all_reduce and its wait, its buckets compressed as chosen."""
    out = []
    for r in ranks:
        iterations = []
        for t, labels in enumerate(plan):
            it = r.iterations[t % len(r.iterations)]
            chosen = dict(zip((op.id for op in buckets(it)), labels, strict=True))

            def pick(op: Coll, chosen: dict[int, str] = chosen) -> Compressor | None:
                label = chosen.get(op.id, "none")
                return None if label == "none" else parse_compress(label)

            body = compress_iteration(it, workers, pick, speed, switch_sums)
            agree_id = max((op.id for op in body.colls), default=-1) + 1
            agree = Coll(id=agree_id, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=1, bytes=4,
                         group_size=world_size)
            iterations.append(replace(body, ops=(agree, Wait(ids=(agree_id,)), *body.ops)))
        out.append(replace(r, iterations=tuple(iterations)))
    return tuple(out)


def measured(link: LinkSpec, ends_us: dict[int, list[float]], iters: int) -> list[float]:
    """Per iteration, the bandwidth the workers agree on: the link's at time 0, then the least of
    every worker's link rate when its previous iteration ended."""
    out = [link.bandwidth_at(0.0)]
    for t in range(1, iters):
        rates = [link.bandwidth_at(ends[t - 1]) for ends in ends_us.values() if len(ends) >= t]
        out.append(min(rates) if rates else out[-1])
    return out


def corrected(plan: Plan, seen: list[float], ranks: tuple[RankProgram, ...], config: ReplayConfig) -> Plan | None:
    """The plan from the first iteration whose choices differ from what its measurement calls for
    (that choice held to the end), or None where every iteration's choice is its own."""
    for t, choice in enumerate(_wanted(ranks, seen, config)):
        if choice != plan[t]:
            # from t on at the bandwidth measured before t, each iteration's own buckets
            held = _wanted(ranks, list(seen[:t]) + [seen[t]] * (len(plan) - t), config)
            return plan[:t] + tuple(held[t:])
    return None


def steps(plan: Plan, seen: list[float], starts_us: list[float]) -> list[AdaptiveStep]:
    """The report's record of the choices over time."""
    return [AdaptiveStep(iteration=t, start_us=starts_us[t] if t < len(starts_us) else None, bandwidth_bps=bw,
                         choices=list(labels))
            for t, (bw, labels) in enumerate(zip(seen, plan, strict=True))]


def run_passes(config: ReplayConfig, ranks: tuple[RankProgram, ...], iters: int,
               run: Callable[[ReplayConfig], list[float]],
               on_status: Callable[[str], None] | None = None) -> tuple[Plan, int]:
    """Replay pass after pass until the plan is what its own run measured. ``run`` replays one
    configuration (its ``compress.plan`` set) and gives the agreed bandwidth per iteration it
    measured; the caller keeps its report. Returns the final plan and the number of passes."""
    plan = initial_plan(ranks, config, iters)
    for p in range(1, iters + 2):
        seen = run(replace(config, compress=replace(config.compress, plan=plan)))
        nxt = corrected(plan, seen, ranks, config)
        if nxt is None:
            return plan, p
        changed = next(t for t in range(iters) if nxt[t] != plan[t])
        if on_status is not None:
            on_status(f"adaptive compression: pass {p} measured {seen[changed] / 1e9:g} Gb/s before iteration "
                      f"{changed}, which calls for other choices; replaying again")
        plan = nxt
    raise AssertionError("the adaptive passes did not settle: each must fix at least one more iteration")


def adaptive_report(ranks: tuple[RankProgram, ...], config: ReplayConfig, plan: Plan, ends_us: dict[int, list[float]],
                    starts_us: list[float]) -> CompressionReport:
    """The report's ``compression`` for an adaptive replay (one pass: the orchestrator sets how
    many it took): bytes and compute are means over the iterations, per worker, of what was
    chosen; each choice's error is what ``--compress topk:R`` reports for it, so none is given."""
    m = config.workers
    its = ranks[0].iterations
    dense = sent = before = after = 0.0
    for t, labels in enumerate(plan):
        for op, label in zip(buckets(its[t % len(its)]), labels, strict=True):
            size = 4 * op.count if config.switch_sums else op.bytes  # INA's packets carry int32
            dense += size
            if label == "none":
                sent += size
                continue
            c = parse_compress(label)
            sent += c.wire_bytes(op.count)
            b, a = cost_us(c, op.count, members(op, m), config.compress.speed)
            before, after = before + b, after + a
    n = max(1, len(plan))
    seen = measured(config.link, ends_us, len(plan))
    cands = candidates(config.compress.floor)
    return CompressionReport(
        compressor=config.compress.label, aggregation="adaptive", feedback=True, in_switch=False,
        collectives=len(buckets(its[0])), bytes_dense=round(dense / n), bytes_compressed=round(sent / n),
        ratio=dense / sent if sent else 1.0, compress_us=before / n, decompress_us=after / n,
        speed=config.compress.speed, error=None, cosine=None,
        error_sample="adaptive: each choice's error is what --compress topk:R reports", error_accumulated=None,
        adaptive=AdaptiveReport(
            floor=config.compress.floor, candidates=[c.label for c in cands], passes=1,
            agreement="each worker's link rate when its iteration ended; the least, agreed by a 4-byte all_reduce "
                      "at the start of the next (in the replay's time)",
            steps=steps(plan, seen, starts_us)))
