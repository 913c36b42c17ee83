"""Hand-offs in batches (emu.replay.host.p2p_batched, emu.emulator.algorithms.batched): a window's
segments at once give every number that one segment at a time gives, on every process layout."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

from emu.emulator.algorithms import batched, server_sums
from emu.emulator.algorithms.p2p import Check
from emu.emulator.links import fifo as link_fifo
from emu.emulator.links.array import LinkArray
from emu.emulator.links.spec import LinkSpec, parse_schedule
from emu.emulator.protocol.rows import row_bounds
from emu.replay import ReplayConfig, replay
from emu.replay.config.options import Straggler
from emu.replay.host import runtime
from emu.replay.jobs import Jobs, replay_jobs
from emu.traces import load_trace, sample_path
from emu.traces.model import Coll, CollKind, Compute, Dtype, Iteration, RankProgram, Trace, Wait
from emu.traces.synthetic import single_collective
from tests.replay.test_clock import exact_part

_BATCHED = ReplayConfig.batched_p2p


def _one_by_one(monkeypatch, trace, config):
    """The same replay with segments one at a time (the reference)."""
    monkeypatch.setattr(ReplayConfig, "batched_p2p", property(lambda self: False))
    try:
        return replay(trace, config)
    finally:
        monkeypatch.setattr(ReplayConfig, "batched_p2p", _BATCHED)


@pytest.fixture(scope="module")
def mlp():
    return load_trace(sample_path("mlp"))


@pytest.mark.parametrize("fabric", ["ring", "ps", "tree"])
def test_batches_give_every_number_of_one_by_one(mlp, fabric: str, monkeypatch, no_children) -> None:
    """The ring's and parameter server's kernels, and the tree's per-worker algorithms in batches:
    every emulated number, check and byte count as one segment at a time, in one process and over
    sockets (two host processes)."""
    config = ReplayConfig(workers=6, fabric=fabric, iters=2, payload_scale=64, processes=0,
                          link=LinkSpec(bandwidth_bps=25e9, latency_us=3.0))
    assert config.batched_p2p
    batched = replay(mlp, config)
    assert batched.verification.ok and batched.verification.elements_checked > 0
    socketed = replay(mlp, replace(config, processes=2))
    reference = _one_by_one(monkeypatch, mlp, config)
    assert exact_part(batched) == exact_part(reference)
    assert exact_part(socketed) == exact_part(reference)


def test_batches_with_loss_jitter_stragglers_and_a_schedule(mlp, monkeypatch, no_children) -> None:
    """Loss and jitter draw per segment, keyed by the link's count: the same draws in batches."""
    link = LinkSpec(bandwidth_bps=25e9, latency_us=2.0, loss=0.01, jitter_us=1.0,
                    schedule=parse_schedule("0s:25Gbps,20ms:10Gbps"))
    config = ReplayConfig(workers=4, fabric="ring", iters=1, payload_scale=64, processes=0, link=link,
                          stragglers=(Straggler.parse("lognormal:0.1"),))
    batched = replay(mlp, config)
    assert batched.fabric.packets_lost > 0 and batched.verification.ok
    assert exact_part(batched) == exact_part(_one_by_one(monkeypatch, mlp, config))


@pytest.mark.parametrize("kind", [CollKind.REDUCE_SCATTER, CollKind.ALL_GATHER, CollKind.ALL_REDUCE])
def test_ring_kernel_halves_and_dtypes(kind: CollKind, monkeypatch, no_children) -> None:
    """A reduce_scatter and an all_gather (each member's own chunk one back), in a 16-bit float
    and an integer: the kernel checks what the per-worker ring checks."""
    for dtype in (Dtype.BFLOAT16, Dtype.INT64):
        trace = single_collective(kind, 40_000, dtype, iterations=2)
        config = ReplayConfig(workers=5, fabric="ring", iters=2, payload_scale=1, processes=0)
        batched = replay(trace, config)
        assert batched.verification.ok and batched.verification.elements_distinct > 0
        assert exact_part(batched) == exact_part(_one_by_one(monkeypatch, trace, config))


