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
must agree. Each worker notes, for every bucket of its iteration, when the bucket's collective
had its stream (its issue, or the end of the collective before it on the stream) and when it
completed; at the start of the next iteration the workers reduce these to each bucket's last
start and last end with one all_reduce of two float32 a bucket (which the replay runs for its
time: a sum standing in for the maximum, the same bytes). A bucket took from its last start to
its last end: the network's time once every worker had issued it (a worker that issued early
waits for its peers, which is not the network's doing). Every worker then reads the same number
(``measured``): the link rate at which the buckets' collectives, in the form they were sent
(compressed or not), each alone on a flat fabric's links, take that long in all (``rate_bps``,
through the closed forms). Whatever slowed them shows: a bandwidth schedule, another job on a
shared spine, oversubscription, loss. Within ``DEAD_BAND`` of the link's configured rate when the
iteration ended (above or below), the measurement reads as that rate (the closed forms' own
error is a few percent, docs/physics.md, and must not pass for congestion); further off, it is
what was measured, also above the configured rate (a schedule that dropped after the buckets
ran is seen in the next iteration's reading).
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

import math
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
MIN_RATE_BPS = 1e6  # the least rate a measurement gives (1 Mb/s): anything slower reads as this
RATE_STEPS = 48  # halvings of the measured rate's log range: far finer than any choice depends on
DEAD_BAND = 0.05  # a measured rate within 5% of the configured one is the configured one


# per replayed iteration, per compressible bucket in program order: the compressor chosen for it
# (``none`` or ``topk:R``); ``CompressOption.plan`` carries it into a pass
Plan = tuple[tuple[str, ...], ...]


def candidates(floor: float) -> list[Compressor]:
    """No compression, then top-k at each ratio of the ladder down to ``floor`` (and at ``floor``)."""
    ratios = sorted({r for r in LADDER if r >= floor} | {floor}, reverse=True)
    return [NoCompression(), *(TopK(param=r) for r in ratios if r < 1)]


def wire_us(op: Coll, comp: Compressor, bandwidth_bps: float, config: ReplayConfig) -> float:
    """One bucket's collective alone on the links at ``bandwidth_bps``, in ``comp``'s form, without
    the codec's compute (the fabric's closed form, with the bucket's sparsity where it stays
    uncompressed, as predict times it). On a flat fabric even where the replay has a topology:
    what the leaves, their spine and other jobs do to the buckets is in the rate measured, which
    this form reads (and predict's topology forms take dense all_reduces only)."""
    link = LinkSpec(bandwidth_bps=bandwidth_bps, latency_us=config.link.latency_us)
    coll = op if comp.name == "none" else compressed(op, comp, config.workers, config.switch_sums)
    flat = replace(config.setting, link=link, workers=members(op, config.workers), topology=None, layout=None)
    return mechanisms.time_us(coll, flat)


def predicted_us(op: Coll, comp: Compressor, bandwidth_bps: float, config: ReplayConfig) -> float:
    """One bucket's time at ``bandwidth_bps`` with ``comp``: compress, the collective alone on the
    links (``wire_us``), decompress."""
    wire = wire_us(op, comp, bandwidth_bps, config)
    if comp.name == "none":
        return wire
    before, after = cost_us(comp, op.count, members(op, config.workers), config.compress.speed)
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
            # the last start and end of each bucket of the iteration before (a maximum: the same
            # bytes); iteration 0 has none to agree on, and still agrees, as a barrier
            n = 2 * max(1, len(buckets(r.iterations[(t - 1) % len(r.iterations)]))) if t else 2
            agree = Coll(id=agree_id, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=n, bytes=4 * n,
                         group_size=world_size)
            iterations.append(replace(body, ops=(agree, Wait(ids=(agree_id,)), *body.ops)))
        out.append(replace(r, iterations=tuple(iterations)))
    return tuple(out)


def rate_bps(work: list[tuple[Coll, Compressor]], took_us: float, config: ReplayConfig, top_bps: float) -> float:
    """The link rate at which the collectives of ``work`` (each bucket in the form it was sent),
    each alone on the links, take ``took_us`` in all: bisection of the closed forms' time, which
    falls as the rate grows, in log rate between ``MIN_RATE_BPS`` and ``top_bps``."""
    def total(bps: float) -> float:
        return sum(wire_us(op, comp, bps, config) for op, comp in work)

    if total(top_bps) >= took_us:
        return top_bps
    if total(MIN_RATE_BPS) <= took_us:
        return MIN_RATE_BPS
    lo, hi = math.log(MIN_RATE_BPS), math.log(top_bps)
    for _ in range(RATE_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(math.exp(mid)) > took_us else (lo, mid)
    return float(f"{math.exp(hi):.6g}")  # six digits: what the choice reads, and the report shows


def _work(rank: RankProgram, t: int, labels: tuple[str, ...]) -> list[tuple[Coll, Compressor]]:
    """Iteration ``t``'s buckets of ``rank`` with the compressor each was sent with."""
    ops = buckets(rank.iterations[t % len(rank.iterations)])
    return [(op, NoCompression() if label == "none" else parse_compress(label))
            for op, label in zip(ops, labels, strict=True)]


def measured(ranks: tuple[RankProgram, ...], config: ReplayConfig, plan: Plan,
             colls: dict[int, list[list[float]]], ends_us: dict[int, list[float]]) -> list[float]:
    """Per iteration, the rate the workers agree on (module docstring): the link's at time 0, then
    what the previous iteration's buckets got. ``colls``: per worker, its collectives as
    ``[iteration, id, start_us, end_us]``; ``ends_us``: when its iterations ended. A bucket's time
    is from the last member's start to the last member's end: what the network took once every
    worker had issued it (a worker that issued early waits for its peers, which is not the
    network's doing)."""
    link = config.link
    top = max([link.bandwidth_bps, *(bps for _, bps in link.schedule)])
    its = ranks[0].iterations
    spans_of: dict[int, dict[int, list[float]]] = {}  # iteration -> bucket id -> [last start, last end]
    for rows in colls.values():
        for it, i, start, end in rows:
            span = spans_of.setdefault(int(it), {}).setdefault(int(i), [start, end])
            span[0], span[1] = max(span[0], start), max(span[1], end)
    out = [link.bandwidth_at(0.0)]
    for t in range(1, len(plan)):
        ids = {op.id for op in buckets(its[(t - 1) % len(its)])}
        spans = {i: span for i, span in spans_of.get(t - 1, {}).items() if i in ids}
        done = [w for w, rows in colls.items() if len(ends_us.get(w, ())) >= t]
        if not ids or len(spans) < len(ids) or len(done) < config.workers:
            out.append(out[-1])  # the iteration did not finish everywhere (a partial run's last)
            continue
        now = min(link.bandwidth_at(ends_us[w][t - 1]) for w in done)  # configured when it ended
        got = rate_bps(_work(ranks[0], t - 1, plan[t - 1]), sum(e - s for s, e in spans.values()), config, top)
        out.append(now if abs(got - now) <= DEAD_BAND * now else got)
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
                    starts_us: list[float], colls: dict[int, list[list[float]]]) -> CompressionReport:
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
    seen = measured(ranks, config, plan, colls, ends_us)
    cands = candidates(config.compress.floor)
    return CompressionReport(
        compressor=config.compress.label, aggregation="adaptive", feedback=True, in_switch=False,
        collectives=len(buckets(its[0])), bytes_dense=round(dense / n), bytes_compressed=round(sent / n),
        ratio=dense / sent if sent else 1.0, compress_us=before / n, decompress_us=after / n,
        speed=config.compress.speed, error=None, cosine=None,
        error_sample="adaptive: each choice's error is what --compress topk:R reports", error_accumulated=None,
        adaptive=AdaptiveReport(
            floor=config.compress.floor, candidates=[c.label for c in cands], passes=1,
            agreement="each bucket's last start and last end over the workers, agreed by an all_reduce of two "
                      "float32 a bucket at the next iteration's start (in the replay's time); read as the flat link "
                      "rate at which the buckets, as sent, take that long (within 5% of the configured rate either "
                      "way, that rate)",
            steps=steps(plan, seen, starts_us)))
