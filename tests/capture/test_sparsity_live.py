"""Gradient sparsity measured in real captures: torch runs DDP on gloo in two rank processes."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emu.capture import CaptureConfig, capture_model
from emu.capture.run import _run
from emu.capture.sparsity import mask_path, read_masks, sample_positions
from emu.cli import cli
from emu.traces import CollKind, load_trace

torch = pytest.importorskip("torch", reason="capture needs torch (pip install 'emu[capture]')")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"

# Step s of this script looks up one row in each of the blocks 0..s on rank 0 and s..2s on rank 1
# of a table of 64 blocks (8 rows of 32: 256 elements a block): the expected sparsity of every
# profiled step is known exactly, which pins the matching of masks to steps.
TINY = '''
import gzip
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from emu.capture.gradmask import record_sparsity
from emu.capture.sparsity import mask_path

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
ddp = DistributedDataParallel(torch.nn.Embedding(64 * 8, 32))
recorder = record_sparsity(ddp)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(int(sys.argv[2])):
    recorder.start_step(step)
    blocks = range(0, step + 1) if rank == 0 else range(step, 2 * step + 1)
    opt.zero_grad()
    ddp(torch.tensor([8 * b + rank for b in blocks])).sum().backward()
    opt.step()
recorder.save(mask_path(Path(sys.argv[1]), rank))
'''


def all_reduces(trace):
    return [op for p in trace.ranks for it in p.iterations for op in it.colls if op.kind == CollKind.ALL_REDUCE]


def test_tiny_sparse_model_gives_exact_sparsity_per_step(no_leftovers: Path) -> None:
    script = no_leftovers / "tiny.py"
    script.write_text(TINY)
    config = CaptureConfig(profile_steps=2, warmup=2, keep_kineto=no_leftovers / "k")
    trace = _run(sys.executable, lambda work: [str(script), str(work), "6"], config, source_model="tiny",
                 command="test", batch_size=None, on_tick=None, sparsity=True)
    for program in trace.ranks:
        assert [it.step for it in program.iterations] == [3, 4]
        for it in program.iterations:
            (op,) = it.colls
            s = it.step
            assert op.count == 64 * 8 * 32 and op.sparsity is not None
            assert (op.sparsity.block_elements, op.sparsity.nonzero, op.sparsity.union) == (
                256, (s + 1) / 64, (2 * s + 1) / 64)
    # each rank's gradient at the positions every rank samples: ones on the rows it looked up
    at = sample_positions(64 * 8 * 32)
    assert len(trace.gradient_samples) == 4
    for g in trace.gradient_samples:
        s = trace.rank(g.rank).iterations[g.iteration].step
        rows = [8 * b + g.rank for b in (range(0, s + 1) if g.rank == 0 else range(s, 2 * s + 1))]
        want = np.zeros((64 * 8, 32), np.float32)
        want[rows] = 1.0
        assert np.array_equal(g.array(), want.reshape(-1)[at])


@pytest.mark.slow
def test_dlrm_capture_carries_sparsity_on_every_all_reduce(no_leftovers: Path) -> None:
    work = no_leftovers / "k"
    trace = capture_model("dlrm", CaptureConfig(profile_steps=2, warmup=1, keep_kineto=work), sparsity=True)
    assert trace.meta.model == "dlrm" and trace.meta.batch_size == 128
    reduces = all_reduces(trace)
    assert reduces and len(reduces) == len([op for p in trace.ranks for it in p.iterations for op in it.colls])
    for op in reduces:
        s = op.sparsity
        assert s is not None and s.block_elements == 256
        assert 0 < s.nonzero <= s.union <= 1
        assert s.union > s.nonzero  # the ranks' hot rows overlap, but not fully
        assert 0.03 < s.nonzero < 0.3  # the embedding tables hold 99% of the gradient
    # the union is one number per bucket, whichever rank's op carries it; nonzero is the rank's own
    first, second = (p.iterations[0].colls[0].sparsity for p in trace.ranks)
    assert first.union == second.union
    masks = read_masks(mask_path(work, 1))
    op = trace.ranks[1].iterations[0].colls[0]
    bits = masks.masks[(trace.ranks[1].iterations[0].step, 0)].bits
    assert op.sparsity.nonzero == np.unpackbits(bits, count=-(-op.count // 256)).mean()


@pytest.mark.slow  # two captures (about 6 s)
def test_no_sparsity_keeps_the_collectives_and_drops_the_keys(no_leftovers: Path) -> None:
    runner = CliRunner()
    out = {}
    for flag in ((), ("--no-sparsity",)):
        path = no_leftovers / f"t{len(flag)}.json.gz"
        result = runner.invoke(cli, ["capture", "--model", "dlrm", "--iters", "2", "--warmup", "1", "-o", str(path),
                                     *flag])
        assert result.exit_code == 0, result.output
        out[flag] = load_trace(path)
    on, off = out[()], out[("--no-sparsity",)]
    assert all(op.sparsity is not None for op in all_reduces(on))  # on by default in the CLI
    assert all(op.sparsity is None for op in all_reduces(off))
    assert off.meta.command.endswith("--no-sparsity") and "sparsity" not in on.meta.command

    def shape(trace):  # what the hook must not change: the collectives and the program's structure
        return [[(type(op).__name__, getattr(op, "kind", None), getattr(op, "count", None)) for op in it.ops]
                for p in trace.ranks for it in p.iterations]

    assert shape(on) == shape(off)


@pytest.mark.slow  # a script capture (about 3 s)
def test_unmodified_script_has_no_sparsity(no_leftovers: Path) -> None:
    path = no_leftovers / "s.json.gz"
    result = CliRunner().invoke(cli, ["capture", "--iters", "2", "--warmup", "2", "-o", str(path), "--",
                                      "python", str(EXAMPLE), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert all(op.sparsity is None for op in all_reduces(load_trace(path)))
    assert b'"sparsity"' not in gzip.decompress(path.read_bytes())  # no key at all, not a null
