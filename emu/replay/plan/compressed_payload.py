"""The real ranks' gradients, compressed for real, as the payload of a compressed replay
(``emu replay live.json.gz --payload live.payload.npz --compress NAME``; docs/compression.md,
"On the real ranks' tensors").

Each real rank's recorded tensor of every compressible all_reduce (``plan.compression.compressible``)
is compressed as a worker would compress it: iteration by iteration, with error feedback per rank
and bucket (its place among the iteration's compressible all_reduces, and its length). The compressor's output
becomes that collective's payload vector (``emu.emulator.payload.recorded``): an all_gather's
is the rank's message repeated over the output, so chunk ``w`` holds worker ``w``'s message
(real rank ``w mod K``'s); an all_reduce of fp16's or randomk's values holds those values. The
fabric then moves those bytes and checks each where it arrives. Every worker's aggregate is
what the messages decompress to, combined (``M / K`` workers a real rank), and its error against
the exact sum of the recorded tensors is the report's ``compression.error``: measured on the
replay's own data, every compressed all_reduce of every recorded iteration.

Where this cannot be done, the replay sends generated payload of the compressed sizes and the
report says why (``compression.data`` is then ``generated``): PowerSGD (its second all_reduce
needs the first's sum) and dgc (its length varies per worker), adaptive compression, the
quantizers the switch sums in int32 lanes on ``ina``, a payload that holds only a part of each
tensor (recorded at a payload scale above 1: compressing a part is not compressing the tensor),
and fp16 or randomk values whose sum over the workers would overflow their dtype.

The M / K workers of a real rank send its message, random draws included, as they send its
tensor: a stochastic quantizer's error here is that of K independent workers, not M.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.compression.compressors import Aggregation, Compressor, ErrorFeedback, message_seed, mirrored
from emu.emulator.payload.recorded import RecordedPayload
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.compression import compressed, compressible, members, summed_in_switch
from emu.traces.model import Coll, Trace

GENERATED_ONLY = {"powersgd": "PowerSGD's second all_reduce needs the first's sum",
                  "dgc": "dgc's message length differs per worker"}


@dataclass(frozen=True)
class RealError:
    """The compressed aggregates' error on the real ranks' tensors, over the replay's recorded
    iterations."""

    error: float  # relative L2 error of every compressed aggregate against its exact sum, together
    cosine: float
    accumulated: list[float]  # after each iteration, the summed aggregates' error against the summed exact sums
    sample: str


def compressed_payload(trace: Trace, config: ReplayConfig, payload: RecordedPayload,
                       ) -> tuple[RecordedPayload | None, RealError | None, str | None]:
    """``payload`` with every compressible all_reduce's entry replaced by the real ranks'
    messages, and their error; or None, None and why it cannot be (module docstring)."""
    comp = config.compress.compressor
    if config.compress.adaptive:
        return None, None, "adaptive compression chooses its compressor per pass"
    if comp.name in GENERATED_ONLY:
        return None, None, GENERATED_ONLY[comp.name]
    colls = [op for it in trace.ranks[0].iterations for op in it.colls]
    m = config.workers
    for i, op in enumerate(colls):
        if compressible(op, comp):
            if summed_in_switch(op, comp, m, config.switch_sums) and comp.aggregation == Aggregation.ALL_GATHER:
                return None, None, f"the switch sums {comp.label}'s levels in int32 lanes"
            if payload.kept(i) < op.count:
                return None, None, (f"the payload holds {payload.kept(i):,} of collective {op.id}'s {op.count:,} "
                                    "elements (recorded at a payload scale above 1); compressing a part is not "
                                    "compressing the tensor: record with emu run --payload-scale 1")
    return _compress_all(colls, comp, config, payload)


def _compress_all(colls: list[Coll], comp: Compressor, config: ReplayConfig, payload: RecordedPayload,
                  ) -> tuple[RecordedPayload | None, RealError | None, str | None]:
    k, m = payload.real_ranks, config.workers
    memory = ErrorFeedback(comp)
    tensors, dtypes = list(payload.tensors), list(payload.dtypes)
    got_all, want_all, accumulated = [], [], []
    acc_got: dict[int, np.ndarray] = {}  # per bucket, the aggregates so far (the model's accumulated update)
    acc_want: dict[int, np.ndarray] = {}
    position = 0
    for i, op in enumerate(colls):
        if i % payload.per_iteration == 0:
            position = 0
        if compressible(op, comp):
            rows = np.asarray(payload.tensors[i], dtype=np.float32)
            seeds = [message_seed(comp, config.seed, i, r) for r in range(k)]
            with np.errstate(over="ignore"):  # fp16 of a large value is inf: _summable refuses it below
                messages = [memory.message(r, (position, op.count), rows[r], seeds[r]) for r in range(k)]
            target = compressed(op, comp, m, config.switch_sums)
            entry = _entry(comp, messages, target, members(op, m))
            if entry is None:
                return None, None, f"{comp.label}'s message of collective {op.id} is not the size the plan gives"
            if not _summable(comp, entry, m // k):
                return None, None, (f"the sum of {m} workers' {comp.label} values of collective {op.id} overflows "
                                    "their dtype")
            tensors[i], dtypes[i] = entry, target.dtype.value
            got = _aggregate(comp, messages, op.count, seeds, m // k)
            want = (m // k) * rows.astype(np.float64).sum(axis=0)
            got_all.append(got)
            want_all.append(want)
            acc_got[position] = acc_got.get(position, 0.0) + got
            acc_want[position] = acc_want.get(position, 0.0) + want
            position += 1
        if (i + 1) % payload.per_iteration == 0 and acc_got:
            accumulated.append(round(_relative(np.concatenate(list(acc_got.values())),
                                               np.concatenate(list(acc_want.values()))), 6))
    if not got_all:
        return payload, None, None
    got, want = np.concatenate(got_all), np.concatenate(want_all)
    norm = float(np.linalg.norm(want) * np.linalg.norm(got))
    error = RealError(error=_relative(got, want), cosine=float(got @ want) / norm if norm else 0.0,
                      accumulated=accumulated,
                      sample=f"the real ranks' tensors (--payload): every compressed all_reduce of the "
                             f"{payload.iterations} recorded iterations, with error feedback, {k} real ranks for {m} "
                             f"workers (the {m // k} workers of a real rank send its message, its random draws "
                             "included: a stochastic quantizer's error does not average down with M here)")
    return RecordedPayload(k, payload.per_iteration, tuple(dtypes), tuple(tensors)), error, None


def _summable(comp: Compressor, entry: np.ndarray, mirror: int) -> bool:
    """An all_reduce of compressed values (fp16's, randomk's) whose every sum, in any order, stays
    finite in its dtype: at most ``mirror`` times the real ranks' magnitudes summed."""
    if comp.aggregation == Aggregation.ALL_GATHER:
        return True
    wide = entry.astype(np.float64)
    return bool(np.isfinite(wide).all() and (mirror * np.abs(wide).sum(axis=0)).max(initial=0.0)
                <= float(np.finfo(entry.dtype).max))


