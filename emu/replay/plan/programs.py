"""The programs the fake workers run: a trace's rank programs scaled to M workers.

docs/design.md: replaying at M workers a trace of a job of N ranks reuses the programs
in the file round-robin (worker w runs the program of the file's rank
``ranks[w mod len(ranks)]``), replaces every group size that equalled N with M,
and keeps compute times and full-tensor counts (weak scaling). Iterations are
reused cyclically. Sub-groups cannot be scaled and are refused unless M == N;
point-to-point peers keep their offset (peer - rank) modulo M; a broadcast root
outside 0..M-1 wraps around.

Each collective gets its number (``seq``), the same on every worker of its group, which is how
the fabrics match them up; and its payload's sparsity, also the same on every worker
(``emu.replay.plan.sparsity``); with ``--compress``, each float all_reduce is the collective its
compressor uses (``emu.replay.plan.compression``).

A trace of several process groups (FSDP's, tensor and pipeline parallel ones) replays at a layout
(``emu.replay.plan.layout``): each worker runs the program of the rank at its place in the mesh, and
each collective runs on its group of workers. The k-th collective of a group on one member meets
the k-th on every other (NCCL's rule; for a send and a recv, the k-th of one sender to one
receiver), so a collective's number is ``iteration x T + base(group) + k``, with ``T`` the
collectives of every group in an iteration and each group's range apart: numbers are unique on
every worker and agreed within each group. A trace of one group numbers as before (``k``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from emu.emulator.links.array import uniform
from emu.errors import ConfigError
from emu.replay.config.options import CompressOption, ReplayConfig, SparsityOption
from emu.replay.plan.adaptive import planned_ranks
from emu.replay.plan.compression import with_compression
from emu.replay.plan.layout import GroupKey, MeshPlan, has_subgroups, plan_mesh
from emu.replay.plan.sparsity import with_sparsity
from emu.traces.mesh import Mesh
from emu.traces.model import Coll, CollKind, Iteration, Op, RankProgram, Splits, Trace

_ONE_ORDER = (CollKind.ALL_REDUCE, CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER)


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
    colls_per_iteration: int  # T: the numbers an iteration takes (every group's collectives)
    # per iteration of the cycle, each collective's number within the iteration (empty: 0, 1, ...)
    seq_offsets: tuple[tuple[int, ...], ...] = ()

    def seq(self, iteration: int, k: int) -> int:
        """The number of the ``k``-th collective of replayed iteration ``iteration``."""
        offsets = self.seq_offsets
        return iteration * self.colls_per_iteration + (offsets[iteration % len(offsets)][k] if offsets else k)


def _scale_op(op: Op, rank: int, worker: int, n: int, m: int, path: str) -> Op:
    if isinstance(op, Coll) and op.splits is not None and worker != rank:
        op = replace(op, splits=_shifted(op.splits, worker - rank))
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
    count = op.count
    if op.kind in (CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER) and count % m:
        count += m - count % m  # whole shards of the grown group, as FSDP pads (emu.replay.plan.layout)
    return replace(op, group_size=m, peer=peer, root=root, count=count, bytes=count * op.dtype.itemsize)


def _shifted(splits: Splits, offset: int) -> Splits:
    """Worker w's sizes where it runs the program of rank w - offset (emu run's trace: K real ranks'
    programs for M workers): it sends worker p what its rank sent p - offset, and receives from p
    what its rank received from p - offset (every peer at the same offset; docs/run.md)."""
    def roll(sizes: tuple[int, ...]) -> tuple[int, ...]:
        k = offset % len(sizes)
        return sizes[-k:] + sizes[:-k] if k else sizes

    return Splits(roll(splits.send_elements), roll(splits.recv_elements))


def explicit_splits(trace: Trace) -> Trace:
    """The trace with every member's copy of an uneven all_to_all giving its sizes: a capture drops
    a rank's ``splits`` where its own sends and receives are all equal (docs/trace-format.md), while
    a peer's copy of the same collective (its k-th all_to_all on the group) is uneven; the even
    copy gets its ``count / group_size`` each way written out, so every member runs the same
    exchange."""
    if not any(op.splits is not None for r in trace.ranks for it in r.iterations for op in it.colls):
        return trace
    world = tuple(range(trace.meta.world_size))
    uneven = {(index, g, k) for r in trace.ranks for index, it in enumerate(r.iterations)
              for g, k, op in _numbered(it, world) if op.splits is not None}
    ranks = []
    for r in trace.ranks:
        iterations = []
        for index, it in enumerate(r.iterations):
            fill = {id(op) for g, k, op in _numbered(it, world) if op.splits is None and (index, g, k) in uneven}
            ops = tuple(replace(op, splits=Splits.of(op)) if id(op) in fill and isinstance(op, Coll) else op
                        for op in it.ops)
            iterations.append(replace(it, ops=ops))
        ranks.append(replace(r, iterations=tuple(iterations)))
    return replace(trace, ranks=tuple(ranks))


def _numbered(it: Iteration, world: tuple[int, ...]) -> list[tuple[tuple[int, ...], int, Coll]]:
    """An iteration's all_to_alls, each with its group and its place among that group's."""
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for op in it.colls:
        if op.kind == CollKind.ALL_TO_ALL:
            group = op.group or world
            seen[group] = seen.get(group, 0) + 1
            out.append((group, seen[group] - 1, op))
    return out


def _refuse_uneven_all_to_all(trace: Trace, path: str) -> None:
    """An all_to_all with per-peer sizes (``Coll.splits``) replays at the trace's own size only: at
    another, its sizes would have to be made up (docs/trace-format.md, "splits")."""
    for r in trace.ranks:
        for k, it in enumerate(r.iterations):
            op = next((op for op in it.colls if op.splits is not None), None)
            if op is not None:
                raise ConfigError(
                    f"{path}: rank {r.rank}, iteration {k}: all_to_all {op.id} sends {list(op.splits.send_elements)[:8]} "
                    f"elements to its peers (largest {op.splits.imbalance:.2f}x the mean); emu replays uneven "
                    f"all_to_alls at the trace's own size only for now: replay with --workers "
                    f"{trace.meta.world_size} and no --mesh (`emu inspect` shows their imbalance)")


def programs_for(trace: Trace, config: ReplayConfig, path: str = "trace", first: int | None = None,
                 workers: int | None = None) -> list[WorkerProgram]:
    """The programs of a replay of ``trace`` with ``config`` (``plan_programs`` with the options it
    reads); ``workers``: plan for this many where fewer than the job's are planned (``emu predict``)."""
    return plan_programs(trace, workers or config.workers, path, config.sparsity, config.compress,
                         job_workers=config.workers if workers else None, switch_sums=config.switch_sums,
                         first=first, mesh=config.mesh, imbalance=config.moe_imbalance, seed=config.seed)


