"""Importing a real gloo trace with an all_reduce of a sparse tensor (DDP over a sparse embedding)."""

from __future__ import annotations

import pytest

from emu.capture import import_kineto
from emu.errors import KinetoError
from emu.traces import CollKind, load_trace, save_trace
from emu.traces.model import Sparsity
from tests.capture.test_import_gloo import _raw, _write
from tests.conftest import GLOO_SPARSE

ROWS, WIDTH = 20_000, 32  # nn.Embedding(20000, 32, sparse=True); 64 rows a rank a step, 8 shared: 120


@pytest.fixture(scope="module")
def trace():
    return import_kineto(sorted(GLOO_SPARSE.glob("rank*.json.gz")))


def test_the_sparse_gradient_is_an_all_reduce_of_its_rows(trace) -> None:
    for program in trace.ranks:
        assert len(program.iterations) == 2
        for it in program.iterations:
            sparse, dense = it.colls
            assert sparse.kind == dense.kind == CollKind.ALL_REDUCE
            # count and bytes are the dense tensor's; the rows are in the sparsity
            assert sparse.count == ROWS * WIDTH and sparse.bytes == 4 * ROWS * WIDTH
            assert sparse.sparsity == Sparsity(block_elements=WIDTH, nonzero=64 / ROWS, union=120 / ROWS,
                                               sparse_tensor=True)
            assert dense.count == 64 * WIDTH * 16 + 16 and dense.sparsity is None  # the linear layer's bucket


def test_the_key_round_trips(trace, tmp_path) -> None:
    path = tmp_path / "sparse.json"
    save_trace(trace, path)
    again = load_trace(path)  # times are rounded on the way; the sparsity is kept
    assert [op.sparsity for r in again.ranks for it in r.iterations for op in it.colls] == \
        [op.sparsity for r in trace.ranks for it in r.iterations for op in it.colls]
    assert '"sparse_tensor":true' in path.read_text()


def test_a_sparse_all_reduce_without_its_rows_is_refused(tmp_path) -> None:
    docs = [_raw(GLOO_SPARSE / f"rank{r}.json.gz") for r in (0, 1)]
    docs[0]["traceEvents"] = [e for e in docs[0]["traceEvents"] if e.get("name") != "aten::sparse_coo_tensor"]
    paths = _write(tmp_path, docs)
    with pytest.raises(KinetoError) as err:
        import_kineto(paths)
    msg = str(err.value)
    assert msg.startswith(f"{paths[0]}: rank 0: ") and "event 'gloo:sparse_all_reduce'" in msg
    assert "0 of 2 ranks' 'aten::sparse_coo_tensor' events" in msg and "record_shapes=True" in msg


def test_inspect_counts_the_sparse_tensors(trace) -> None:
    from emu.cli.inspect import sparsity_line
    from emu.traces.summary import summarize

    stats = summarize(trace).sparsity
    assert stats is not None and (stats.all_reduces, stats.all_reduces_total, stats.sparse_tensors) == (4, 8, 4)
    assert sparsity_line(stats).endswith("; 4 of sparse tensors, a row a block)")


EDGE = GLOO_SPARSE.parent / "gloo-edge-all-reduces-world2"


def test_a_dense_scalar_all_reduce_is_not_a_sparse_one() -> None:
    # a 0-dim tensor's strides are empty too; its shape is what tells it from a sparse tensor
    trace = import_kineto(sorted((EDGE / "scalar").glob("rank*.json.gz")))
    for it in trace.ranks[0].iterations:
        assert [(op.count, op.sparsity) for op in it.colls] == [(1000, None), (1, None)]


def test_a_sparse_sum_of_one_row_imports() -> None:
    # gloo's coalesce of a one-row sum narrows nothing: the union is the ranks' rows
    trace = import_kineto(sorted((EDGE / "sparse_tiny").glob("rank*.json.gz")))
    for program in trace.ranks:
        for it in program.iterations:
            dense, sparse = it.colls
            assert dense.sparsity is None and sparse.count == 400
            own = 1 if program.rank == 0 else 0
            assert sparse.sparsity == Sparsity(block_elements=4, nonzero=own / 100, union=0.01, sparse_tensor=True)


def test_a_wrapped_powersgd_hook_is_named_with_what_it_wraps() -> None:
    pytest.importorskip("torch", reason="the hooks are PyTorch's")
    import functools

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from emu.capture.inject import hook_name

    assert hook_name(default_hooks.fp16_compress_hook) == "fp16_compress_hook"
    assert hook_name(default_hooks.fp16_compress_wrapper(powerSGD_hook.powerSGD_hook)) == \
        "fp16_compress_wrapper(powerSGD_hook)"
    assert hook_name(functools.partial(powerSGD_hook.batched_powerSGD_hook)) == "partial(batched_powerSGD_hook)"
