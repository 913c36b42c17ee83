"""Synthetic traces for physics checks: one collective, no compute.

A one-rank job whose every iteration issues a single collective and waits for it;
replay scales it to any number of workers (its group size is the job's), so the
emulated iteration time is that collective's time alone, which the formulas of
docs/physics.md predict.
"""

from __future__ import annotations

import datetime as dt

from emu.traces.model import Coll, CollKind, Dtype, Iteration, RankProgram, Source, Trace, TraceMeta, Wait


def single_collective(kind: CollKind, count: int, dtype: Dtype = Dtype.FLOAT32, iterations: int = 1) -> Trace:
    """A trace of ``iterations`` iterations, each one ``kind`` of ``count`` elements and a wait."""
    ops = (Coll(id=0, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize, group_size=1),
           Wait(ids=(0,), blocked_us=0.0))
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=1, backend="none", device="none", framework="emu",
                     dtype=dtype.value, captured_at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     model=f"{kind.value}-{count * dtype.itemsize}B")
    its = tuple(Iteration(step=i, measured_us=0.0, ops=ops) for i in range(iterations))
    return Trace(meta=meta, ranks=(RankProgram(rank=0, iterations=its),))
