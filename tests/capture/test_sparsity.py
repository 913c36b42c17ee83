"""Gradient block sparsity: the block mask on hand-made tensors, the ranks' mask files, and the
union the merge computes from every rank's masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emu.capture.sparsity import (
    BLOCK_ELEMENTS,
    SAMPLE_ELEMENTS,
    BucketMask,
    attach_sparsity,
    block_count,
    mask_path,
    read_masks,
    sample_positions,
    write_masks,
)
from emu.errors import CaptureError
from emu.traces import (
    Coll,
    CollKind,
    Compute,
    Dtype,
    Iteration,
    RankProgram,
    Source,
    Trace,
    TraceMeta,
    Wait,
    load_trace,
    save_trace,
    validate_trace,
)

torch = pytest.importorskip("torch", reason="the block mask runs in torch's rank processes")
from emu.capture.gradmask import SparsityRecorder, block_mask  # noqa: E402  (needs torch)


def reference(tensor, block: int = BLOCK_ELEMENTS) -> np.ndarray:
    """Block by block, with float comparison: the definition the fast path must meet."""
    flat = tensor.reshape(-1).float()
    return np.array([bool((flat[i:i + block] != 0).any()) for i in range(0, flat.numel(), block)])


def test_all_zero_has_no_nonzero_block() -> None:
    assert block_mask(torch.zeros(1024)).tolist() == [False] * 4
    assert block_mask(torch.zeros(1000)).tolist() == [False] * 4  # 3 whole blocks and a tail of 232


@pytest.mark.parametrize("index, block", [(0, 0), (255, 0), (256, 1), (511, 1), (512, 2), (767, 2)])
def test_one_nonzero_element_marks_its_block_only(index: int, block: int) -> None:
    x = torch.zeros(768)
    x[index] = -3.5
    expected = [False] * 3
    expected[block] = True
    assert block_mask(x).tolist() == expected


def test_tail_block_shorter_than_a_block() -> None:
    x = torch.zeros(256 * 2 + 7)
    assert block_mask(x).tolist() == [False, False, False]
    x[-1] = 1e-30  # any non-zero counts: a zero threshold
    assert block_mask(x).tolist() == [False, False, True]
    assert block_mask(torch.tensor([0.0, 2.0])).tolist() == [True]  # smaller than one block
    assert block_mask(torch.zeros(0)).tolist() == []


def test_negative_zero_is_zero_and_nan_is_not() -> None:
    x = torch.zeros(3 * 256)
    x[:256] = -0.0
    x[300] = float("nan")
    x[600] = float("-inf")
    assert block_mask(x).tolist() == [False, True, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_agree_with_the_definition(dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.zeros(256 * 40 + 100, dtype=dtype)
    hot = torch.randint(0, x.numel(), (25,), generator=gen)
    x[hot] = torch.randn(25, generator=gen).to(dtype)
    x[torch.randint(0, x.numel(), (25,), generator=gen)] = -0.0
    assert block_mask(x).tolist() == reference(x).tolist()


def test_views_shapes_and_other_block_sizes() -> None:
    base = torch.zeros(2000)
    base[300] = 1.0
    shifted = base[1:]  # not 8-byte aligned: the general path
    assert block_mask(shifted).tolist() == reference(shifted).tolist() == [False, True, False, False, False, False,
                                                                            False, False]
    grid = torch.zeros(4, 256)
    grid[2, 0] = 1.0
    assert block_mask(grid).tolist() == [False, False, True, False]  # flattened row-major
    assert block_mask(torch.tensor([0.0, 0, 0, 1, 0, 0, 0, 0, 2]), block_elements=4).tolist() == [True, False, True]
    assert block_mask(torch.tensor([1, 0, 0, 0, 0, 0]), block_elements=3).tolist() == [True, False]  # integers


def test_recorder_file_roundtrip(tmp_path: Path) -> None:
    rec = SparsityRecorder()
    for step in (3, 4):
        rec.start_step(step)
        for size in (600, 256):
            x = torch.zeros(size)
            x[step] = 1.0
            rec.observe(x)
    rec.save(mask_path(tmp_path, 0))
    got = read_masks(tmp_path / "rank0.sparsity.npz")
    assert got.block_elements == 256 and sorted(got.masks) == [(3, 0), (3, 1), (4, 0), (4, 1)]
    assert got.masks[(4, 0)].elements == 600 and got.masks[(4, 0)].nonzero_blocks(256) == 1
    assert np.unpackbits(got.masks[(3, 0)].bits, count=3).tolist() == [1, 0, 0]
    assert len(rec.cost_us) == 4 and all(c >= 0 for c in rec.cost_us)
    # the gradient's values at the positions every rank samples (all of a bucket this small)
    assert np.array_equal(got.masks[(4, 0)].sample, np.eye(1, 600, 4, dtype=np.float32)[0])
    big = torch.arange(10_000, dtype=torch.float32)
    rec.observe(big)
    at = sample_positions(10_000)
    assert len(at) == SAMPLE_ELEMENTS == len(set(at.tolist())) and np.array_equal(at, sample_positions(10_000))
    assert np.array_equal(rec.masks[-1].sample, at.astype(np.float32))


def test_damaged_or_missing_mask_file(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="rank1.sparsity.npz: the rank wrote no sparsity masks"):
        read_masks(mask_path(tmp_path, 1))
    bad = mask_path(tmp_path, 0)
    bad.write_bytes(b"not a zip")
    with pytest.raises(CaptureError, match="not a sparsity mask file emu wrote.*--no-sparsity"):
        read_masks(bad)
    write_masks(bad, 256, [BucketMask(step=0, order=0, elements=256 * 100, bits=np.zeros(2, np.uint8))])
    with pytest.raises(CaptureError, match="need 13 bytes of mask at offset 0, past the file's 2"):
        read_masks(bad)


# --- the merge: union from every rank's masks ------------------------------------------------

def packed(*blocks: int, n: int) -> np.ndarray:
    mask = np.zeros(n, bool)
    mask[list(blocks)] = True
    return np.packbits(mask)


def two_rank_trace(counts: tuple[int, ...] = (256 * 10, 256 * 3 + 1)) -> Trace:
    def program(rank: int) -> RankProgram:
        ops = [Compute("forward", 100.0),
               Coll(id=0, kind=CollKind.BROADCAST, dtype=Dtype.INT64, count=4, bytes=32, group_size=2, root=0)]
        for k, count in enumerate(counts, start=1):
            ops += [Compute("backward", 50.0), Coll(id=k, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32,
                                                    count=count, bytes=4 * count, group_size=2)]
        ops += [Wait(ids=tuple(range(1, len(counts) + 1))), Compute("optimizer", 10.0)]
        return RankProgram(rank, (Iteration(step=3, measured_us=300.0, ops=tuple(ops)),))

    meta = TraceMeta(source=Source.CAPTURE, world_size=2, backend="gloo", device="cpu", framework="torch",
                     dtype="float32", captured_at="2026-11-30T00:00:00Z", model="dlrm")
    return Trace(meta=meta, ranks=(program(0), program(1)))


def masks_of(path: str, buckets: dict[int, tuple[int, np.ndarray]], step: int = 3):
    from emu.capture.sparsity import RankMasks
    return RankMasks(path=path, block_elements=256, masks={
        (step, order): BucketMask(step=step, order=order, elements=elements, bits=bits)
        for order, (elements, bits) in buckets.items()})


def test_merge_computes_union_from_both_ranks(tmp_path: Path) -> None:
    trace = two_rank_trace()
    # bucket 0: 10 blocks; rank 0 has 0, 1, 2 non-zero, rank 1 has 2, 3: union 0..3
    # bucket 1: 4 blocks (the last one 1 element); rank 0 has the tail, rank 1 none
    ranks = {0: masks_of("r0", {0: (2560, packed(0, 1, 2, n=10)), 1: (769, packed(3, n=4))}),
             1: masks_of("r1", {0: (2560, packed(2, 3, n=10)), 1: (769, packed(n=4))})}
    out = attach_sparsity(trace, ranks)
    validate_trace(out, "merged")
    for program, nonzero in zip(out.ranks, ((0.3, 0.25), (0.2, 0.0)), strict=True):
        broadcast, first, second = program.iterations[0].colls
        assert broadcast.sparsity is None  # only all_reduces carry it
        assert (first.sparsity.block_elements, first.sparsity.nonzero, first.sparsity.union) == (256, nonzero[0], 0.4)
        assert (second.sparsity.nonzero, second.sparsity.union) == (nonzero[1], 0.25)
    path = tmp_path / "t.json.gz"
    save_trace(out, path)
    assert load_trace(path) == out  # the keys go to the file and back


def test_merge_refuses_what_does_not_match() -> None:
    trace = two_rank_trace(counts=(256,))
    one = {0: (256, packed(0, n=1))}
    with pytest.raises(CaptureError, match="no sparsity masks from rank 1 of 2"):
        attach_sparsity(trace, {0: masks_of("r0", one)})
    with pytest.raises(CaptureError, match="r1: step 3, all_reduce 0 .op id 1.: the mask covers 300 elements but "
                                           "the collective has 256"):
        attach_sparsity(trace, {0: masks_of("r0", one), 1: masks_of("r1", {0: (300, packed(0, n=2))})})
    with pytest.raises(CaptureError, match="r1: no mask of step 3, all_reduce 0"):
        attach_sparsity(trace, {0: masks_of("r0", one), 1: masks_of("r1", one, step=4)})


def test_block_count() -> None:
    assert [block_count(n, 256) for n in (0, 1, 256, 257, 6_405_793)] == [0, 1, 1, 2, 25_023]
