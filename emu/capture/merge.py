"""Merging the per-rank Kineto files of one job into one emu trace.

Every file must come from the same job (world size, backend and process groups
agree) and name a distinct rank; the iterations kept are the profiled steps all
files share. A file may hold only some ranks of a larger job: the trace keeps
the job's world size.

Where a file lacks a value the trace needs, capture refuses (sizes, dtypes,
groups: ``emu.capture.collectives``) or, for completion times only, records the
gap in ``meta.gaps`` (docs/trace-format.md): a collective whose NCCL kernel is not
in the file has ``observed_us`` null, and the waits on it hold only the blocked
time the file measured, a lower bound. Refusing would lose every trace profiled
without CUDA activity, and those still give exact sizes and step times.
"""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from emu.capture.collectives import find_collectives
from emu.capture.groups import described_mesh, recorded_mesh
from emu.capture.kineto import KinetoTrace, expand_paths, read_kineto
from emu.capture.program import convert_rank, profiler_steps
from emu.errors import KinetoError, TraceError
from emu.traces.mesh import Mesh
from emu.traces.model import Coll, CollKind, Iteration, RankProgram, Source, Trace, TraceMeta, Wait
from emu.traces.noise import assess
from emu.traces.validate import validate_trace


def _check_same_job(kts: Sequence[KinetoTrace]) -> None:
    first = kts[0]
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for kt in kts:
        if kt.job_key != first.job_key:
            raise KinetoError(
                f"{kt.path}: rank files of different jobs: it says world size {kt.world_size}, "
                f"backend {kt.backend}, but {first.path} says world size {first.world_size}, backend "
                f"{first.backend}; give the files of one job")
        for g in kt.groups:  # each file lists the groups its rank is in: a name means one group
            ranks, where = seen.setdefault(g.name, (g.ranks, kt.path))
            if ranks != g.ranks:
                raise KinetoError(f"{kt.path}: rank files of different jobs: process group {g.name!r} holds ranks "
                                  f"{list(g.ranks)[:16]} here but {list(ranks)[:16]} in {where}; give the files "
                                  "of one job")
    ranks = Counter(kt.rank for kt in kts)
    dup = [r for r, n in ranks.items() if n > 1]
    if dup:
        files = [kt.path for kt in kts if kt.rank == dup[0]]
        raise KinetoError(f"{files[1]}: rank {dup[0]} is given twice (also {files[0]}); give one "
                          "file per rank")


def _captured_at(kts: Sequence[KinetoTrace]) -> str:
    kt = kts[0]
    when = dt.datetime.now(dt.timezone.utc)
    if kt.base_time_ns is not None and kt.events:
        seconds = kt.base_time_ns / 1e9 + kt.events[0].ts_us / 1e6
        try:
            when = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise KinetoError(f"{kt.path}: fields 'baseTimeNanoseconds' and 'ts' put the profiled steps "
                              f"at {seconds:.0f} s since 1970, not a date; the file is corrupted") from None
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _gaps(kt: KinetoTrace, iterations: Sequence[Iteration]) -> list[str]:
    """One line per collective whose completion the file lacks (NCCL without its kernel)."""
    missing = [(it, k, op) for it in iterations for k, op in enumerate(it.ops)
               if isinstance(op, Coll) and op.observed_us is None]
    if not missing:
        return []
    name = os.path.basename(kt.path)
    if not any(e.cat == "kernel" for e in kt.events):
        steps = sorted({it.step for it, _, _ in missing})
        return [f"{name}: rank {kt.rank}: no GPU kernels in the file (profiled without CUDA activity), so "
                f"the completion of its {len(missing)} collectives in steps {steps[0]}..{steps[-1]} is unknown: "
                "their observed_us is null and the waits on them count no blocked time (compute holds it); "
                "profile with ProfilerActivity.CUDA to measure them"]
    colls, _ = find_collectives(kt)
    spans = dict(profiler_steps(kt))
    lines = []
    for it, k, op in missing:
        span = spans[it.step]
        # op ids are indexes into the step's collectives in issue order (emu.capture.program)
        inside = [c for c in colls if span.ts_us <= c.issue_us < span.end_us]
        at = f" (issued at ts {inside[op.id].issue_us:.3f})" if op.id < len(inside) else ""
        waits = [j for j, w in enumerate(it.ops) if isinstance(w, Wait) and op.id in w.ids]
        waited = f"the blocked_us of the wait on it (op {waits[0]}) is a lower bound" if waits else "no wait names it"
        lines.append(f"{name}: rank {kt.rank}: step {it.step}: op {k}, {op.kind.value} of {op.count} "
                     f"{op.dtype.value}{at}: no NCCL kernel with its External id in the file (the profiling "
                     f"window ended before it ran, or the GPU events were dropped): observed_us is null and "
                     f"{waited}; profile a window that holds the kernel to measure it")
    return lines