def test_parameter_server_with_fewer_shards_and_two_jobs(mlp, monkeypatch, no_children) -> None:
    """Two shards for six workers (a shard's links carry many rows a window: their running sums),
    and two jobs sharing the fabric."""
    config = ReplayConfig(workers=6, fabric="ps", iters=1, payload_scale=64, processes=0, ps_shards=2)
    batched = replay(mlp, config)
    assert batched.verification.ok
    assert exact_part(batched) == exact_part(_one_by_one(monkeypatch, mlp, config))
    shared = replace(config, workers=8, ps_shards=None)
    jobs = replay_jobs([mlp, mlp], shared, Jobs((4, 4)))
    monkeypatch.setattr(ReplayConfig, "batched_p2p", property(lambda self: False))
    assert exact_part(jobs) == exact_part(replay_jobs([mlp, mlp], shared, Jobs((4, 4))))


def test_broadcast_kernel_gives_the_binomial_trees_numbers(monkeypatch, no_children) -> None:
    """The broadcast's kernel (every member's tree step at once) on sizes that fill the tree and
    that do not, in a float and an integer type: what each member's ``BinomialBroadcast`` gives."""
    turns = []
    kernel_turn = batched.BroadcastKernel._turn
    monkeypatch.setattr(batched.BroadcastKernel, "_turn",
                        lambda k, a, slot: turns.append(len(slot)) or kernel_turn(k, a, slot))
    for workers, root in ((1, 0), (2, 0), (8, 0), (13, 0), (13, 3)):
        for dtype in (Dtype.FLOAT32, Dtype.INT64):
            trace = _broadcast(40_000, dtype, root)
            config = ReplayConfig(workers=workers, fabric="ring", iters=2, payload_scale=1, processes=0)
            turns.clear()
            got = replay(trace, config)
            assert sum(turns) == 2 * (workers - 1)  # every member but the root took its segment in the kernel
            # a worker alone has nothing to check (the report says so: not verified)
            assert got.verification.ok == (workers > 1)
            assert got.verification.elements_distinct == (2 * 40_000 if workers > 1 else 0)
            assert exact_part(got) == exact_part(_one_by_one(monkeypatch, trace, config))


def _broadcast(count: int, dtype: Dtype, root: int) -> Trace:
    """``single_collective``'s broadcast from rank ``root``."""
    trace = single_collective(CollKind.BROADCAST, count, dtype, iterations=2)
    rank = trace.ranks[0]
    its = tuple(replace(it, ops=(replace(it.ops[0], root=root), *it.ops[1:])) for it in rank.iterations)
    return replace(trace, ranks=(replace(rank, iterations=its),))


def test_batched_broadcast_on_ina(monkeypatch, no_children) -> None:
    """On ``ina`` the batched endpoint runs beside the stream: the transformer's broadcast in the
    kernel, with stragglers, gives every number of one segment at a time."""
    trace = load_trace(sample_path("transformer"))
    config = ReplayConfig(workers=16, fabric="ina", iters=2, processes=0,
                          stragglers=(Straggler.parse("lognormal:0.1"),),
                          link=LinkSpec(bandwidth_bps=10e9, latency_us=2.0))
    assert config.batched_p2p
    got = replay(trace, config)
    assert got.verification.ok and got.fabric.segments > 0
    assert exact_part(got) == exact_part(_one_by_one(monkeypatch, trace, config))


def _overlapping(iterations: int = 2) -> Trace:
    """An all_reduce on the stream while a broadcast and an all_to_all run on a second stream."""
    f = Dtype.FLOAT32
    ops = (Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=f, count=1 << 20, bytes=4 << 20, group_size=1, stream=0),
           Compute(name="forward", dur_us=30.0),
           Coll(id=1, kind=CollKind.BROADCAST, dtype=f, count=1 << 16, bytes=4 << 16, group_size=1, root=0, stream=1),
           Coll(id=2, kind=CollKind.ALL_TO_ALL, dtype=f, count=1 << 16, bytes=4 << 16, group_size=1, stream=1),
           Wait(ids=(0, 1, 2), blocked_us=0.0))
    base = single_collective(CollKind.ALL_REDUCE, 1 << 20)
    its = tuple(Iteration(step=i, measured_us=0.0, ops=ops) for i in range(iterations))
    return replace(base, ranks=(RankProgram(rank=0, iterations=its),))


