"""The programs the fake workers run: a trace's rank programs scaled to M workers.

docs/design.md: replaying at M workers a trace of a job of N ranks reuses the programs
in the file round-robin (worker w runs the program of the file's rank
``ranks[w mod len(ranks)]``), replaces every group size that equalled N with M,
and keeps compute times and full-tensor counts (weak scaling). Iterations are
reused cyclically. Sub-groups cannot be scaled and are refused unless M == N;
point-to-point peers keep their offset (peer - rank) modulo M; a broadcast root
outside 0..M-1 wraps around.

Each collective gets its number in the worker's stream (``seq``), the same on
every worker, which is how the fabrics match them up; and its payload's sparsity, also the
same on every worker (``emu.replay.sparsity``); with ``--compress``, each float all_reduce is the
collective its compressor uses (``emu.replay.compression``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from emu.emulator.links import uniform
from emu.errors import ConfigError
from emu.replay.adaptive import planned_ranks
from emu.replay.compression import with_compression
from emu.replay.config import CompressOption, SparsityOption
from emu.replay.sparsity import with_sparsity
from emu.traces.model import Coll, CollKind, Iteration, Op, Trace


def straggling(stragglers, workers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per worker: the compute slow-down factor and the sigma of per-op lognormal noise."""
    factor = np.ones(workers)
    sigma = np.zeros(workers)
    ids = np.arange(workers)
    for k, st in enumerate(stragglers):
        if st.workers:
            chosen = np.isin(ids, st.workers)
        elif st.fraction:
            chosen = uniform(seed + 1000 + k, ids, np.zeros(workers, np.int64)) < st.fraction
        else:
            chosen = np.ones(workers, bool)
        factor[chosen] *= st.factor
        sigma[chosen] = np.maximum(sigma[chosen], st.sigma)
    return factor, sigma


@dataclass(frozen=True)
class WorkerProgram:
    worker: int
    rank: int  # the file's rank whose program this is
    iterations: tuple[Iteration, ...]  # the trace's, scaled; replayed cyclically
    colls_per_iteration: int


def _scale_op(op: Op, rank: int, worker: int, n: int, m: int, path: str) -> Op:
    if isinstance(op, Coll) and op.group is not None:
        raise ConfigError(f"{path}: rank {rank} issues a {op.kind.value} on the sub-group {list(op.group)}; "
                          "this emu replays collectives of the whole job only")
    if not isinstance(op, Coll) or m == n:
        return op
    if op.group is not None:
        raise ConfigError(f"{path}: rank {rank} issues a {op.kind.value} on the sub-group {list(op.group)}; "
                          f"sub-groups cannot be scaled from {n} to {m} workers: replay with --workers {n}")
    if op.group_size != n:
        raise ConfigError(f"{path}: rank {rank} issues a {op.kind.value} of group size {op.group_size} in a "
                          f"job of {n}; only whole-job collectives scale: replay with --workers {n}")
    peer = None if op.peer is None else (worker + op.peer - rank) % m
    root = None if op.root is None else op.root % m
    return replace(op, group_size=m, peer=peer, root=root)


def plan_programs(trace: Trace, workers: int, path: str = "trace", sparsity: SparsityOption | None = None,
                  compress: CompressOption | None = None, job_workers: int | None = None,
                  switch_sums: bool = False, first: int | None = None) -> list[WorkerProgram]:
    """The programs of ``workers`` fake workers; ``job_workers``: the job's size where fewer are
    planned (``emu predict``), which a compressed all_gather's size follows; ``switch_sums``: the
    fabric sums all_reduces in a switch (INA), which takes some compressors' levels
    (``emu.replay.compression.compressed``); ``first``: plan only the first workers' programs
    (what a report reads of a run whose programs were checked), without the point-to-point check."""
    n = trace.meta.world_size
    ranks = with_sparsity(trace, workers, sparsity)
    if compress is not None and compress.adaptive and compress.plan is not None:
        ranks = planned_ranks(ranks, compress.plan, job_workers or workers, n, compress.speed, switch_sums)
    elif compress is not None and compress.active:  # adaptive before its plan: checked at its floor
        ranks = with_compression(ranks, job_workers or workers, compress.compressor, compress.speed, switch_sums)
    counts = {len(it.colls) for r in ranks for it in r.iterations}
    if len(counts) > 1:
        raise ConfigError(f"{path}: the iterations issue different numbers of collectives ({sorted(counts)}); "
                          "replay needs the same sequence in every iteration")
    per_iteration = counts.pop()
    programs = []
    for w in range(workers if first is None else min(first, workers)):
        program = ranks[w % len(ranks)]
        iterations = tuple(
            Iteration(step=it.step, measured_us=it.measured_us,
                      ops=tuple(_scale_op(op, program.rank, w, n, workers, path) for op in it.ops))
            for it in program.iterations)
        programs.append(WorkerProgram(worker=w, rank=program.rank, iterations=iterations,
                                      colls_per_iteration=per_iteration))
    if first is None:
        _check_p2p(programs, path)
    return programs


def _check_p2p(programs: list[WorkerProgram], path: str) -> None:
    """Every send must meet a recv at the same stream position on its peer."""
    m = len(programs)
    for prog in programs:
        for it in prog.iterations[:1]:
            for k, op in enumerate(it.colls):
                if op.kind not in (CollKind.SEND, CollKind.RECV):
                    continue
                if op.peer is None:
                    raise ConfigError(f"{path}: rank {prog.rank} has a {op.kind.value} without a peer; "
                                      "emu cannot tell where it goes")
                other = programs[op.peer % m].iterations[0].colls
                want = CollKind.RECV if op.kind == CollKind.SEND else CollKind.SEND
                if k >= len(other) or other[k].kind != want or other[k].peer != prog.worker:
                    raise ConfigError(f"{path}: worker {prog.worker}'s {op.kind.value} (collective {k}) has "
                                      f"no matching {want.value} on worker {op.peer % m}")
