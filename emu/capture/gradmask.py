"""Measuring gradient sparsity inside a rank: the block mask and the DDP communication hook.

Runs in the rank processes of a built-in workload (it imports torch). The hook has
``allreduce_hook`` semantics (divide by the world size, one all_reduce of the bucket, the
same collective DDP issues without a hook), so the profile and the trace keep their
collectives; before it issues the all_reduce it notes which blocks of the bucket's flattened
gradient hold a non-zero element. It adds no collective: each rank keeps its masks in
memory and writes them at the end (``emu.capture.sparsity`` combines the ranks' files).

The mask runs inside the measured backward pass, so it must be cheap: one pass over the
bucket (a bitwise OR per block of its 64-bit words, with numpy, on the tensor's memory:
no temporary as large as the bucket) and ``numpy.packbits`` of the few-KB result; the sample
of the bucket's values is a gather of 4,096 of them. The
recorder times itself (``cost_us``, kept in the mask file): about 1.4 ms for 6.4M float32
elements in a capture on 2 cores (docs/capture.md has the whole cost).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects
# (dist.GradBucket, torch.futures.Future[torch.Tensor]) and refuses them as strings.
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from emu.capture.sparsity import BLOCK_ELEMENTS, BucketMask, sample_positions, write_masks

# Per element size, the bits of a 64-bit word that are not a float's sign bit: a block is zero when
# the OR of its words, less the sign bits, is zero (-0.0 is zero; NaN and infinities are not).
_UNSIGNED = {2: 0x7FFF_7FFF_7FFF_7FFF, 4: 0x7FFF_FFFF_7FFF_FFFF, 8: 0x7FFF_FFFF_FFFF_FFFF}


def block_mask(tensor: torch.Tensor, block_elements: int = BLOCK_ELEMENTS) -> np.ndarray:
    """Per block of ``block_elements`` consecutive elements of the flattened tensor: does it hold a
    non-zero element? A zero threshold, as OmniReduce's default: -0.0 is zero, NaN is not. The last
    block may be shorter. A bool array of ``ceil(numel / block_elements)``."""
    flat = tensor.detach().reshape(-1)
    n = flat.numel()
    full = n // block_elements * block_elements
    size = flat.element_size()
    head: np.ndarray | None = None
    if (flat.device.type == "cpu" and flat.is_floating_point() and size in _UNSIGNED
            and block_elements * size % 8 == 0 and full):
        try:
            # OR-reducing the bucket's bits as 64-bit words reads it once and allocates nothing of
            # its size: about 4x faster than torch's `any` (about 0.2 ns an element in a rank)
            words = flat[:full].view(torch.int64).numpy().view(np.uint64)
        except RuntimeError:  # not 8-byte aligned (a view into another tensor): the general path
            words = None
        if words is not None:
            ored = np.bitwise_or.reduce(words.reshape(-1, block_elements * size // 8), axis=1)
            head = (ored & np.uint64(_UNSIGNED[size])) != 0
    if head is None:
        # `any` on a float tensor tests != 0 while it reduces: no bool copy of the tensor is made
        head = flat[:full].view(-1, block_elements).any(dim=1).cpu().numpy()
    if full == n:
        return head
    return np.append(head, bool(flat[full:].any()))


class SparsityRecorder:
    """The masks of one rank, per step and per bucket in issue order; the DDP hook's state."""

    def __init__(self, block_elements: int = BLOCK_ELEMENTS) -> None:
        self.block_elements = block_elements
        self.step = 0
        self.masks: list[BucketMask] = []
        self.cost_us: list[float] = []  # per mask, what measuring it took (docs/capture.md quotes it)
        self._order = 0
        self._positions: dict[int, torch.Tensor] = {}  # per bucket size, where its values are sampled

    def start_step(self, step: int) -> None:
        """Call before each step's forward pass; ``step`` is the loop index (ProfilerStep#N)."""
        self.step, self._order = step, 0

    def observe(self, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        bits = np.packbits(block_mask(tensor, self.block_elements))
        n = tensor.numel()
        at = self._positions.get(n)
        if at is None:
            at = self._positions[n] = torch.from_numpy(sample_positions(n))
        sample = tensor.detach().reshape(-1)[at].to(torch.float32).cpu().numpy()
        self.masks.append(BucketMask(step=self.step, order=self._order, elements=n, bits=bits, sample=sample))
        self._order += 1
        self.cost_us.append((time.perf_counter() - start) * 1e6)

    def save(self, path: Path) -> None:
        write_masks(path, self.block_elements, self.masks, self.cost_us)


def _hook(recorder: SparsityRecorder, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    recorder.observe(bucket.buffer())  # before the all_reduce sums the buffer in place
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group, as DDP's


def record_sparsity(ddp: torch.nn.parallel.DistributedDataParallel,
                    block_elements: int = BLOCK_ELEMENTS) -> SparsityRecorder:
    """Register the measuring hook on a DDP model (before its first forward pass)."""
    recorder = SparsityRecorder(block_elements)
    ddp.register_comm_hook(recorder, _hook)
    return recorder