def job_mesh(kts: Sequence[KinetoTrace]) -> Mesh | None:
    """The job's device mesh: the one its script built (emu's record), else the one its groups'
    descriptions imply (``emu.capture.groups``); None where neither says."""
    world = kts[0].world_size
    for kt in kts:
        if kt.comms is not None:
            mesh = recorded_mesh(kt.comms, world)
            if mesh is not None:
                return mesh
    groups = {g.name: g for kt in kts for g in kt.group_table().values()}
    return described_mesh(list(groups.values()), world)


def merge_ranks(kts: Sequence[KinetoTrace], *, source: Source, model: str | None = None,
                framework: str = "torch (version not recorded)", batch_size: int | None = None,
                params: int | None = None, command: str | None = None, comm_hook: str | None = None,
                cpu_cores: int | None = None, threads_per_rank: int | None = None) -> Trace:
    """One emu trace from the Kineto traces of some or all ranks of one job; ``cpu_cores`` and
    ``threads_per_rank``: how a capture's ranks shared the machine."""
    if not kts:
        raise KinetoError("no Kineto files given")
    kts = sorted(kts, key=lambda kt: kt.rank)
    _check_same_job(kts)
    mesh = job_mesh(kts)
    per_rank = {kt.rank: convert_rank(kt, mesh) for kt in kts}
    common = set.intersection(*({it.step for it in its} for its in per_rank.values()))
    if not common:
        raise KinetoError(f"{kts[0].path}: the rank files share no ProfilerStep number; give "
                          "files profiled over the same steps")
    programs = tuple(RankProgram(rank=r, iterations=tuple(it for it in its if it.step in common))
                     for r, its in per_rank.items())
    gaps = [line for kt, p in zip(kts, programs, strict=True) for line in _gaps(kt, p.iterations)]
    if comm_hook is not None and "powersgd" in comm_hook.lower():
        gaps.append(f"comm_hook {comm_hook}: PowerSGD's all_reduces of the P and Q factors run in the hook's "
                    "future callbacks, which the profiler does not record; the trace holds each bucket's first "
                    "all_reduce only (its uncompressed tensors): replay the uncompressed trace with "
                    "--compress powersgd:RANK instead")
    colls = [op for p in programs for it in p.iterations for op in it.colls]
    if not colls:
        raise KinetoError(f"{kts[0].path}: the profiled steps issue no collectives: an empty "
                          "program has nothing to replay; profile steps of the distributed job")
    weights = Counter()
    for op in colls:
        if op.kind in (CollKind.ALL_REDUCE, CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER):
            weights[op.dtype.value] += op.bytes
    dtype = weights.most_common(1)[0][0] if weights else colls[0].dtype.value
    meta = TraceMeta(
        source=source, world_size=kts[0].world_size, backend=kts[0].backend, device=kts[0].device,
        framework=framework, dtype=dtype, captured_at=_captured_at(kts), model=model,
        batch_size=batch_size, params=params, command=command, comm_hook=comm_hook,
        kineto_files=tuple(os.path.basename(kt.path) for kt in kts), gaps=tuple(gaps), mesh=mesh,
        cpu_cores=cpu_cores, threads_per_rank=threads_per_rank)
    trace = Trace(meta=meta, ranks=programs)
    trace = replace(trace, meta=replace(meta, noise=assess(trace)))  # the spread; a capture adds its load
    try:
        validate_trace(trace, kts[0].path)
    except TraceError as exc:
        raise KinetoError(f"the imported trace is inconsistent: {exc}") from None
    return trace


def import_kineto(paths: Sequence[str | os.PathLike[str]], *, model: str | None = None) -> Trace:
    """``emu capture --kineto``: an emu trace from existing profiler traces, one file per rank."""
    files = expand_paths(paths)
    return merge_ranks([read_kineto(p) for p in files], source=Source.KINETO, model=model)
