"""The software switch against the conformance vectors (packets in, packets out)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from emu.emulator import wire
from emu.emulator.switch import MULTICAST, AggregationSwitch
from tests.emulator.vectors import OUT, build

VECTORS = sorted(OUT.glob("*.json"))


def test_vector_files_are_current() -> None:
    built = build()
    assert sorted(p.stem for p in VECTORS) == sorted(built)
    for path in VECTORS:
        assert json.loads(path.read_text()) == built[path.stem], f"regenerate {path.name}"


def batch(frames: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    headers = np.zeros(len(frames), wire.AGG_HEADER)
    payload = np.zeros((len(frames), k), np.int32)
    for i, hexframe in enumerate(frames):
        h, p = wire.parse_agg_packet(wire.unframe(bytes.fromhex(hexframe)))
        headers[i] = h
        payload[i, : len(p)] = p
    return headers, payload


def frames_out(switch: AggregationSwitch, headers: np.ndarray, payload: np.ndarray) -> list[dict]:
    res = switch.process(headers, payload)
    out = []
    for h, p in zip(res.headers, res.payload, strict=True):
        body = p[: 64 * int(h["size"])]
        dests = range(switch.workers) if h["worker"] == MULTICAST else [int(h["worker"])]
        for dest in dests:  # what the switch's egress replication sends, port by port
            h2 = h.copy()
            h2["worker"] = dest
            out.append({"port": dest, "frame": wire.frame(wire.agg_packet(h2, body if len(body) else None)).hex()})
    return out


@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
@pytest.mark.parametrize("per_packet", [False, True], ids=["batched", "per-packet"])
def test_switch_matches_vectors(path, per_packet: bool) -> None:
    doc = json.loads(path.read_text())
    cfg = doc["config"]
    switch = AggregationSwitch(cfg["slots"], cfg["workers"], cfg["elements"], cfg["job"])
    for step in doc["steps"]:
        headers, payload = batch(step["in"], cfg["elements"])
        if per_packet:
            got = []
            for i in range(len(headers)):
                got += frames_out(switch, headers[i : i + 1], payload[i : i + 1])
        else:
            got = frames_out(switch, headers, payload)
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