def plan_programs(trace: Trace, workers: int, path: str = "trace", sparsity: SparsityOption | None = None,
                  compress: CompressOption | None = None, job_workers: int | None = None,
                  switch_sums: bool = False, first: int | None = None, mesh: Mesh | None = None,
                  imbalance: float | None = None, seed: int = 0) -> list[WorkerProgram]:
    """The programs of ``workers`` fake workers; ``job_workers``: the job's size where fewer are
    planned (``emu predict``), which a compressed all_gather's size follows; ``switch_sums``: the
    fabric sums all_reduces in a switch (INA), which takes some compressors' levels
    (``emu.replay.plan.compression.compressed``); ``first``: plan only the first workers' programs
    (what a report reads of a run whose programs were checked), without the point-to-point check;
    ``mesh``: the layout of a sharded or split trace (``emu.replay.plan.layout``); ``imbalance``
    and ``seed``: a mixture of experts' routing at a new size (``emu.replay.plan.experts``)."""
    trace = explicit_splits(trace)
    layout = plan_mesh(trace, workers, mesh, path, imbalance, seed)  # checks a mesh given, and a layout's ranks
    if (workers != trace.meta.world_size or mesh is not None) and (
            layout is None or not layout.identity and layout.experts is None):
        _refuse_uneven_all_to_all(trace, path)
    if imbalance is not None and (layout is None or layout.experts is None):
        raise ConfigError(f"--moe-imbalance {imbalance:g}: it sets a mixture of experts' routing where emu lays the "
                          f"trace's expert parallelism out anew (--mesh with a larger ep, or replicas added: "
                          f"docs/moe.md); {path} replays here with the routing it recorded: drop --moe-imbalance")
    if layout is not None and (has_subgroups(trace) or layout.regroups or layout.experts is not None):
        return _plan_groups(trace, layout, path, sparsity, compress, first)
    n = trace.meta.world_size
    ranks = with_sparsity(trace, workers, sparsity)
    if compress is not None and compress.adaptive and compress.plan is not None:
        ranks = planned_ranks(ranks, compress.plan, job_workers or workers, n, compress.speed, switch_sums)
    elif compress is not None and compress.active:  # adaptive before its plan: checked at its floor
        ranks = with_compression(ranks, job_workers or workers, compress.compressor, compress.speed, switch_sums)
    for r in ranks:  # the whole job's reductions and gathers keep one order (the switch's stream among them)
        streams = {op.stream or 0 for it in r.iterations for op in it.colls if op.kind in _ONE_ORDER}
        if len(streams) > 1:
            raise ConfigError(f"{path}: rank {r.rank} puts the job's all_reduces, reduce_scatters and all_gathers on "
                              f"streams {sorted(streams)}; emu runs one group's in issue order on one stream, as NCCL "
                              "runs a communicator's: give them one stream")
    counts = {len(it.colls) for r in ranks for it in r.iterations}
    if len(counts) > 1:
        raise ConfigError(f"{path}: the iterations issue different numbers of collectives ({sorted(counts)}); "
                          "replay needs the same sequence in every iteration")
    per_iteration = counts.pop()
    programs = []
    shared: dict[int, tuple[Iteration, ...]] = {}  # a rank's scaled program, where no op names a peer
    for w in range(workers if first is None else min(first, workers)):
        program = ranks[w % len(ranks)]
        iterations = shared.get(w % len(ranks))
        if iterations is None:
            iterations = tuple(
                Iteration(step=it.step, measured_us=it.measured_us,
                          ops=tuple(_scale_op(op, program.rank, w, n, workers, path) for op in it.ops))
                for it in program.iterations)
            if not any(isinstance(op, Coll) and (op.peer is not None or op.splits is not None)
                       for it in program.iterations for op in it.ops):
                shared[w % len(ranks)] = iterations  # the same for every worker of this rank: made once
        programs.append(WorkerProgram(worker=w, rank=program.rank, iterations=iterations,
                                      colls_per_iteration=per_iteration))
    if first is None:
        _check_p2p(programs, path)
    return programs


