"""What sparsity each collective's payload follows in a replay, and what the payload held.

The payload of a sparse all_reduce (``emu.emulator.payload.generated``) must be the same on every worker,
but a trace records a rank's own fraction of non-zero blocks, and replay reuses the file's rank
programs round-robin. So one job-wide ``Sparsity`` is resolved per collective position: the
mean over the M workers of their rank's ``nonzero``, the largest ``union`` (it is a job-wide
measure: all ranks record the same), the first block size. ``--sparsity``
replaces it (``SparsityOption``); integer dtypes and other kinds stay dense. The trace's
fractions are kept whatever M (the overlap a job of M ranks would have is not known).

Per iteration the positions resolve alike where every used rank has as many iterations;
otherwise (iterations reused with different cycles) one value per position over them all.
Reports record the asked fractions (``config_summary``) and the realized ones
(``realized_report``), both weighted over the replayed collectives.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from emu.emulator.payload.generated import Realized, is_sparse, realized
from emu.errors import ConfigError
from emu.replay.config.options import ReplayConfig, SparsityOption
from emu.replay.report.model import SparsityReport
from emu.traces.model import Coll, CollKind, RankProgram, Sparsity, Trace

if TYPE_CHECKING:
    from emu.replay.plan.programs import WorkerProgram

Plan = tuple[tuple[Sparsity | None, ...], ...]  # [iteration of the cycle][collective position]
Replayed = list[tuple[int, Coll, Sparsity]]  # (seq, op, sparsity) of a replay's sparse all_reduces


def _used(trace: Trace, workers: int) -> list[tuple[RankProgram, int]]:
    """The file's rank programs that ``workers`` run, each with how many workers run it."""
    n, m = len(trace.ranks), max(1, workers)
    return [(trace.ranks[r], m // n + (r < m % n)) for r in range(min(m, n))]


def _cycle(used: list[tuple[RankProgram, int]]) -> int:
    lengths = {len(r.iterations) for r, _ in used}
    return lengths.pop() if len(lengths) == 1 else 1


def _sparsifiable(op: Coll) -> bool:
    return op.kind == CollKind.ALL_REDUCE and op.dtype.is_float


def _resolve(ops: list[tuple[Coll, int]], option: SparsityOption, workers: int) -> Sparsity | None:
    """One position's sparsity from its ops on the used ranks (each with its workers)."""
    if not ops or not _sparsifiable(ops[0][0]) or option.source == "none":
        return None
    # the framework's sparse all_reduce stays one whatever fractions are asked (its rows are its blocks)
    tensor = [op.sparsity for op, _ in ops if op.sparsity is not None and op.sparsity.sparse_tensor]
    if option.source == "option":
        assert option.nonzero is not None
        return Sparsity(block_elements=option.block_elements or (tensor[0].block_elements if tensor else option.block),
                        nonzero=option.nonzero, union=option.union_at(workers), sparse_tensor=bool(tensor))
    measured = [(op.sparsity, w) for op, w in ops if op.sparsity is not None]
    if not measured:
        return None
    nonzero = sum(s.nonzero * w for s, w in measured) / sum(w for _, w in measured)  # the workers' mean
    return Sparsity(block_elements=option.block_elements or measured[0][0].block_elements, nonzero=nonzero,
                    union=max(nonzero, *(s.union for s, _ in measured)), sparse_tensor=bool(tensor))


def job_plan(trace: Trace, workers: int, option: SparsityOption) -> Plan:
    """Per iteration of the cycle and per collective position: the sparsity every worker follows."""
    used = _used(trace, workers)
    cycle = _cycle(used)
    same = len({len(r.iterations) for r, _ in used}) == 1
    plan = []
    for i in range(cycle):
        its = [(r.iterations[i], w) for r, w in used] if same else [(it, w) for r, w in used for it in r.iterations]
        positions = max((len(it.colls) for it, _ in its), default=0)
        plan.append(tuple(_resolve([(it.colls[p], w) for it, w in its if p < len(it.colls)], option, workers)
                          for p in range(positions)))
    return tuple(plan)


def _row(plan: Plan, iteration: int) -> tuple[Sparsity | None, ...]:
    return plan[iteration % len(plan)] if plan else ()


def with_sparsity(trace: Trace, workers: int, option: SparsityOption | None) -> tuple[RankProgram, ...]:
    """The trace's rank programs with every collective's sparsity set to the job's (the same
    objects where nothing changes, so a dense replay runs exactly the trace's programs)."""
    option = option or SparsityOption()
    if option.source == "trace" and option.block_elements is not None and not trace_has_sparsity(trace):
        raise ConfigError("--sparsity-block: the trace recorded no sparsity to cut into blocks (it is dense); "
                          "give --sparsity F or F:U with it, or drop it")
    plan = job_plan(trace, workers, option)
    out = []
    for r in trace.ranks:
        iterations, rank_changed = [], False
        for j, it in enumerate(r.iterations):
            row = _row(plan, j)
            ops, pos, changed = [], 0, False
            for op in it.ops:
                if isinstance(op, Coll):
                    want = row[pos] if pos < len(row) else None
                    pos += 1
                    if op.sparsity != want:
                        op, changed = replace(op, sparsity=want), True
                ops.append(op)
            iterations.append(replace(it, ops=tuple(ops)) if changed else it)
            rank_changed |= changed
        out.append(replace(r, iterations=tuple(iterations)) if rank_changed else r)
    return tuple(out)


def replayed_sparse(trace: Trace, config: ReplayConfig, iters: int, program: WorkerProgram | None = None) -> Replayed:
    """(seq, op, sparsity) of every sparse collective of the replay, read from worker 0's program as
    planned (``program``, or planned here; the collectives' sizes and kinds are the same on every
    worker): with ``--compress`` the all_reduces it compressed are coded densely and not among them,
    and the stream numbers count what compression adds (PowerSGD's second all_reduce, adaptive
    compression's agreement)."""
    if program is None:
        from emu.replay.plan.programs import programs_for

        program = programs_for(trace, config, first=1)[0]
    out = []
    for it in range(iters):
        for k, op in enumerate(program.iterations[it % len(program.iterations)].colls):
            if is_sparse(op.sparsity, op.dtype.value):
                assert op.sparsity is not None
                out.append((program.seq(it, k), op, op.sparsity))
    return out


def trace_has_sparsity(trace: Trace) -> bool:
    return any(op.sparsity is not None and _sparsifiable(op)
               for r in trace.ranks for it in r.iterations for op in it.colls)


def config_summary(trace: Trace, config: ReplayConfig, sparse: Replayed) -> dict | None:
    """``config.sparsity`` of the report: null when the replay is dense and the trace recorded
    none; else the source and the asked fractions of the replayed sparse all_reduces
    (``replayed_sparse``), weighted by the collectives' bytes (6 digits)."""
    option = config.sparsity
    if not sparse:
        if option.source == "none" and trace_has_sparsity(trace):
            return {"source": "none", "nonzero": None, "union": None, "block_elements": None}
        return None if option.source != "option" else {
            "source": "option", "nonzero": option.nonzero, "union": option.union,
            "block_elements": option.block}  # asked, though no float all_reduce took it
    weight = sum(float(op.bytes) for _, op, _ in sparse) or 1.0
    blocks = sorted({s.block_elements for _, _, s in sparse})
    return {"source": option.source,
            "nonzero": round(sum(op.bytes * s.nonzero for _, op, s in sparse) / weight, 6),
            "union": round(sum(op.bytes * s.union for _, op, s in sparse) / weight, 6),
            "block_elements": blocks[0] if len(blocks) == 1 else blocks}


def realized_report(config: ReplayConfig, sparse: Replayed) -> SparsityReport | None:
    """What the payload of the replayed sparse all_reduces (``replayed_sparse``) held, from the same
    hashes that made it: the fractions of their blocks non-zero on some worker and on each worker
    (mean), block-weighted. None when every all_reduce was dense."""
    if not sparse:
        return None
    total = Realized()
    r = config.scale
    for seq, op, s in sparse:
        real = -(-op.count // r) if op.count else 0
        total = total + realized(config.seed, seq, real, config.workers, s, op.dtype.value)
    blocks = max(1, total.blocks)
    return SparsityReport(collectives=len(sparse), blocks=total.blocks, union_fraction=total.union / blocks,
                          nonzero_fraction=total.held / (blocks * config.workers))
