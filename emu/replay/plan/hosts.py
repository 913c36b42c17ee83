"""Which process holds which endpoint, and what the switch must wait for: partitioning workers
into host processes (whole nodes, or whole leaves, on a topology), parameter-server shards into
their own, and the pools the switch keeps for a sharded job's sub-groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.links.topology import Layout
from emu.emulator.mechanisms import choose
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.programs import WorkerProgram
from emu.traces.model import Coll


def even_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    return [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]


def point_to_point(programs: list[WorkerProgram], config: ReplayConfig) -> bool:
    """Whether any collective runs point to point (the rest run on the aggregation stream): the
    first worker's program tells for a trace of one group; a sharded or even_ranges job's ranks run
    programs of their own, so one worker of each rank's is asked."""
    one = {prog.rank: prog for prog in (programs if programs and programs[0].seq_offsets else programs[:1])}
    return any(not on_stream(op, config) for prog in one.values() for it in prog.iterations for op in it.colls)


def partition(layout: Layout | None, workers: int, processes: int) -> list[np.ndarray]:
    """The workers of each of at most ``processes`` host processes: consecutive ranges, or on a
    topology whole nodes (traffic inside a node never leaves its host: emu.replay.host.wiring), and with
    several leaves whole leaves (their links to the spine are the host's: emu.replay.host.leaves), as
    many per host as even."""
    if layout is None:
        return [np.arange(a, b) for a, b in even_ranges(workers, processes)]
    if layout.leaves > 1:
        leaves = np.unique(layout.leaf)
        parts = min(processes, len(leaves))
        return [np.flatnonzero(np.isin(layout.leaf, leaves[a:b])) for a, b in even_ranges(len(leaves), parts)]
    nodes = np.unique(layout.node)
    parts = min(processes, len(nodes))
    return [np.flatnonzero(np.isin(layout.node, nodes[a:b])) for a, b in even_ranges(len(nodes), parts)]


def on_stream(op: Coll, config: ReplayConfig) -> bool:
    """Whether a collective runs on the in-network aggregation stream (else point to point)."""
    return choose(op, config.setting).stream


def distinct_colls(programs: list[WorkerProgram]) -> list[Coll]:
    """Every collective of the programs once (by id, group and sparsity)."""
    seen: dict[tuple, Coll] = {}
    for op in _colls(programs):
        seen.setdefault((op.id, op.group, op.kind, op.sparsity), op)
    return list(seen.values())


def _colls(programs: list[WorkerProgram]) -> list[Coll]:
    """Every collective of the programs, each program's iterations once: the workers a rank's
    program is scaled to share one (emu.replay.plan.programs), 8,192 of them at 8,192 workers."""
    done: set[int] = set()
    out: list[Coll] = []
    for prog in programs:
        if id(prog.iterations) not in done:
            done.add(id(prog.iterations))
            out += [op for it in prog.iterations for op in it.colls]
    return out


def ina_pools(programs: list[WorkerProgram], config: ReplayConfig) -> tuple[tuple[tuple[int, ...], ...],
                                                                            tuple[tuple[int, int], ...]]:
    """The sub-groups the switch aggregates for, each a pool of its own, and every pool's (real,
    emulated) slots, the job's pool first; empty where the job's pool is all there is. The pool
    of the job's design (``--slots``) is even_ranges evenly among the pools it has (a static even_ranges, as
    SwitchML's among jobs: docs/parallelism.md)."""
    groups: set[tuple[int, ...]] = set()
    whole = False
    for op in _colls(programs):
        if on_stream(op, config):  # a group's reduce_scatters and all_gathers share its pool
            if op.group is None:
                whole = True
            else:
                groups.add(op.group)
    if not groups:
        return (), ()
    share = max(1, config.emulated_slots // (len(groups) + whole))
    slots = (max(1, -(-share // config.scale)), share)
    return tuple(sorted(groups)), (slots,) * (len(groups) + 1)


@dataclass(frozen=True)
class HostLayout:
    """Which host process holds which endpoint, for one job or several sharing the fabric.

    Endpoints are numbered job after job, each job's workers then its parameter-server shards
    (``base``: each job's endpoint 0). Worker hosts come first (``partition`` of every job's
    workers, on the fabric's layout), then each job's shard hosts."""

    workers: tuple[np.ndarray, ...]  # per worker host: the fabric-wide worker numbers it holds
    shards: tuple[tuple[tuple[int, int], ...], ...]  # per job: its shard hosts' [first, last) shards
    base: np.ndarray  # per job: the number of its endpoint 0
    job_of: np.ndarray  # per fabric-wide worker: its job
    local_of: np.ndarray  # per fabric-wide worker: its number in its job
    endpoint_host: tuple[int, ...]

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """Each worker host's [first, last) workers (an external switch routes by them)."""
        return tuple((int(ws[0]), int(ws[-1]) + 1) for ws in self.workers)


def host_layout(layout: Layout | None, counts: list[int], shards: list[int], processes: int,
                shard_hosts: int) -> HostLayout:
    """``counts``: each job's workers, ``shards``: its parameter-server shards (0: none),
    ``layout``: the fabric's (every job's workers, job after job), ``processes``: worker hosts at
    most, ``shard_hosts``: a job's shard hosts at most (``ReplayConfig.shard_hosts``). A job's
    shards take one host where more than two jobs share the fabric (every process gates every
    clock window)."""
    held = partition(layout, sum(counts), processes)
    offset = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64)
    job_of = np.repeat(np.arange(len(counts)), counts)
    local_of = np.arange(sum(counts)) - offset[job_of]
    base = np.r_[0, np.cumsum([m + s for m, s in zip(counts, shards, strict=True)])[:-1]].astype(np.int64)
    spans = tuple(tuple(even_ranges(s, min(s, shard_hosts if len(counts) <= 2 else 1))) if s else () for s in shards)
    endpoint_host = np.zeros(int(base[-1]) + counts[-1] + shards[-1], np.int64)
    for h, ws in enumerate(held):
        endpoint_host[base[job_of[ws]] + local_of[ws]] = h
    index = len(held)
    for j, job_spans in enumerate(spans):
        for a, b in job_spans:
            endpoint_host[base[j] + counts[j] + np.arange(a, b)] = index
            index += 1
    return HostLayout(workers=tuple(held), shards=spans, base=base, job_of=job_of, local_of=local_of,
                      endpoint_host=tuple(int(h) for h in endpoint_host))