def laid_out(trace: Trace, workers: int, mesh: Mesh | None = None, path: str = "trace", seed: int = 0) -> Trace:
    """The trace as a replay at ``workers`` lays it out: one rank per worker, each with the program
    the replay gives it (``plan_programs``), the mesh the layout took (what ``emu export --workers``
    writes). Gradient samples stay behind: their ranks are the file's."""
    programs = plan_programs(trace, workers, path, mesh=mesh, seed=seed)
    layout = plan_mesh(trace, workers, mesh, path, None, seed)
    note = f"laid out at {workers} workers by emu's replay rule from a trace of {trace.meta.world_size} ranks"
    meta = replace(trace.meta, world_size=workers, mesh=layout.mesh if layout is not None else None,
                   gaps=trace.meta.gaps + ((note,) if workers != trace.meta.world_size or mesh is not None else ()))
    return Trace(meta=meta, ranks=tuple(RankProgram(rank=p.worker, iterations=p.iterations) for p in programs))


def _plan_groups(trace: Trace, layout: MeshPlan, path: str, sparsity: SparsityOption | None,
                 compress: CompressOption | None, first: int | None) -> list[WorkerProgram]:
    """Programs of a trace of several groups at a layout (module docstring): each collective on its
    group of workers, numbered so that every group's members agree."""
    _refuse_for_groups(trace, path, sparsity, compress)
    by_rank = {p.rank: p for p in (layout.trace or trace).ranks}  # with expert gradients where dims are added
    planned, counts = _scaled_by_group(by_rank, layout, path)
    _check_groups(planned, counts, layout, path)
    bases, total = {}, 0
    for key in sorted(counts, key=lambda k: (("job", "slice", "p2p").index(k.kind), k.dims, k.anchor)):
        bases[key] = total
        total += counts[key]
    programs = []
    m = layout.workers
    for w in range(m if first is None else min(first, m)):
        rank, per_it = planned[w]
        iterations, offsets = [], []
        for index, (it, row) in enumerate(zip(by_rank[rank].iterations, per_it, strict=True)):
            scaled = iter(row)
            ops = tuple(next(scaled)[0] if isinstance(op, Coll) else op for op in it.ops)
            if layout.experts is not None:
                ops = layout.experts.follow_tokens(it.ops, ops, index)
            iterations.append(Iteration(step=it.step, measured_us=it.measured_us, ops=ops))
            offsets.append(tuple(bases[key] + k for _, key, k in row))
        programs.append(WorkerProgram(worker=w, rank=rank, iterations=tuple(iterations), colls_per_iteration=total,
                                      seq_offsets=tuple(offsets)))
    return programs


def _refuse_for_groups(trace: Trace, path: str, sparsity: SparsityOption | None,
                       compress: CompressOption | None) -> None:
    """What a trace of sub-groups cannot take: compression, and sparsity other than dense."""
    if compress is not None and compress.active:
        raise ConfigError(f"--compress {compress.text}: {path} runs collectives on sub-groups (its mesh: "
                          f"{_mesh_text(trace)}), and emu compresses a whole job's all_reduces only")
    recorded = any(op.sparsity is not None for r in trace.ranks for it in r.iterations for op in it.colls)
    if sparsity is not None and sparsity.source == "option":
        raise ConfigError(f"--sparsity {sparsity.text}: {path} runs collectives on sub-groups (its mesh: "
                          f"{_mesh_text(trace)}), and emu replays their payload dense: drop --sparsity")
    if recorded and (sparsity is None or sparsity.source != "none"):
        raise ConfigError(f"{path} runs collectives on sub-groups (its mesh: {_mesh_text(trace)}) and records their "
                          "sparsity, which emu follows on a whole job's all_reduces only: give --sparsity none")