@pytest.mark.parametrize("processes", [0, 2])
def test_segments_between_the_streams_rows(processes: int, monkeypatch, no_children) -> None:
    """Segments and the stream's rows on a worker's links in one window: handed over in runs, in
    time order, with every number of one segment at a time, in one process and over sockets."""
    handed = {"_uplinks": [], "_deliver": []}  # per call: the order of what went (s: stream rows, g: segments)
    interleave = runtime._interleave

    def recorded(stream_t, seg_t, stream, segments):
        order = []
        interleave(stream_t, seg_t, lambda lo, hi: order.append("s") or stream(lo, hi),
                   lambda a, b: order.append("g") or segments(a, b))
        handed[inspect.stack()[1].function].append("".join(order))

    monkeypatch.setattr(runtime, "_interleave", recorded)
    trace = _overlapping()
    config = ReplayConfig(workers=8, fabric="ina", iters=2, processes=processes, payload_scale=1,
                          link=LinkSpec(bandwidth_bps=10e9, latency_us=2.0))
    got = replay(trace, config)
    if not processes:  # in one process: the stream's rows went before, between and after a window's segments
        assert any("sgs" in o for o in handed["_deliver"]) and any("sgs" in o for o in handed["_uplinks"])
    assert got.verification.ok and got.fabric.segments > 0
    assert exact_part(got) == exact_part(_one_by_one(monkeypatch, trace, config))


@pytest.mark.parametrize("spec", [LinkSpec(bandwidth_bps=10e9, latency_us=5.0),
                                  LinkSpec(bandwidth_bps=10e9, latency_us=5.0, loss=0.05, jitter_us=2.0),
                                  LinkSpec(bandwidth_bps=10e9, latency_us=5.0,
                                           schedule=parse_schedule("0s:10Gbps,50us:1Gbps"))])