def _entry(comp: Compressor, messages: list[np.ndarray], target: Coll, group: int) -> np.ndarray | None:
    """The (K, elements) payload vectors of the compressed collective ``target``."""
    if comp.aggregation == Aggregation.ALL_GATHER:
        if any(len(msg) * group != target.count for msg in messages):
            return None
        return np.stack([np.tile(msg, group) for msg in messages])
    values = [np.asarray(msg, np.uint8).view(comp.values) for msg in messages]
    if any(len(v) != target.count for v in values):
        return None
    return np.stack(values)


def _aggregate(comp: Compressor, messages: list[np.ndarray], n: int, seeds: list[int], mirror: int) -> np.ndarray:
    """What every worker ends with (float64): the messages decompressed and combined, ``mirror``
    workers a real rank; an all_reduce's sum of the compressed forms, decompressed."""
    if comp.aggregation == Aggregation.ALL_REDUCE:
        total = mirror * np.sum([np.asarray(msg, np.uint8).view(comp.values).astype(np.float64) for msg in messages],
                                axis=0)
        raw = np.ascontiguousarray(total.astype(comp.values)).view(np.uint8)
        return comp.decompress(raw, n, seeds[0]).astype(np.float64)
    return mirrored(comp, [comp.decompress(msg, n, s) for msg, s in zip(messages, seeds, strict=True)], mirror)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / norm if norm else 0.0
