"""Compressed gradients in a replay (``--compress``; docs/compression.md).

Every float all_reduce of the trace becomes the collective its compressor uses, at the true
compressed size (``emu.emulator.compression.compressors``): an all_reduce of the compressed form where it can be
summed (fp16, randomk, PowerSGD's factors), else an all_gather of every worker's packed bytes,
whose output grows with the number of workers. Compressing is compute before the collective is
issued, decompressing (every gathered message, and their sum) compute after the wait that needs
its result, both from the cost model the compressors measured (``cost_us``), ``--compress-speed``
times faster. The fabric then moves and verifies those bytes as any others.

On ``ina`` (``switch_sums``), the quantizers whose levels the switch can add (signsgd, terngrad,
qsgd: ``emu.emulator.compression.in_switch``) are an all_reduce of int32 lanes instead, each lane a few
levels, summed in the switch.

What the compressor does to the numbers is measured apart, on gradients generated for the
purpose (``error_of``): the relative error of one step's aggregate against the exact sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from emu.emulator.compression.compressors import Aggregation, Compressor, ErrorFeedback, PowerSgd, aggregate, cost_us
from emu.emulator.compression.in_switch import lanes, switch_aggregate
from emu.replay.report.model import CompressionReport
from emu.traces.model import Coll, CollKind, Compute, Dtype, GradientSample, Iteration, Op, RankProgram, Wait

ERROR_ELEMENTS = 1 << 16  # the sample of the gradient the error is measured on
ERROR_WORKERS = 16
ERROR_STEPS = 8  # steps the accumulated error is followed over (error feedback's effect)


def compressible(op: Op, comp: Compressor) -> bool:
    """A float all_reduce of a dense tensor (a gradient bucket). The framework's own sparse
    all_reduce stays as it is (DDP's hooks do not take sparse gradients), and fp16 leaves 16-bit
    tensors alone (nothing to gain)."""
    return (isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE
            and comp.takes(op.dtype.is_float, op.dtype.itemsize, op.count)
            and not (op.sparsity is not None and op.sparsity.sparse_tensor))


def members(op: Coll, workers: int) -> int:
    """The workers an all_gather of ``op`` gathers from: its sub-group's, else the job's."""
    return op.group_size if op.group is not None else workers


def for_op(comp: Compressor, op: Coll) -> Compressor:
    """The compressor of one all_reduce: PowerSGD takes the bucket's parameter shapes."""
    return replace(comp, shapes=op.tensors) if isinstance(comp, PowerSgd) else comp


def summed_in_switch(op: Coll, comp: Compressor, workers: int, switch_sums: bool) -> bool:
    """Whether the fabric's switch sums ``op`` compressed: an all_reduce compressor's form, or a
    quantizer's levels in int32 lanes (where a lane holds a field at the group's size)."""
    return switch_sums and (comp.aggregation == Aggregation.ALL_REDUCE
                            or lanes(comp, op.count, members(op, workers)) is not None)


def compressed(op: Coll, comp: Compressor, workers: int, switch_sums: bool = False) -> Coll:
    """The collective that carries ``op``'s gradient compressed (same id, no sparsity: a compressed
    gradient is coded densely). ``switch_sums``: the fabric sums all_reduces in a switch (INA),
    which takes a quantizer's levels as an all_reduce of int32 lanes (the stream's packets carry
    int32 whatever the all_reduce's float dtype: float32 is what the stream takes)."""
    group = members(op, workers)
    if switch_sums and comp.aggregation == Aggregation.ALL_GATHER:
        count = lanes(comp, op.count, group)
        if count is not None:
            return replace(op, dtype=Dtype.FLOAT32, count=count, bytes=4 * count, sparsity=None, tensors=None)
    size = comp.wire_bytes(op.count)
    if comp.aggregation == Aggregation.ALL_GATHER:
        return replace(op, kind=CollKind.ALL_GATHER, dtype=Dtype.UINT8, count=size * group,
                       bytes=size * group, sparsity=None, tensors=None)
    dtype = Dtype(comp.values)
    count = -(-size // dtype.itemsize)
    return replace(op, dtype=dtype, count=count, bytes=count * dtype.itemsize, sparsity=None, tensors=None)


def with_compression(ranks: tuple[RankProgram, ...], workers: int, comp: Compressor,
                     speed: float, switch_sums: bool = False) -> tuple[RankProgram, ...]:
    """The rank programs with every float all_reduce compressed (the same objects for ``none``);
    ``switch_sums``: the fabric sums all_reduces in a switch (``compressed``)."""
    if comp.name == "none":
        return ranks

    def pick(op: Coll) -> Compressor | None:
        return comp if compressible(op, comp) else None

    return tuple(replace(r, iterations=tuple(compress_iteration(it, workers, pick, speed, switch_sums)
                                             for it in r.iterations))
                 for r in ranks)


def compress_iteration(it: Iteration, workers: int, pick: Callable[[Coll], Compressor | None], speed: float,
                       switch_sums: bool) -> Iteration:
    """One iteration with each collective ``pick`` gives a compressor for compressed: compute to
    compress before its issue, the compressed collective, compute to decompress after the wait
    that needs it. PowerSGD's two all_reduces (P, then Q) are issued back to back: the stream is
    FIFO, so Q starts when P has completed, as the hook's callback chain starts it; a wait for
    the bucket waits for both."""
    ops: list[Op] = []
    pending: dict[int, float] = {}  # collective id -> its decompression, due at its wait
    second: dict[int, int] = {}  # a PowerSGD bucket's id -> its Q all_reduce's id
    next_id = max((op.id for op in it.colls), default=-1) + 1
    for op in it.ops:
        comp = pick(op) if isinstance(op, Coll) else None
        if comp is not None:
            assert isinstance(op, Coll)
            c = for_op(comp, op)
            before, after = cost_us(c, op.count, members(op, workers), speed,
                                    summed_in_switch(op, c, workers, switch_sums))
            ops.append(Compute(name="compress", dur_us=before))
            if isinstance(c, PowerSgd) and c.sizes(op.count)[1]:
                p, q = c.sizes(op.count)
                ops += [replace(op, dtype=Dtype.FLOAT32, count=p, bytes=4 * p, sparsity=None, tensors=None),
                        replace(op, id=next_id, dtype=Dtype.FLOAT32, count=q, bytes=4 * q, sparsity=None, tensors=None)]
                second[op.id] = next_id
                next_id += 1
            else:
                ops.append(compressed(op, c, workers, switch_sums))
            pending[op.id] = after
            continue
        if isinstance(op, Wait) and any(i in second for i in op.ids):
            op = Wait(ids=tuple(j for i in op.ids for j in ((i, second[i]) if i in second else (i,))),
                      blocked_us=op.blocked_us)
        ops.append(op)
        if isinstance(op, Wait):
            due = sum(pending.pop(i, 0.0) for i in op.ids)
            if due:
                ops.append(Compute(name="decompress", dur_us=due))
    if pending:  # nothing waited for them in the iteration: decompressed once they are in
        ids = tuple(j for i in pending for j in ((i, second[i]) if i in second else (i,)))
        ops += [Wait(ids=ids), Compute(name="decompress", dur_us=sum(pending.values()))]
    return replace(it, ops=tuple(ops))


def gradients(seed: int, n: int, workers: int) -> list[np.ndarray]:
    """Gradients of data-parallel workers: a part every worker shares (the model's true gradient)
    plus a part of each worker's own (its batch's noise), Gaussian, float32."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(n)
    return [((shared + rng.standard_normal(n)) * 2.0**-8).astype(np.float32) for _ in range(workers)]


def derived(rows: np.ndarray, worker: int, seed: int, index: int) -> np.ndarray:
    """Worker ``worker``'s gradient (float32) of collective ``index`` from the K real ranks' ``rows``
    (K, n): a real rank's own for the first K workers; for every other, the ranks' mean plus,
    element by element, one of their residuals from it, drawn at random with a random sign (seeded
    by the run, the collective and the worker): the recorded spread resampled."""
    k, n = rows.shape
    if worker < k:
        return rows[worker]
    rng = np.random.default_rng([seed, index, worker])
    mean = rows.mean(axis=0, dtype=np.float64)
    pick = rng.integers(0, k, n)
    sign = rng.integers(0, 2, n) * 2 - 1
    return (mean + sign * (rows[pick, np.arange(n)] - mean)).astype(np.float32)


@dataclass(frozen=True)
class StepError:
    """One step's aggregate against the exact sum (``error_of``)."""

    error: float  # relative L2 error
    cosine: float  # cosine similarity (a sign method's aggregate is a direction: its L2 error is large by design)
    sample: str  # what it was measured on
    exact: bool | None  # summed in the switch: its int32 lanes held exactly the sums of the levels


def _combined(c: Compressor, grads: list[np.ndarray], seed: int, packet_lanes: int,
              workers: int) -> tuple[np.ndarray, bool | None]:
    """The aggregate the workers end with: summed in the switch's lanes where ``packet_lanes``
    (INA's values a packet) is given and the switch can sum ``c`` at ``workers`` (the job's: the
    lanes are packed as the replay packs them, for a sample of its workers), else decompressed
    and combined."""
    if packet_lanes and lanes(c, len(grads[0]), workers) is not None and c.aggregation == Aggregation.ALL_GATHER:
        got = switch_aggregate(c, grads, seed, packet_lanes, workers)
        return got.aggregate, got.exact
    return aggregate(c, grads, seed), None


def error_of(comp: Compressor, op: Coll, workers: int, seed: int, packet_lanes: int = 0,
             sampled: list[np.ndarray] | None = None) -> StepError:
    """One step's relative L2 error of the compressed aggregate against the exact sum, and their
    cosine similarity, on the first ``ERROR_ELEMENTS`` of the gradient (PowerSGD: its first tensors)
    of ``ERROR_WORKERS`` at most; ``packet_lanes``: summed in the switch where it can be;
    ``sampled``: the ranks' values of ``op`` sampled at capture, per iteration (``sampled_rows``),
    the workers' gradients ``derived`` from the first (never for PowerSGD, whose matrices' first rows
    are generated: ``report`` passes none)."""
    c, n, w = _sample(comp, op, workers)
    if sampled is not None:
        n = sampled[0].shape[1]
        grads = [derived(sampled[0], i, seed, 0) for i in range(w)]
    else:
        grads = gradients(seed, n, w)
    exact = np.sum(grads, axis=0, dtype=np.float64)
    combined, lanes_exact = _combined(c, grads, seed, packet_lanes, members(op, workers))
    got = combined.astype(np.float64)
    norm, got_norm = float(np.linalg.norm(exact)), float(np.linalg.norm(got))
    error = float(np.linalg.norm(got - exact)) / norm if norm else 0.0
    cosine = float(got @ exact) / (norm * got_norm) if norm and got_norm else 0.0
    where = ", summed in the switch's int32 lanes" if lanes_exact is not None else ""
    if sampled is not None:
        k = sampled[0].shape[0]
        return StepError(error, cosine, f"{n} values of the largest compressed all_reduce's gradient sampled at "
                         f"capture on each of {k} ranks (the same positions on every rank), {w} workers (the ranks' "
                         f"own, the others derived from them: docs/compression.md){where}, one step without error "
                         "feedback's memory", lanes_exact)
    what = "its matrices' first rows" if isinstance(c, PowerSgd) else "the first elements"
    return StepError(error, cosine, f"{n} elements ({what}) of the largest compressed all_reduce, {w} workers{where}, "
                     "one step without error feedback's memory, Gaussian gradients (a shared part and each "
                     "worker's own)", lanes_exact)


def accumulated_error(comp: Compressor, op: Coll, workers: int, seed: int,
                      steps: int = ERROR_STEPS, packet_lanes: int = 0,
                      sampled: list[np.ndarray] | None = None) -> list[float]:
    """After each of ``steps`` steps (new gradients each), the relative L2 error of the sum of the
    compressed aggregates so far against the sum of the exact ones: the error in the model's
    accumulated update, which error feedback keeps bounded (what one step drops is sent later)
    and an unbiased compressor averages down. The sample of ``error_of`` (``sampled``: the captured
    iterations in turn); PowerSGD without its memory."""
    c, n, w = _sample(comp, op, workers)
    if sampled is not None:
        n = min(rows.shape[1] for rows in sampled)
    memory = ErrorFeedback(c)
    got = np.zeros(n)
    exact = np.zeros(n)
    out = []
    for t in range(steps):
        if sampled is not None:
            rows = sampled[t % len(sampled)][:, :n]
            grads = [derived(rows, i, seed + 7919 * (t + 1), t) for i in range(w)]
        else:
            grads = gradients(seed + 7919 * (t + 1), n, w)
        if isinstance(c, PowerSgd):
            step = c.aggregate(grads, seed + t)
        elif not c.feedback:  # the quantizers: nothing carried over, maybe summed in the switch
            step, _ = _combined(c, grads, seed + 1009 * t, packet_lanes, members(op, workers))
        else:
            shared = c.aggregation == Aggregation.ALL_REDUCE  # randomk's indices: one seed for all
            step = c.combine([memory.step(i, 0, g, seed + 1009 * t + (0 if shared else i))[1]
                              for i, g in enumerate(grads)])
        got += step
        exact += np.sum(grads, axis=0, dtype=np.float64)
        norm = float(np.linalg.norm(exact))
        out.append(round(float(np.linalg.norm(got - exact)) / norm, 6) if norm else 0.0)
    return out


def _sample(comp: Compressor, op: Coll, workers: int) -> tuple[Compressor, int, int]:
    """What the error is measured on: the compressor (PowerSGD's on a cut of its matrices), the
    elements and the workers."""
    c = for_op(comp, op)
    if isinstance(c, PowerSgd) and c.shapes is not None:
        c, n = _powersgd_sample(c)
    else:
        n = min(op.count, ERROR_ELEMENTS)
    return c, n, min(workers, ERROR_WORKERS)


def _powersgd_sample(comp: PowerSgd) -> tuple[PowerSgd, int]:
    """PowerSGD's error sample: the bucket's matrices (what it compresses), each cut to its first
    rows so that together they hold about ``ERROR_ELEMENTS``, at least ``rank + 1`` rows each; the
    vectors only where the bucket has no matrix."""
    assert comp.shapes is not None
    r = int(comp.param or 1)
    matrices = [s for s in comp.shapes if len(s) >= 2]
    if not matrices:
        vectors = [s for s in comp.shapes if len(s) < 2][:1]
        return replace(comp, shapes=tuple(vectors)), int(np.prod(vectors[0])) if vectors and vectors[0] else 1
    share = max(1, ERROR_ELEMENTS // len(matrices))
    shapes = []
    for s in matrices:
        cols = int(np.prod(s[1:]))
        rows = min(s[0], max(r + 1, share // max(cols, 1)))
        shapes.append((rows, cols))
    return replace(comp, shapes=tuple(shapes)), sum(a * b for a, b in shapes)


def sampled_rows(samples: tuple[GradientSample, ...], ranks: tuple[RankProgram, ...], op: Coll,
                 ) -> list[np.ndarray] | None:
    """Per iteration where every rank's program has a capture's sample of ``op`` (by its id), the
    ranks' samples (K, n) float32; None where there is none (an imported trace, a user's script)."""
    by = {(g.rank, g.iteration, g.coll): g for g in samples}
    out = []
    for t in range(min((len(r.iterations) for r in ranks), default=0)):
        got = [by.get((r.rank, t, op.id)) for r in ranks]
        if all(g is not None for g in got):
            arrays = [g.array() for g in got if g is not None]
            n = min(len(a) for a in arrays)
            if n:
                out.append(np.stack([a[:n] for a in arrays]).astype(np.float32))
    return out or None


def report(ranks: tuple[RankProgram, ...], workers: int, comp: Compressor, speed: float,
           seed: int, switch_sums: bool = False, packet_elements: int = 64,
           samples: tuple[GradientSample, ...] = ()) -> CompressionReport | None:
    """The report's ``compression`` for the rank programs before compression (None for ``none``).
    ``switch_sums``: the fabric aggregates all_reduces in a switch whose packets carry int32 (INA)
    of ``packet_elements`` a packet, so an all_reduce's bytes are 4 a value whatever the dtype,
    dense or compressed, and a quantizer's levels are summed in int32 lanes; an all_gather is
    multicast by the switch there (docs/protocol.md), its packed bytes as they are."""
    if comp.name == "none" or not ranks or not ranks[0].iterations:
        return None
    it: Iteration = ranks[0].iterations[0]
    ops = [op for op in it.colls if compressible(op, comp)]
    dense = compressed_bytes = 0
    before = after = 0.0
    in_switch = bool(ops) and all(summed_in_switch(op, comp, workers, switch_sums) for op in ops)
    for op in ops:
        c = for_op(comp, op)
        summed = summed_in_switch(op, c, workers, switch_sums)
        dense += 4 * op.count if switch_sums else op.bytes
        compressed_bytes += 4 * compressed(op, c, workers, switch_sums).count if summed else c.wire_bytes(op.count)
        b, a = cost_us(c, op.count, members(op, workers), speed, summed)
        before, after = before + b, after + a
    largest = max(ops, key=lambda o: o.count) if ops else None
    lanes_ = packet_elements if in_switch else 0
    sampled = (sampled_rows(samples, ranks, largest)
               if largest and not isinstance(for_op(comp, largest), PowerSgd) else None)
    step = error_of(comp, largest, workers, seed, lanes_, sampled) if largest else None
    drift = accumulated_error(comp, largest, workers, seed, packet_lanes=lanes_, sampled=sampled) if largest else None
    aggregation = comp.aggregation.value if not in_switch else Aggregation.ALL_REDUCE.value
    return CompressionReport(
        compressor=comp.label, aggregation=aggregation, feedback=comp.feedback, in_switch=in_switch,
        collectives=len(ops),
        bytes_dense=dense, bytes_compressed=compressed_bytes,
        ratio=dense / compressed_bytes if compressed_bytes else 1.0, compress_us=before, decompress_us=after,
        speed=speed, error=step.error if step else None, cosine=step.cosine if step else None,
        error_sample=step.sample if step else None, error_accumulated=drift,
        switch_exact=step.exact if step else None, data="sampled" if sampled else "generated")