@pytest.mark.parametrize("spread", ["skewed", "even"])
def test_link_stages_in_batches_are_the_scalar_ones(spec: LinkSpec, spread: str, monkeypatch) -> None:
    """``send_segments`` / ``receive_segments`` against ``send_segment`` / ``receive_segment`` row
    by row, bit for bit: links with one row and with many (idle gaps and early rows included), in
    many batches; ``even``: many links with many rows each, side by side in tables of a few cells
    (``DeepTable``, ``parts``)."""
    rng = np.random.default_rng(7)
    links = 6
    weights = [0.6, 0.2, 0.05, 0.05, 0.05, 0.05] if spread == "skewed" else [1 / 6] * 6
    most = 40 if spread == "skewed" else 160
    if spread == "even":
        monkeypatch.setattr(link_fifo, "DEEP_CELLS", 64)
    for direction in (0, 1):
        a, b = (LinkArray(spec, np.arange(links), 3, direction, 100.0) for _ in range(2))
        t = 0.0
        for _ in range(30):
            n = int(rng.integers(1, most))
            idx = np.sort(rng.choice(links, n, p=weights), kind="stable")
            idx = rng.permutation(idx)  # the rows of a link keep their order; links interleave
            ready = t + np.sort(rng.exponential(3.0, n)) * rng.integers(0, 2, n)
            emu = rng.choice([0.0, 900.0, 1456.0, 20_000.0, 1 << 20] if spread == "skewed" else [20_000.0, 1 << 20], n)
            packets = np.maximum(1, -(-np.ceil(emu).astype(np.int64) // 1456))
            wire = emu + packets * 82
            if direction == 0:
                got = a.send_segments(idx, ready, wire, packets)
                want = list(zip(*[b.send_segment(int(i), float(r), float(w), int(p))
                                  for i, r, w, p in zip(idx, ready, wire, packets, strict=True)], strict=True))
            else:
                last = ready + rng.exponential(1.0, n)
                got = a.receive_segments(idx, ready, last, wire, packets)
                want = list(zip(*[b.receive_segment(int(i), float(r), float(la), float(w), int(p))
                                  for i, r, la, w, p in zip(idx, ready, last, wire, packets, strict=True)], strict=True))
            for g, w in zip(got, want, strict=True):
                assert g.tolist() == list(w)
            t += 20.0
        for name in ("free_us", "busy_us", "counter", "last_ready", "reorder_error_us"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
        assert (a.reordered, a.resent_packets, a.most_rounds) == (b.reordered, b.resent_packets, b.most_rounds)


@pytest.mark.parametrize("kind", [CollKind.ALL_REDUCE, CollKind.ALL_GATHER])
def test_a_members_rows_at_once_are_its_rows_one_after_another(kind: CollKind) -> None:
    """One arrival of several rows for each member, the same segment twice among a member's: the
    kernel sends, checks and completes what it does taking the rows one at a time, in their order
    (a member's second copy of a segment passes it on instead of summing into it)."""
    def kernel() -> batched.RingKernel:
        return batched.RingKernel(4, 0, 40_000, 40e6, kind != CollKind.ALL_GATHER, True,
                                  0 if kind == CollKind.ALL_REDUCE else -1, 7, "float32", Check(), 4)
    at_once, one_by_one = kernel(), kernel()
    first, _ = at_once.start_many(np.arange(4), 0.0)
    assert exact_sends(first) == exact_sends(one_by_one.start_many(np.arange(4), 0.0)[0])
    n = len(first)
    rows = batched.Arrivals(np.tile(first.dst, 2), np.tile(first.segment, 2), np.arange(2 * n, dtype=np.float64),
                            row_bounds(np.tile(np.diff(first.bounds), 2)), np.tile(first.values, 2))
    assert (np.bincount(rows.dst) >= 4).all()  # several rows a member, each segment twice
    sends, done = at_once.arrive(rows)
    got = [one_by_one.arrive(rows.take(np.array([r]))) for r in range(len(rows))]
    assert exact_sends(sends) == exact_sends(batched.Sends.concat([s for s, _ in got]))
    assert (done.ids.tolist(), done.end_us.tolist()) == \
        (sorted(int(i) for _, d in got for i in d.ids), [float(e) for _, d in got for e in d.end_us])
    assert vars(at_once.check) == vars(one_by_one.check) and at_once.check.elements > 0
    for col in ("got", "end_us"):  # each member's count of segments and its latest
        assert getattr(at_once.members, col).tolist() == getattr(one_by_one.members, col).tolist()


def exact_sends(s: batched.Sends) -> list:
    return [a.tolist() for a in (s.src, s.dst, s.segment, s.emu_bytes, s.t, s.bounds, s.values)]


@pytest.mark.parametrize("idx", [[], [3], [2, 2, 2], [5, 1, 5, 1, 0, 5], list(range(6))])
def test_places_count_each_value_so_far(idx: list[int]) -> None:
    want = [idx[:i].count(v) for i, v in enumerate(idx)]
    got = link_fifo.places(np.array(idx, np.int64))
    assert (got.tolist() if got is not None else [0] * len(idx)) == want
    assert (got is None) == (len(set(idx)) == len(idx))  # None: every value once


def test_server_sums_in_batches_are_the_sums_push_by_push() -> None:
    """Pushes for many (shard, collective, segment) sums in batches of any size, a collective's
    group of three among them: each sum goes to its members once its last push is in, at that
    push's time, and holds every push's values added in arrival order (rows moved and arrays
    grown on the way)."""
    rng = np.random.default_rng(5)
    workers, groups = 4, (None, (0, 2, 3))
    pushes = [(shard, seq, seg, w) for shard in (4, 5) for seq in range(6) for seg in range(40)
              for w in (range(workers) if seq % 2 == 0 else groups[1])]
    order = rng.permutation(len(pushes))
    n_of = {(shard, seq, seg): 1 + (shard + seq + seg) % 5 for shard, seq, seg, _ in pushes}
    rows = [(*pushes[i], float(k), rng.integers(-8, 8, n_of[pushes[i][:3]]).astype(np.float64))
            for k, i in enumerate(order)]
    sums, want = {}, []  # the reference: push by push
    for r, (shard, seq, seg, _, t, v) in enumerate(rows):
        acc, got, latest = sums.get((shard, seq, seg), (np.zeros(len(v)), 0, 0.0))
        acc, got, latest = acc + v, got + 1, max(latest, t)
        members = range(workers) if groups[seq % 2] is None else groups[1]
        if got < len(members):
            sums[(shard, seq, seg)] = (acc, got, latest)
            continue
        sums.pop((shard, seq, seg))
        want += [(shard, m, seg, latest, acc.tolist(), r) for m in members]
    server, got, at = server_sums.ServerSums(workers, groups), [], 0
    while at < len(rows):
        part = rows[at:at + int(rng.integers(1, 60))]
        cols = [np.array([p[i] for p in part]) for i in range(5)]
        sends, by = server.arrive(cols[0], cols[1], cols[2], np.full(len(part), 8.0), cols[4],
                                  row_bounds(np.array([len(p[5]) for p in part])), np.concatenate([p[5] for p in part]))
        got += [(int(sends.src[i]), int(sends.dst[i]), int(sends.segment[i]), float(sends.t[i]),
                 sends.values[sends.lo[i]:sends.lo[i] + sends.n[i]].tolist(), at + int(by[i])) for i in range(len(sends))]
        at += len(part)
    assert sorted(got) == sorted(want) and len(want) == 2 * 6 * 40 * 4 - 2 * 3 * 40
    assert not server.rows.at  # every sum sent
