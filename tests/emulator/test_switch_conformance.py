"""The software switch against the conformance vectors (packets in, packets out)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from tests.emulator.vectors import COLLECTIVES_OUT, OUT, SPARSE_OUT, build

DENSE = sorted(OUT.glob("*.json"))  # the P4 program passes these too (tests/p4)
SPARSE = sorted(SPARSE_OUT.glob("*.json"))  # the sparse stream: the software switch only
COLLECTIVES = sorted(COLLECTIVES_OUT.glob("*.json"))  # reduce_scatter and all_gather rounds: the software switch only
VECTORS = DENSE + SPARSE + COLLECTIVES


@pytest.mark.parametrize("kind", ["dense", "sparse", "collectives"])
def test_vector_files_are_current(kind: str) -> None:
    built = build(kind == "sparse", kind == "collectives")
    paths = {"dense": DENSE, "sparse": SPARSE, "collectives": COLLECTIVES}[kind]
    assert sorted(p.stem for p in paths) == sorted(built)
    for path in paths:
        assert json.loads(path.read_text()) == built[path.stem], f"regenerate {path.name}"


def batch(frames: list[str], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    headers = np.zeros(len(frames), wire.AGG_HEADER)
    payload = np.zeros((len(frames), k), np.int32)
    extra = np.zeros((len(frames), 2), np.uint32)
    for i, hexframe in enumerate(frames):
        h, p, x = wire.parse_packet(wire.unframe(bytes.fromhex(hexframe)))
        headers[i] = h
        payload[i, : len(p)] = p
        extra[i] = x or (0, 0)
    return headers, payload, extra


def frames_out(switch: AggregationSwitch, headers: np.ndarray, payload: np.ndarray, extra: np.ndarray) -> list[dict]:
    res = switch.process(headers, payload, sparse=extra)
    out = []
    for h, p, x in zip(res.headers, res.payload, res.sparse, strict=True):
        body = p[: 64 * int(h["size"])]
        if h["msg_type"] == wire.MsgType.SCATTER_DONE:  # every port but the owner's; its header names the owner
            dests = [d for d in range(switch.workers) if d != int(h["worker"])]
        else:
            dests = range(switch.workers) if h["worker"] == MULTICAST else [int(h["worker"])]
        for dest in dests:  # what the switch's egress replication sends, port by port
            h2 = {n: h[n] for n in wire.AGG_HEADER.names}
            if h["msg_type"] != wire.MsgType.SCATTER_DONE:
                h2["worker"] = dest
            if h["msg_type"] == wire.MsgType.SPARSE_RESULT:
                h2.update(block=x[0], next=x[1])
                packet = wire.sparse_packet(h2, body if len(body) else None)
            else:
                packet = wire.agg_packet(h2, body if len(body) else None)
            out.append({"port": dest, "frame": wire.frame(packet).hex()})
    return out


@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
@pytest.mark.parametrize("per_packet", [False, True], ids=["batched", "per-packet"])
def test_switch_matches_vectors(path, per_packet: bool) -> None:
    doc = json.loads(path.read_text())
    cfg = doc["config"]
    switch = AggregationSwitch(cfg["slots"], cfg["workers"], cfg["elements"], cfg["job"])
    for step in doc["steps"]:
        headers, payload, extra = batch(step["in"], cfg["elements"])
        if per_packet:
            got = []
            for i in range(len(headers)):
                got += frames_out(switch, headers[i : i + 1], payload[i : i + 1], extra[i : i + 1])
        else:
            got = frames_out(switch, headers, payload, extra)
        assert got == step["out"]


def test_stats_count_duplicates() -> None:
    doc = json.loads((OUT / "duplicates.json").read_text())
    cfg = doc["config"]
    switch = AggregationSwitch(cfg["slots"], cfg["workers"], cfg["elements"], cfg["job"])
    for step in doc["steps"]:
        switch.process(*batch(step["in"], cfg["elements"]))
    s = switch.stats
    assert (s.duplicates, s.answered, s.dropped, s.results) == (3, 2, 1, 1)
    assert s.packets == 8 and s.invalid == 0