Planned = list[tuple[int, list[list[tuple[Coll, GroupKey, int]]]]]  # per worker: its rank, per iteration its row


def _scaled_by_group(by_rank: dict, layout: MeshPlan, path: str) -> tuple[Planned, dict[GroupKey, int]]:
    """Per worker, per iteration of its cycle: each collective scaled, its group, its place in the
    group; and every group's collectives an iteration. A group's members (and every iteration) must
    issue the same collectives (kind, dtype and count in issue order)."""
    counts: dict[GroupKey, int] = {}
    signature: dict[GroupKey, tuple] = {}
    planned: Planned = []
    for w in range(layout.workers):
        rank = layout.rank_of(w)
        per_it = []
        for index, it in enumerate(by_rank[rank].iterations):
            seen: dict[GroupKey, list[tuple[str, str, int]]] = {}
            row = []
            uneven = 0
            for op in it.colls:
                scaled, key = layout.scale_op(op, rank, w)
                if op.splits is not None and layout.experts is not None:
                    scaled = layout.experts.resplit(scaled, op, rank, w, index, uneven)
                    uneven += 1
                sig = seen.setdefault(key, [])
                row.append((scaled, key, len(sig)))
                sig.append(("p2p" if op.kind in (CollKind.SEND, CollKind.RECV) else op.kind.value, op.dtype.value,
                            -1 if scaled.splits is not None else scaled.count))  # an uneven one's differ
            for key, sig in seen.items():
                want = signature.setdefault(key, tuple(sig))
                if tuple(sig) != want:
                    who = (f"sends from worker {key.anchor[0]} to worker {key.anchor[1]}" if key.kind == "p2p"
                           else f"its group {list(layout.members(key) or ())[:8]}")
                    raise ConfigError(f"{path}: worker {w} (rank {rank}'s program), iteration {index}: {who} do not "
                                      "match across the group's members and iterations (kind, dtype and count in "
                                      "issue order, the same in every iteration); replay needs every member to "
                                      "issue the same collectives")
                counts[key] = len(sig)
            per_it.append(row)
        planned.append((rank, per_it))
    return planned, counts


def _check_groups(planned: Planned, counts: dict[GroupKey, int], layout: MeshPlan, path: str) -> None:
    """Every iteration of a worker issues the same groups' collectives, a group's on one stream, and
    every member of a group issues its collectives (a send needs its recv)."""
    for rank, per_it in planned:
        first_keys = {k for _, k, _ in per_it[0]}
        for index, row in enumerate(per_it):
            if {k for _, k, _ in row} != first_keys:
                raise ConfigError(f"{path}: rank {rank}'s iteration {index} issues collectives on other groups than "
                                  "its first iteration; replay needs the same collectives in every iteration")
            streams: dict[GroupKey, set[int]] = {}
            for op, k, _ in row:
                streams.setdefault(k, set()).add(op.stream or 0)
            if any(len(v) > 1 for v in streams.values()):
                raise ConfigError(f"{path}: rank {rank}'s iteration {index} puts one group's collectives on several "
                                  "streams; emu runs a group's collectives in issue order on one stream, as NCCL "
                                  "runs a communicator's: give each group one stream")
    keys_of = [{k for _, k, _ in per_it[0]} for _, per_it in planned]
    for key in counts:
        members = layout.members(key) or range(layout.workers)
        for w in members:
            if key not in keys_of[w]:
                raise ConfigError(f"{path}: worker {w} never issues the collectives of "
                                  + ("the send from worker {} to worker {}".format(*key.anchor) if key.kind == "p2p"
                                     else f"its group {list(members)[:8]}") + "; replay needs every member to issue them")


def group_table(programs: list[WorkerProgram]) -> tuple[tuple[int, ...] | None, ...]:
    """Per collective number within an iteration, its group's workers (None: the whole job, or a
    send or recv); empty where every collective is the whole job's (what parameter-server shards
    sum over: ``emu.emulator.algorithms.p2p.PSServer``)."""
    if not programs or not programs[0].seq_offsets:
        return ()
    table: list[tuple[int, ...] | None] = [None] * programs[0].colls_per_iteration
    for prog in programs:
        for it, offsets in zip(prog.iterations, prog.seq_offsets, strict=True):
            for op, o in zip(it.colls, offsets, strict=True):
                if op.group is not None:
                    table[o] = op.group
    return tuple(table)


def _mesh_text(trace: Trace) -> str:
    return trace.meta.mesh.text() if trace.meta.mesh is not None else "none recorded"


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
