"""The leaf role of hierarchical aggregation (tests.emulator.leaf_switch) against its conformance
vectors, and leaves under a spine against the one switch: the same sums, bit for bit, through loss."""

from __future__ import annotations

import json

import numpy as np
import pytest

from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from tests.emulator.leaf_switch import LeafSwitch
from tests.emulator.leaf_vectors import LEAF_OUT, build

LEAF = sorted(LEAF_OUT.glob("*.json"))


def test_leaf_vector_files_are_current() -> None:
    built = build()
    assert sorted(p.stem for p in LEAF) == sorted(built)
    for path in LEAF:
        assert json.loads(path.read_text()) == built[path.stem], f"regenerate {path.name}"


def _packet(hexframe: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    h, p, _ = wire.parse_packet(wire.unframe(bytes.fromhex(hexframe)))
    headers = np.zeros(1, wire.AGG_HEADER)
    headers[0] = h
    payload = np.zeros((1, k), np.int32)
    payload[0, : len(p)] = p
    return headers, payload


def _out(headers: np.ndarray, payload: np.ndarray, port: object, ranks: list[int]) -> list[dict]:
    out = []
    for h, p in zip(headers, payload, strict=True):
        body = p[: 64 * int(h["size"])]
        dests = ranks if port is None and h["worker"] == MULTICAST else [port if port is not None else int(h["worker"])]
        for dest in dests:  # a multicast, port by port
            h2 = {n: h[n] for n in wire.AGG_HEADER.names}
            if port is None:
                h2["worker"] = dest
            out.append({"port": dest, "frame": wire.frame(wire.agg_packet(h2, body if len(body) else None)).hex()})
    return out


@pytest.mark.parametrize("path", LEAF, ids=[p.stem for p in LEAF])
def test_leaf_matches_vectors(path) -> None:
    doc = json.loads(path.read_text())
    cfg = doc["config"]
    leaf = LeafSwitch(**cfg)
    for step in doc["steps"]:
        got: list[dict] = []
        for item in step["in"]:
            headers, payload = _packet(item["frame"], cfg["elements"])
            if item["from"] == "worker":
                up, down = leaf.from_workers(headers, payload)
                got += _out(up.headers, up.payload, "spine", cfg["ranks"])
                got += _out(down.headers, down.payload, None, cfg["ranks"])
            else:
                down = leaf.from_spine(headers, payload)
                got += _out(down.headers, down.payload, None, cfg["ranks"])
        assert got == step["out"]


def test_leaf_counts_what_it_did() -> None:
    doc = json.loads((LEAF_OUT / "leaf-duplicates.json").read_text())
    leaf = LeafSwitch(**doc["config"])
    for step in doc["steps"]:
        for item in step["in"]:
            headers, payload = _packet(item["frame"], 64)
            if item["from"] == "worker":
                leaf.from_workers(headers, payload)
            else:
                leaf.from_spine(headers, payload)
    s = leaf.stats
    assert (s.up, s.resent_up, s.from_spine, s.answered, s.stale, s.invalid) == (1, 1, 1, 1, 0, 0)


@pytest.mark.parametrize("loss", [0.0, 0.2], ids=["lossless", "lossy"])
def test_leaves_under_a_spine_sum_as_one_switch(loss: float) -> None:
    """Seven workers on four leaves (3, 2, 1, 1), a pool of 2 slots, 8 chunks: every worker ends
    each chunk with the one switch's sum and largest exponent, bit for bit, however many packets
    each link loses; a worker resends its contribution until its result arrives."""
    rng = np.random.default_rng(7)
    k, slots, m, job = 64, 2, 7, 3
    placement = [[0, 3, 5], [1, 4], [2], [6]]
    leaves = [LeafSwitch(slots, k, job, ranks, m, leaf, len(placement)) for leaf, ranks in enumerate(placement)]
    spine = AggregationSwitch(slots, len(placement), k, job)
    one = AggregationSwitch(slots, m, k, job)
    leaf_of = {r: i for i, ranks in enumerate(placement) for r in ranks}

    def kept(n: int) -> np.ndarray:
        return rng.random(n) >= loss

    for chunk in range(8):
        headers = np.zeros(m, wire.AGG_HEADER)
        headers["msg_type"] = wire.MsgType.CONTRIB
        headers["flags"] = (chunk // slots) % 2
        headers["job"] = job
        headers["worker"] = np.arange(m)
        headers["num_workers"] = m
        headers["slot"] = chunk % slots
        headers["exponent"] = rng.integers(-5, 5, m)
        headers["size"] = 1
        headers["chunk"] = chunk
        payload = rng.integers(-(2**24), 2**24, (m, k)).astype(np.int32)
        expected = one.process(headers, payload)
        assert len(expected) == 1 and expected.headers["worker"][0] == MULTICAST
        got: dict[int, tuple[int, np.ndarray]] = {}
        for _ in range(200):  # rounds of timeouts: every worker without its result sends again
            waiting = [w for w in range(m) if w not in got]
            if not waiting:
                break
            up_h, up_p = [], []
            for w in np.asarray(waiting)[kept(len(waiting))]:
                up, down = leaves[leaf_of[int(w)]].from_workers(headers[w:w + 1], payload[w:w + 1])
                up_h.append(up.headers)
                up_p.append(up.payload)
                _deliver(down, placement[leaf_of[int(w)]], got, kept)
            if not up_h:
                continue
            rows = np.concatenate(up_h)
            sent = kept(len(rows))
            res = spine.process(rows[sent], np.concatenate(up_p)[sent])
            for i in range(len(res)):
                dest = int(res.headers["worker"][i])
                for leaf in range(len(placement)) if dest == MULTICAST else [dest]:
                    if kept(1)[0]:
                        down = leaves[leaf].from_spine(res.headers[i:i + 1], res.payload[i:i + 1])
                        _deliver(down, placement[leaf], got, kept)
        assert sorted(got) == list(range(m)), f"chunk {chunk}: workers {sorted(set(range(m)) - set(got))} never got it"
        for exp, values in got.values():
            assert exp == int(expected.headers["exponent"][0])
            assert np.array_equal(values, expected.payload[0])
    if loss:  # every path of recovery ran: the leaf answering, the partial resent, the spine answering
        assert sum(leaf.stats.answered for leaf in leaves) > 0
        assert sum(leaf.stats.resent_up for leaf in leaves) > 0
        assert spine.stats.answered > 0


def _deliver(down, ranks: list[int], got: dict, kept) -> None:
    for h, p in zip(down.headers, down.payload, strict=True):
        for rank in ranks if h["worker"] == MULTICAST else [int(h["worker"])]:
            if kept(1)[0]:
                got.setdefault(rank, (int(h["exponent"]), p.copy()))
