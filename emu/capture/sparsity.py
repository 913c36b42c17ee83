"""Gradient sparsity of a capture: the ranks' block masks, their file, and the trace's ``sparsity`` keys.

A built-in workload captured with sparsity on (``emu capture --model``, the default) runs a DDP
communication hook (``emu.capture.gradmask``) that, before each gradient bucket's all_reduce,
marks which blocks of ``BLOCK_ELEMENTS`` elements of the bucket hold a non-zero value. No
collective is added to the run (it would show in the profile): each rank writes its masks to
``rank<R>.sparsity.npz`` in the capture's work folder, and after the ranks' Kineto files are merged
``attach_sparsity`` combines the ranks' masks into each all_reduce's ``Sparsity``: ``nonzero`` from
the rank's own mask, ``union`` from the OR of every rank's mask of that bucket. The hook also keeps
the bucket's values at ``SAMPLE_ELEMENTS`` positions drawn alike on every rank (``sample_positions``),
which become the trace's ``gradient_samples``: the real distribution a replay's compressors are
measured on (docs/compression.md).

Masks are matched to collectives by step (the workload's loop index, which is the
``ProfilerStep`` number: the profiler steps once per optimizer step from the first) and by
order among the step's all_reduces (DDP issues its buckets in order, one hook call each).

This module is numpy only: it runs in emu's own process, which never imports torch.
"""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emu.errors import CaptureError
from emu.files import write_atomic
from emu.traces.model import Coll, CollKind, GradientSample, Iteration, RankProgram, Sparsity, Trace

BLOCK_ELEMENTS = 256  # OmniReduce's default block size
SAMPLE_ELEMENTS = 4096  # values of a bucket's gradient sampled per rank and step (GradientSample)
_KEYS = ("block_elements", "step", "order", "elements", "offset", "bits")


def sample_positions(elements: int, n: int = SAMPLE_ELEMENTS) -> np.ndarray:
    """The positions of a bucket of ``elements`` whose values a rank samples: ``n`` of them drawn
    without replacement, sorted, seeded by the bucket's size alone, so every rank of the job draws
    the same ones and their samples pair element by element (every position where ``n`` covers it)."""
    if elements <= n:
        return np.arange(elements, dtype=np.int64)
    return np.sort(np.random.default_rng(elements).choice(elements, n, replace=False)).astype(np.int64)


def mask_path(folder: Path, rank: int) -> Path:
    """Where a rank writes its masks in the capture's work folder."""
    return folder / f"rank{rank}.sparsity.npz"


