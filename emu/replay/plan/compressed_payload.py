"""The real ranks' gradients, compressed for real, as the payload of a compressed replay
(``emu replay live.json.gz --payload live.payload.npz --compress NAME``; docs/compression.md,
"On the real ranks' tensors").

M workers need M gradients while K ranks were recorded: the first K workers take the real ranks'
tensors, and every other one a gradient ``derived`` from them, the ranks' mean plus, element by
element, one of their residuals from it drawn at random with a random sign (seeded by the run,
the collective and the worker), so the spread between the recorded ranks is resampled, not copied.
Every worker compresses its own gradient of every compressible all_reduce
(``plan.compression.compressible``) as it would: iteration by iteration, with its own error
feedback per bucket (its place among the iteration's compressible all_reduces, and its length) and
its own random draws. The compressor's output becomes that collective's payload vector
(``emu.emulator.payload.recorded``): an all_gather's output with each worker's message at its own
chunk, an all_reduce's fp16 or randomk values one row a worker. The fabric moves those bytes and
checks each where it arrives. Every worker's aggregate is what the messages decompress to,
combined, and its error against the exact sum of the workers' gradients is the report's
``compression.error``: measured on the replay's own data, every compressed all_reduce of every
recorded iteration.

Where M distinct messages cannot be held or made (``_mirrors``: one real rank, a payload scale
above 1, a sub-group's all_gather, more than ``DERIVED_ELEMENTS`` to compress or ``DERIVED_BYTES``
to hold), the M / K workers of a real rank send its message, random draws included, as they send
its tensor: a stochastic quantizer's error is then that of K independent workers, not M, and the
report's ``error_sample`` says so and why.

Where this cannot be done, the replay sends generated payload of the compressed sizes and the
report says why (``compression.data`` is then ``generated``): PowerSGD (its second all_reduce
needs the first's sum) and dgc (its length varies per worker), adaptive compression, a
quantizer's int32 lanes on ``ina`` that the stream's fixed point would round or a sub-group's
(``_switch_bucket``: elsewhere the switch sums the workers' real lanes), a payload that holds only a part of each
tensor (recorded at a payload scale above 1: compressing a part is not compressing the tensor),
and fp16 or randomk values whose sum over the workers would overflow their dtype.

"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emu.emulator.compression.compressors import Aggregation, Compressor, ErrorFeedback, message_seed, mirrored
from emu.emulator.compression.in_switch import (
    agreed_exponents,
    field_bits,
    fields_per_lane,
    lanes_value,
    levels_of,
    scale_of,
    unpack_lanes,
    worker_lanes,
)
from emu.emulator.payload.recorded import RecordedPayload
from emu.emulator.protocol import fixedpoint
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.compression import compressed, compressible, derived, members, summed_in_switch
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
    switch_exact: bool | None = None  # summed in the switch's lanes: they held exactly the sums of the levels


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
    for i, op in enumerate(colls):
        if compressible(op, comp):
            if _in_lanes(op, comp, config) and op.group is not None:
                return None, None, (f"the switch sums {comp.label}'s levels in int32 lanes, and a sub-group's "
                                    "lanes may be summed point to point, in float32")
            if payload.kept(i) < op.count:
                return None, None, (f"the payload holds {payload.kept(i):,} of collective {op.id}'s {op.count:,} "
                                    "elements (recorded at a payload scale above 1); compressing a part is not "
                                    "compressing the tensor: record with emu run --payload-scale 1")
    return _compress_all(colls, comp, config, payload)


DERIVED_ELEMENTS = 1 << 28  # M workers' gradients compressed before the replay, at most (a few seconds of numpy)
DERIVED_BYTES = 1 << 28  # the M workers' messages held for the replay, at most


def _mirrors(colls: list[Coll], comp: Compressor, config: ReplayConfig, payload: RecordedPayload) -> str | None:
    """Why the M workers send their real ranks' messages (M / K a rank) instead of M distinct
    gradients derived from them (``derived``); None where they derive them."""
    k, m = payload.real_ranks, config.workers
    if k == m:
        return None
    if k == 1:
        return "one real rank recorded, no spread between ranks to resample"
    if config.scale > 1:
        return f"payload scale {config.scale} keeps a part of each message (derived at payload scale 1 only)"
    ops = [op for op in colls if compressible(op, comp)]
    if comp.aggregation == Aggregation.ALL_GATHER and any(op.group is not None for op in ops):
        return "a sub-group's all_gather holds every member's message in every row: M rows of M messages"
    work = m * sum(op.count for op in ops)
    if work > DERIVED_ELEMENTS:
        return f"{m} workers' gradients are {work:,} elements to compress, more than {DERIVED_ELEMENTS:,}"
    held = sum(_held_bytes(op, comp, config) for op in ops)
    if held > DERIVED_BYTES:
        return f"{m} workers' messages are {held:,} bytes, more than {DERIVED_BYTES:,}"
    return None


def _held_bytes(op: Coll, comp: Compressor, config: ReplayConfig) -> int:
    """The bytes M distinct messages of ``op`` take in the payload: an all_gather's output once,
    an all_reduce's values once a worker (a switch's lanes held as float64, twice their bytes)."""
    m = config.workers
    target = compressed(op, comp, m, config.switch_sums)
    if _in_lanes(op, comp, config):
        return 2 * m * target.bytes
    return target.bytes * (1 if comp.aggregation == Aggregation.ALL_GATHER else m)


@dataclass
class _Bucket:
    """One compressible all_reduce compressed on every sender: its messages and sums."""

    messages: list[np.ndarray]
    seeds: list[int]
    total: np.ndarray  # the senders' decompressed messages summed (an all_reduce's: their values), float64
    exact: np.ndarray  # the senders' gradients summed, float64


def _bucket(comp: Compressor, memory: ErrorFeedback, rows: np.ndarray, senders: int, seed: int, index: int,
            position: int) -> _Bucket:
    """``senders`` workers compress their gradients of collective ``index`` (``derived`` from the
    real ranks' ``rows``) with their error feedback, one worker at a time."""
    n = rows.shape[1]
    messages, seeds = [], []
    total, exact = np.zeros(n), np.zeros(n)
    for w in range(senders):
        x = derived(rows, w, seed, index)
        s = message_seed(comp, seed, index, w)
        with np.errstate(over="ignore"):  # fp16 of a large value is inf: _summable refuses it
            msg = memory.message(w, (position, n), x, s)
        if comp.aggregation == Aggregation.ALL_REDUCE:
            total += np.asarray(msg, np.uint8).view(comp.values).astype(np.float64)
        else:
            total += comp.decompress(msg, n, s)
        exact += x
        messages.append(msg)
        seeds.append(s)
    return _Bucket(messages, seeds, total, exact)


def _compress_all(colls: list[Coll], comp: Compressor, config: ReplayConfig, payload: RecordedPayload,
                  ) -> tuple[RecordedPayload | None, RealError | None, str | None]:
    k, m = payload.real_ranks, config.workers
    mirrors = _mirrors(colls, comp, config, payload)
    senders, mirror = (k, m // k) if mirrors else (m, 1)
    memory = ErrorFeedback(comp)
    exact: bool = True  # the switch's lanes unpack to the exact sums of the levels (where it sums them)
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
            target = compressed(op, comp, m, config.switch_sums)
            if _in_lanes(op, comp, config):
                lanes = _switch_bucket(comp, rows, senders, mirror, config, i)
                if isinstance(lanes, str):
                    return None, None, f"collective {op.id}: {lanes}"
                entry, got, want = lanes.entry, lanes.got, lanes.want
                exact = exact and lanes.exact
            else:
                b = _bucket(comp, memory, rows, senders, config.seed, i, position)
                entry = _entry(comp, b.messages, target, members(op, m), in_place=senders == m and op.group is None)
                if entry is None:
                    return None, None, f"{comp.label}'s message of collective {op.id} is not the size the plan gives"
                if not _summable(comp, entry, mirror):
                    return None, None, (f"the sum of {m} workers' {comp.label} values of collective {op.id} "
                                        "overflows their dtype")
                got, want = _aggregate(comp, b, op.count, mirror), mirror * b.exact
            tensors[i], dtypes[i] = entry, target.dtype.value
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
                      accumulated=accumulated, sample=_sample(payload, k, m, mirrors),
                      switch_exact=exact if any(_in_lanes(op, comp, config) for op in colls) else None)
    return RecordedPayload(k, payload.per_iteration, tuple(dtypes), tuple(tensors)), error, None


def _sample(payload: RecordedPayload, k: int, m: int, mirrors: str | None) -> str:
    """What the error was measured on (the report's ``error_sample``)."""
    head = (f"the real ranks' tensors (--payload): every compressed all_reduce of the {payload.iterations} recorded "
            "iterations, with error feedback, ")
    if mirrors is None:
        return head + (f"{m} workers' own gradients: the {k} real ranks' for the first {k}, for every other their "
                       "mean plus a residual of theirs drawn per element with a random sign (docs/compression.md), "
                       "each worker compressing its own with its own draws")
    return head + (f"{k} real ranks for {m} workers (the {m // k} workers of a real rank send its message, its random "
                   f"draws included: a stochastic quantizer's error does not average down with M here; {mirrors})")


def _in_lanes(op: Coll, comp: Compressor, config: ReplayConfig) -> bool:
    """A quantizer whose levels the switch sums in int32 lanes (``plan.compression.summed_in_switch``)."""
    return comp.aggregation == Aggregation.ALL_GATHER and summed_in_switch(op, comp, config.workers,
                                                                            config.switch_sums)


@dataclass(frozen=True)
class _Lanes:
    """One all_reduce of a quantizer's levels in the switch's lanes: the payload, the aggregate."""

    entry: np.ndarray  # (senders, lanes) float64: every lane an integer, exact in float64
    got: np.ndarray  # what the workers' summed lanes stand for (float64)
    want: np.ndarray  # the exact sum of the workers' gradients
    exact: bool  # the unpacked fields are exactly the sums of the levels


def _switch_bucket(comp: Compressor, rows: np.ndarray, senders: int, mirror: int, config: ReplayConfig,
                   index: int) -> _Lanes | str:
    """The senders' lanes of collective ``index``: their levels against the scale the stream
    negotiates per packet (the largest exponent of any worker's values there,
    ``in_switch.agreed_exponents``), packed; or why the stream could not carry them exactly (its
    fixed point would shift a lane's low bits out)."""
    m, n = config.workers, rows.shape[1]
    f, width = fields_per_lane(comp, m), field_bits(levels_of(comp) or 1, m)
    block = config.elements * f
    agreed = None
    for w in range(senders):  # the negotiation: every worker's exponents, before any sends
        agreed = agreed_exponents(derived(rows, w, config.seed, index), block, agreed)
    assert agreed is not None
    scale = scale_of(agreed, block, n)
    entry, want = [], np.zeros(n)
    summed = np.zeros(-(-n // f), np.int64)  # the lanes as the switch adds them
    fields = np.zeros(n, np.int64)  # the fields as they were sent, summed apart
    top = None  # per packet, the largest exponent of any worker's lanes: the stream's fixed point
    for w in range(senders):
        x = derived(rows, w, config.seed, index)
        lanes = worker_lanes(comp, x, scale, message_seed(comp, config.seed, index, w), m)
        top = agreed_exponents(lanes.astype(np.float64), config.elements, top)
        entry.append(lanes.astype(np.float64))
        summed += mirror * lanes.astype(np.int64)
        fields += mirror * unpack_lanes(lanes, width, f, n)
        want += mirror * x.astype(np.float64)
    assert top is not None
    if (fixedpoint.scale_shift(top[top != fixedpoint.EXP_NONE], m) < 0).any():
        return (f"the stream's fixed point at {m} workers would round {comp.label}'s int32 lanes (a lane uses "
                "its 31st bit)")
    exact = bool(np.array_equal(unpack_lanes(summed, width, f, n), fields))
    return _Lanes(np.stack(entry), lanes_value(comp, summed, scale, m, n), want, exact)


def _summable(comp: Compressor, entry: np.ndarray, mirror: int) -> bool:
    """An all_reduce of compressed values (fp16's, randomk's) whose every sum, in any order, stays
    finite in its dtype: at most ``mirror`` times the real ranks' magnitudes summed."""
    if comp.aggregation == Aggregation.ALL_GATHER:
        return True
    wide = entry.astype(np.float64)
    return bool(np.isfinite(wide).all() and (mirror * np.abs(wide).sum(axis=0)).max(initial=0.0)
                <= float(np.finfo(entry.dtype).max))


def _entry(comp: Compressor, messages: list[np.ndarray], target: Coll, group: int, in_place: bool,
           ) -> np.ndarray | None:
    """The payload vectors of the compressed collective ``target``: an all_gather's, one row a
    sender with its message over every chunk, or (``in_place``: every worker of the job sends its
    own) one row with each worker's message at its own chunk; an all_reduce's, one row of values a
    sender."""
    if comp.aggregation == Aggregation.ALL_GATHER:
        if any(len(msg) * group != target.count for msg in messages):
            return None
        if in_place:
            return np.concatenate(messages)[None, :]
        return np.stack([np.tile(msg, group) for msg in messages])
    values = [np.asarray(msg, np.uint8).view(comp.values) for msg in messages]
    if any(len(v) != target.count for v in values):
        return None
    return np.stack(values)


def _aggregate(comp: Compressor, b: _Bucket, n: int, mirror: int) -> np.ndarray:
    """What every worker ends with (float64): the senders' messages decompressed and combined,
    ``mirror`` workers a sender; an all_reduce's sum of the compressed forms, decompressed."""
    if comp.aggregation == Aggregation.ALL_REDUCE:
        raw = np.ascontiguousarray((mirror * b.total).astype(comp.values)).view(np.uint8)
        return comp.decompress(raw, n, b.seeds[0]).astype(np.float64)
    return mirrored(comp, [b.total], mirror)


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / norm if norm else 0.0
