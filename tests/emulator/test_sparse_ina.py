"""The sparse aggregation stream (emu.emulator.protocol.sparse_ina) against the switch, without processes:
only the union's blocks travel, each from its holders, and every sum is exact, with loss too."""

from __future__ import annotations

import numpy as np
import pytest

from emu.emulator.payload.generated import block
from emu.emulator.protocol.ina import InaGroup, InaParams, ResultCheck
from emu.emulator.protocol.sparse_ina import held_blocks, streams_sparse
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from emu.traces.model import Sparsity


def run(workers: int, slots: int, k: int, plans: list[tuple[int, Sparsity | None]], dtype: str = "float32",
        loss: float = 0.0, seed: int = 0, sparse_stream: bool = True):
    p = InaParams(slots=slots, elements=k, workers=workers, job=0, seed=seed, sparse_stream=sparse_stream)
    g = InaGroup(np.arange(workers), p)
    sw = AggregationSwitch(slots, workers, k)
    for seq, (n, sp) in enumerate(plans):
        g.collective(seq, dtype, n, -(-n // k), sp).start_us[:] = 0.0
    check, rng, retx = ResultCheck(), np.random.default_rng(seed), []
    rows_sent = 0
    for _ in range(100_000):
        pk = g.next_packets(retx)
        retx = []
        if pk is None:
            break
        rows_sent += len(pk.local)
        lost = rng.random(len(pk.local)) < loss
        retx += [(int(w), int(s), 0.0, 1.0) for w, s in zip(pk.local[lost], pk.headers["slot"][lost], strict=True)]
        res = sw.process(pk.headers[~lost], pk.payload[~lost], sparse=pk.sparse[~lost])
        dest = res.headers["worker"].astype(int)
        pairs = [(w, i) for i, d in enumerate(dest) for w in (range(workers) if d == MULTICAST else [d])]
        li = np.array([w for w, _ in pairs], int)
        rb = np.array([i for _, i in pairs], int)
        gone = rng.random(len(li)) < loss
        retx += [(int(w), int(res.headers["slot"][i]), 0.0, 1.0) for w, i in zip(li[gone], rb[gone], strict=True)]
        g.on_results(li[~gone], rb[~gone], res.headers, res.payload, np.ones((~gone).sum()), None,
                     np.full(len(res.headers), -1), check, res.sparse)
    return g, check, sw.stats, rows_sent


def union_and_held(n: int, k: int, workers: int, sp: Sparsity, dtype: str, seq: int, seed: int = 0):
    owner = block(seed, seq, 0, n, workers, dtype, sp).owner
    return held_blocks(seed, seq, n, k, workers, np.arange(workers), sp, dtype, owner)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("k", [64, 256])
def test_only_the_union_travels_and_every_sum_is_exact(dtype: str, k: int) -> None:
    workers, slots = 5, 4
    sp_a, sp_b = Sparsity(256, 0.05, 0.2), Sparsity(512, 0.2, 0.3)
    plans = [(20_000, sp_a), (3000, None), (40_000, sp_b)]
    g, check, stats, _ = run(workers, slots, k, plans, dtype)
    assert all(c.finished.all() for c in g.colls)
    assert [c.stream is not None for c in g.colls] == [True, False, True]
    union_elements, data_packets = 0, 0
    for seq, (n, sp) in enumerate(plans):
        if sp is None:
            union_elements += n
            data_packets += workers * -(-n // k)
            continue
        held, union = union_and_held(n, k, workers, sp, dtype, seq)
        real = np.minimum(k, n - np.arange(len(union)) * k)
        union_elements += int(real[union].sum())
        data_packets += int(held.sum())
        assert held.any(axis=0).tolist() == union.tolist()  # a union block has a non-zero holder
        assert union.mean() < 0.45
    # each worker checks every element it received: the union's, and the dense collective's
    assert check.mismatches == 0 and check.elements == workers * union_elements
    # the switch summed exactly the holders' blocks (and the dense collective's), nothing else
    assert stats.payload_bytes == data_packets * 4 * k
    assert stats.duplicates == 0


def test_exact_under_ten_percent_loss() -> None:
    g, check, stats, _ = run(4, 4, 64, [(30_000, Sparsity(256, 0.1, 0.3))], loss=0.10, seed=3)
    assert g.colls[0].stream is not None and g.colls[0].finished.all()
    held, union = union_and_held(30_000, 64, 4, Sparsity(256, 0.1, 0.3), "float32", 0, seed=3)
    real = np.minimum(64, 30_000 - np.arange(len(union)) * 64)
    assert check.mismatches == 0 and check.elements >= 4 * int(real[union].sum())
    assert stats.duplicates > 0 and stats.answered > 0


def test_rounds_are_the_union_per_slot_not_the_blocks() -> None:
    """Packets sent: the announcements, then per round one from each worker; far fewer than dense."""
    n, k, workers, slots = 64_000, 64, 3, 8
    sp = Sparsity(256, 0.03, 0.06)
    g, check, _, sent = run(workers, slots, k, [(n, sp)])
    st = g.colls[0].stream
    assert st is not None and check.mismatches == 0
    # every worker: S announcements, each partition's union rounds, at most one header-only round
    # per partition (copies alternate), nothing for the skipped rest
    low = workers * (slots + st.union_blocks)
    assert low <= sent <= low + workers * slots
    assert sent < 0.15 * workers * (slots + n // k)
    _, dense_check, _, dense_sent = run(workers, slots, k, [(n, sp)], sparse_stream=False)
    assert dense_sent == workers * (slots + n // k) and dense_check.mismatches == 0


def test_what_runs_the_sparse_stream() -> None:
    sp = Sparsity(256, 0.1, 0.3)
    assert streams_sparse(sp, "float32", 100_000, 64, 8)
    assert not streams_sparse(None, "float32", 100_000, 64, 8)
    assert not streams_sparse(sp, "int32", 100_000, 64, 8)  # integers stay dense
    assert streams_sparse(Sparsity(100, 0.1, 0.3), "float32", 100_000, 64, 8)  # blocks need not fit packets
    assert not streams_sparse(sp, "float32", 64 * 7, 64, 8)  # fewer blocks than slots
    assert not streams_sparse(Sparsity(256, 0.99, 0.99), "float32", 100_000, 64, 8)  # dense is cheaper
    assert not streams_sparse(Sparsity(16, 0.5, 0.7), "float32", 100_000, 64, 8)  # 4 rows a packet: u 0.99
    # the framework's sparse all_reduce streams sparse whatever the cost
    for tensor in (Sparsity(256, 0.99, 0.99, True), Sparsity(16, 0.2, 0.4, True)):
        assert streams_sparse(tensor, "float32", 100_000, 64, 8) and streams_sparse(tensor, "float32", 64 * 7, 64, 8)
    g, check, _, _ = run(3, 8, 64, [(64 * 7, sp)])  # the small one runs dense, and exactly
    assert g.colls[0].stream is None and check.mismatches == 0


def test_an_empty_union_costs_the_announcements_alone() -> None:
    g, check, stats, sent = run(3, 4, 64, [(10_000, Sparsity(256, 0.0, 0.0))])
    st = g.colls[0].stream
    assert st is not None and st.rounds == 0 and g.colls[0].finished.all()
    assert sent == 3 * 4 and stats.payload_bytes == 0 and check.elements == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_elements", [16, 100, 1000])
def test_sparsity_blocks_of_any_size_stream_exactly(dtype: str, block_elements: int) -> None:
    """Rows of 16 elements (4 to a packet), blocks that straddle packets, blocks of many packets;
    and a collective smaller than the pool, streamed because it is a sparse tensor."""
    sp = Sparsity(block_elements, 0.03, 0.05, sparse_tensor=True)
    plans = [(30_000, sp), (64 * 5, sp)]
    g, check, stats, _ = run(4, 8, 64, plans, dtype)
    assert all(c.stream is not None and c.finished.all() for c in g.colls)
    union_elements, data_packets = 0, 0
    for seq, (n, s) in enumerate(plans):
        held, union = union_and_held(n, 64, 4, s, dtype, seq)
        real = np.minimum(64, n - np.arange(len(union)) * 64)
        union_elements += int(real[union].sum())
        data_packets += int(held.sum())
    assert check.mismatches == 0 and check.elements == 4 * union_elements
    assert stats.payload_bytes == data_packets * 4 * 64