def block_count(elements: int, block_elements: int) -> int:
    """Blocks of a tensor of ``elements``: the last one may be shorter."""
    return -(-elements // block_elements)


@dataclass(frozen=True)
class BucketMask:
    """One bucket's blocks on one rank at one step: bit i set when block i held a non-zero element.

    ``bits`` is ``numpy.packbits`` of the mask (big bit order, zero-padded to whole bytes).
    """

    step: int
    order: int  # among the step's bucket all_reduces, in issue order
    elements: int
    bits: np.ndarray
    sample: np.ndarray | None = None  # float32 values at ``sample_positions(elements)``

    def nonzero_blocks(self, block_elements: int) -> int:
        n = block_count(self.elements, block_elements)
        return int(np.unpackbits(self.bits, count=n).sum())


@dataclass(frozen=True)
class RankMasks:
    """Everything one rank recorded."""

    path: str
    block_elements: int
    masks: Mapping[tuple[int, int], BucketMask]  # by (step, order)

    @property
    def steps(self) -> dict[int, int]:
        """Bucket masks recorded per step."""
        out: dict[int, int] = {}
        for step, _order in self.masks:
            out[step] = out.get(step, 0) + 1
        return out


def write_masks(path: Path, block_elements: int, masks: Sequence[BucketMask],
                cost_us: Sequence[float] | None = None) -> None:
    """One file per rank: the packed masks end to end, with per-bucket step, order, size, offset
    (and what measuring each took, ``cost_us``, for the record: the trace does not use it)."""
    offsets = np.cumsum([0] + [m.bits.size for m in masks[:-1]], dtype=np.int64) if masks else np.zeros(0, np.int64)
    bits = np.concatenate([m.bits for m in masks]) if masks else np.zeros(0, np.uint8)
    samples = [np.zeros(0, "<f4") if m.sample is None else m.sample.astype("<f4") for m in masks]
    write_atomic(path, lambda f: np.savez(
        f, block_elements=np.int64(block_elements),
             step=np.array([m.step for m in masks], np.int64),
             order=np.array([m.order for m in masks], np.int64),
             elements=np.array([m.elements for m in masks], np.int64), offset=offsets,
        bits=bits.astype(np.uint8), cost_us=np.array(cost_us if cost_us is not None else [], np.float64),
        sample_lengths=np.array([len(s) for s in samples], np.int64),
        samples=np.concatenate(samples) if samples else np.zeros(0, "<f4")),
        "the sparsity masks", CaptureError)


def read_masks(path: Path) -> RankMasks:
    """A rank's mask file, checked: a damaged one is a CaptureError naming it and the way out."""
    fix = "capture again, or with --no-sparsity"
    try:
        with np.load(path, allow_pickle=False) as doc:
            arrays = {key: doc[key] for key in _KEYS}
            samples = (doc["sample_lengths"], doc["samples"]) if "samples" in doc else None
    except FileNotFoundError:
        raise CaptureError(f"{path}: the rank wrote no sparsity masks (its log is beside it); {fix}") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CaptureError(f"{path}: not a sparsity mask file emu wrote ({exc}); {fix}") from None
    block = int(arrays["block_elements"])
    n = arrays["step"].size
    bits = arrays["bits"]
    if block < 1 or any(arrays[k].shape != (n,) for k in ("order", "elements", "offset")) or bits.dtype != np.uint8:
        raise CaptureError(f"{path}: the mask file's arrays disagree in length or type; {fix}")
    values = _samples(path, samples, n, fix)
    masks: dict[tuple[int, int], BucketMask] = {}
    for i, (step, order, elements, offset) in enumerate(zip(*(arrays[k].tolist() for k in
                                                              ("step", "order", "elements", "offset")), strict=True)):
        size = -(-block_count(elements, block) // 8)
        if elements < 0 or offset < 0 or offset + size > bits.size:
            raise CaptureError(f"{path}: step {step}, bucket {order}: its {elements} elements need {size} bytes "
                               f"of mask at offset {offset}, past the file's {bits.size}; {fix}")
        masks[(step, order)] = BucketMask(step=step, order=order, elements=elements, bits=bits[offset:offset + size],
                                          sample=values[i] if values is not None and len(values[i]) else None)
    return RankMasks(path=str(path), block_elements=block, masks=masks)


def _samples(path: Path, samples: tuple[np.ndarray, np.ndarray] | None, n: int, fix: str) -> list[np.ndarray] | None:
    """The masks' gradient samples, split (None: the file has none)."""
    if samples is None:
        return None
    lengths, values = samples
    if lengths.shape != (n,) or (lengths < 0).any() or int(lengths.sum()) != values.size or values.dtype != "<f4":
        raise CaptureError(f"{path}: the gradient samples disagree with the masks in length or type; {fix}")
    return np.split(values, np.cumsum(lengths)[:-1]) if n else []


def union_blocks(masks: Sequence[BucketMask], block_elements: int) -> int:
    """Blocks non-zero on at least one of the ranks' masks of one bucket."""
    n = block_count(masks[0].elements, block_elements)
    either = np.bitwise_or.reduce(np.stack([m.bits for m in masks]), axis=0)
    return int(np.unpackbits(either, count=n).sum())


def _bucket_all_reduces(it: Iteration) -> list[int]:
    """Indexes into ``it.ops`` of the float all_reduces, in issue order (one per gradient bucket; an
    integer all_reduce, such as find_unused_parameters' bitmap, is not a bucket)."""
    return [k for k, op in enumerate(it.ops)
            if isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE and op.dtype.is_float]


def attach_sparsity(trace: Trace, ranks: Mapping[int, RankMasks]) -> Trace:
    """The trace with ``Sparsity`` on every all_reduce, from every rank's masks.

    Every rank of the job must have recorded (the union needs them all), and each all_reduce must
    meet a mask of its step and order with its element count: anything else means the hook and
    the profile saw different collectives, and the capture is refused rather than guessed.
    """
    world = trace.meta.world_size
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise CaptureError(f"no sparsity masks from rank {missing[0]} of {world}: the union of the ranks' "
                           "non-zero blocks needs every rank; capture again, or with --no-sparsity")
    blocks = {m.block_elements for m in ranks.values()}
    if len(blocks) != 1:
        raise CaptureError(f"the ranks' mask files use different block sizes ({sorted(blocks)}): "
                           f"{', '.join(m.path for m in ranks.values())}; capture again")
    block = blocks.pop()
    steps = {rank: rm.steps for rank, rm in ranks.items()}
    programs, samples = [], []
    for program in trace.ranks:
        its = []
        for t, it in enumerate(program.iterations):
            ops = list(it.ops)
            buckets = _bucket_all_reduces(it)
            recorded = steps[program.rank].get(it.step, 0)
            if recorded != len(buckets):  # the whole step's sequence must match, not only the sizes
                raise CaptureError(f"{ranks[program.rank].path}: step {it.step} has {recorded} bucket mask(s) "
                                   f"but the profile recorded {len(buckets)} float all_reduce(s): the hook and the "
                                   "profile disagree; capture again with --no-sparsity")
            for order, k in enumerate(buckets):
                op = ops[k]
                assert isinstance(op, Coll)
                mine = _mask(ranks, program.rank, it.step, order, op)
                every = [_mask(ranks, r, it.step, order, op) for r in range(world)]
                n = block_count(op.count, block)
                sparsity = Sparsity(block_elements=block, nonzero=mine.nonzero_blocks(block) / n if n else 0.0,
                                    union=union_blocks(every, block) / n if n else 0.0)
                ops[k] = dataclasses.replace(op, sparsity=sparsity)
                if mine.sample is not None:
                    samples.append(GradientSample(rank=program.rank, iteration=t, coll=op.id,
                                                  values=mine.sample.astype("<f4").tobytes()))
            its.append(dataclasses.replace(it, ops=tuple(ops)))
        programs.append(RankProgram(rank=program.rank, iterations=tuple(its)))
    return dataclasses.replace(trace, ranks=tuple(programs), gradient_samples=tuple(samples))


def _mask(ranks: Mapping[int, RankMasks], rank: int, step: int, order: int, op: Coll) -> BucketMask:
    rm = ranks[rank]
    mask = rm.masks.get((step, order))
    if mask is None:
        raise CaptureError(f"{rm.path}: no mask of step {step}, all_reduce {order} (op id {op.id}): the "
                           "communication hook did not see every all_reduce the profiler recorded; capture "
                           "again with --no-sparsity")
    if mask.elements != op.count:
        raise CaptureError(f"{rm.path}: step {step}, all_reduce {order} (op id {op.id}): the mask covers "
                           f"{mask.elements} elements but the collective has {op.count}: the hook and the "
                           "profile disagree on the buckets; capture again with --no-sparsity")
    return mask
