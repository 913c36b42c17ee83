"""Fuzzing the aggregation switch and the packet parsers: bad packets are dropped and counted.

Three properties, on generated traffic:

- the switch, batched and packet by packet, sends exactly what the protocol's plain
  reference model (tests/emulator/vectors.py) sends once it drops what the switch
  drops (another pool's packets as ``invalid``; a bad type, worker, slot or size,
  or a chunk or size that differs from the round a slot copy holds, as
  ``malformed``), and counts the same;
- honest all-reduce rounds with malformed packets mixed in produce exactly the
  honest sums: no malformed packet reaches an aggregate;
- ``wire.unframe`` and ``wire.parse_agg_packet`` turn any bytes into a
  well-formed packet or a MalformedPacket (an EmuError and a ValueError).
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.emulator.protocol import wire
from emu.emulator.protocol.switch import MULTICAST, AggregationSwitch
from emu.errors import EmuError
from tests.emulator.vectors import OUT, Reference
from tests.traces.test_fuzz_traces import FAST, SLOW


class StrictReference(Reference):
    """The reference model with the switch's drops: counted, and without any effect."""

    def __init__(self, slots: int, workers: int, elements: int, job: int) -> None:
        super().__init__(slots, workers, elements, job)
        self.invalid = self.malformed = self.stale = 0

    def packet(self, h: dict, payload: list[int]) -> list[tuple[int, dict, list[int]]]:
        if h["job"] != self.job or h["num_workers"] != self.workers:
            self.invalid += 1
            return []
        kind = h["flags"] & (wire.FLAG_SCATTER | wire.FLAG_GATHER)
        if (h["msg_type"] not in (1, 4) or h["slot"] >= self.slots or h["worker"] >= self.workers
                or h["size"] * 64 > self.k or kind == wire.FLAG_SCATTER | wire.FLAG_GATHER
                or (kind and h["msg_type"] == 4)
                or (kind == wire.FLAG_GATHER and h["size"] and not h["flags"] & wire.FLAG_OWNER)):
            self.malformed += 1
            return []
        state = self.state[(h["slot"], h["flags"] & 1)]
        pinned = 0 < state["count"] and (state["count"] < self.workers or h["worker"] in state["bits"])
        ident = self.state_ident(state)
        if pinned and (h["chunk"] != state["chunk"] or self.ident(h) != ident):
            self.malformed += 1
            return []
        if not pinned and state["count"] == self.workers and h["chunk"] == state["chunk"]:
            self.stale += 1  # a late copy of the completed round's packet: it opens no round
            return []
        return super().packet(h, payload)


Packet = tuple[dict[str, int], list[int]]


def to_arrays(packets: list[Packet], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    headers = np.zeros(len(packets), wire.AGG_HEADER)
    payload = np.zeros((len(packets), k), np.int32)
    extra = np.zeros((len(packets), 2), np.uint32)
    for i, (h, values) in enumerate(packets):
        for name in wire.AGG_HEADER.names:
            headers[i][name] = h[name]
        extra[i] = h.get("block", 0), h.get("next", 0)
        payload[i, : len(values)] = values
    return headers, payload, extra


def sent(switch: AggregationSwitch, headers: np.ndarray, payload: np.ndarray,
         extra: np.ndarray | None = None) -> list[tuple[Any, ...]]:
    """What the switch sends for a batch, one row per destination port, as plain values."""
    res = switch.process(headers, payload, sparse=extra)
    out = []
    for h, p, x in zip(res.headers, res.payload, res.sparse, strict=True):
        if h["msg_type"] == wire.MsgType.SCATTER_DONE:  # every port but the owner's (its header names it)
            dests = [d for d in range(switch.workers) if d != int(h["worker"])]
        else:
            dests = range(switch.workers) if h["worker"] == MULTICAST else [int(h["worker"])]
        fields = tuple(int(h[n]) for n in wire.AGG_HEADER.names if n != "worker")
        out += [(d, *fields, int(x[0]), int(x[1]), tuple(int(v) for v in p[: 64 * int(h["size"])]))
                for d in dests]
    return out


def expected(ref: StrictReference, packets: list[Packet]) -> list[tuple[Any, ...]]:
    out = []
    for h, values in packets:
        for dest, rh, rp in ref.packet(h, values):
            out.append((dest, *(int(rh[n]) for n in wire.AGG_HEADER.names if n != "worker"),
                        rh.get("block", 0), rh.get("next", 0), tuple(rp)))
    return out


def honest(rnd: random.Random, w: int, chunk: int, slots: int, workers: int, k: int, job: int) -> Packet:
    """Worker w's contribution of a chunk; its size and values depend only on (w, chunk),
    so a retransmission repeats it."""
    mine = random.Random(chunk * 7919 + w)
    sparse = chunk % 3 == 2  # a round of the sparse stream: a holder sends data, the others a header
    size = mine.choice([0, k // 64]) if sparse else chunk % (k // 64 + 1)
    values = mine.choices(range(-(2**31), 2**31), k=64 * size)
    h = {"msg_type": 4 if sparse else 1, "flags": (chunk // slots) % 2, "job": job, "worker": w,
         "num_workers": workers, "slot": chunk % slots, "exponent": rnd.randint(-128, 127), "size": size,
         "chunk": chunk}
    if sparse:
        h.update(block=chunk * 5 % 7, next=mine.choice([3, 9, wire.BLOCK_NONE]))
    return h, values


def int32_sums(packets: list[Packet]) -> list[int]:
    """The element-wise sums of the packets' values as the switch's int32 registers hold them."""
    total = np.zeros(len(packets[0][1]), np.int64)
    for _, values in packets:
        total += np.array(values, np.int64)
    return (((total + 2**31) % 2**32) - 2**31).tolist()


# changes the switch drops whatever its state: another pool's packets, or out of range
ALWAYS_DROPPED = ("msg_type", "job", "num_workers", "worker", "slot", "size_range")
BREAKS = (*ALWAYS_DROPPED, "flags", "chunk", "size", "exponent")


def broken(rnd: random.Random, packet: Packet, slots: int, workers: int, k: int, what: str | None = None) -> Packet:
    """A packet with one field changed; it may stay valid (flags, exponent, a chunk for a
    fresh round): the reference model decides."""
    h, values = dict(packet[0]), list(packet[1])
    what = what or rnd.choice(BREAKS)
    if what == "msg_type":
        h["msg_type"] = rnd.choice([0, 2, 3, 5, 255])
    elif what == "job":
        h["job"] = (h["job"] + rnd.randint(1, 65535)) % 65536
    elif what == "num_workers":
        h["num_workers"] = rnd.choice([0, workers + 1, max(0, workers - 1), 65535])
    elif what == "worker":
        h["worker"] = rnd.choice([workers, workers + 1, 65535, rnd.randint(workers, 65535)])
    elif what == "slot":
        h["slot"] = rnd.choice([slots, slots + 1, 65535, rnd.randint(slots, 65535)])
    elif what == "size_range":
        h["size"] = rnd.choice([k // 64 + 1, 255])
        values = [rnd.randint(-(2**31), 2**31 - 1) for _ in range(min(64 * h["size"], k))]
    elif what == "flags":
        h["flags"] = rnd.randint(0, 255)
    elif what == "chunk":
        h["chunk"] = rnd.choice([h["chunk"] + 1, h["chunk"] + 2 * slots, rnd.randint(0, 2**32 - 1)])
    elif what == "size":
        h["size"] = rnd.randint(0, k // 64)
        values = [rnd.randint(-(2**31), 2**31 - 1) for _ in range(64 * h["size"])]
    else:
        h["exponent"] = rnd.randint(-128, 127)
    return h, values


@st.composite
def traffic(draw: st.DrawFn) -> tuple[dict[str, int], list[list[Packet]]]:
    """A pool and batches of packets: honest ones, retransmissions and broken ones."""
    cfg = {"slots": draw(st.integers(1, 3)), "workers": draw(st.integers(1, 4)),
           "elements": draw(st.sampled_from([64, 128, 256])), "job": draw(st.integers(0, 2))}
    rnd = random.Random(draw(st.integers(0, 2**32)))  # bulk choices: hypothesis's own draws favour small values
    bad_rate = draw(st.sampled_from([0.0, 0.1, 0.3, 0.7]))
    s, w, k, job = cfg["slots"], cfg["workers"], cfg["elements"], cfg["job"]
    batches = []
    for _ in range(draw(st.integers(1, 4))):
        batch = []
        for _ in range(rnd.randint(0, 14)):
            p = honest(rnd, rnd.randrange(w), rnd.randrange(4 * s), s, w, k, job)
            batch.append(broken(rnd, p, s, w, k) if rnd.random() < bad_rate else p)
        batches.append(batch)
    return cfg, batches


def check_against_reference(cfg: dict[str, int], batches: list[list[Packet]]) -> None:
    k = cfg["elements"]
    ref = StrictReference(**cfg)
    batched = AggregationSwitch(cfg["slots"], cfg["workers"], k, cfg["job"])
    single = AggregationSwitch(cfg["slots"], cfg["workers"], k, cfg["job"])
    for batch in batches:
        headers, payload, extra = to_arrays(batch, k)
        want = expected(ref, batch)
        assert sent(batched, headers, payload, extra) == want
        got = []
        for i in range(len(batch)):
            got += sent(single, headers[i: i + 1], payload[i: i + 1], extra[i: i + 1])
        assert got == want
    n = sum(len(b) for b in batches)
    for sw in (batched, single):
        assert (sw.stats.packets, sw.stats.invalid, sw.stats.malformed, sw.stats.stale) == (
            n, ref.invalid, ref.malformed, ref.stale)


@settings(FAST, max_examples=250)
@given(case=traffic())
def test_switch_drops_and_counts_what_the_reference_drops(case) -> None:
    check_against_reference(*case)


@st.composite
def honest_rounds(draw: st.DrawFn) -> tuple[int, int, int, int, list[list[Packet]], int, dict[int, list[Packet]]]:
    """Rounds of an all-reduce with malformed packets mixed in, and the honest packets per chunk."""
    slots, workers = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    k, job = draw(st.sampled_from([64, 256])), 1
    rnd = random.Random(draw(st.integers(0, 2**32)))
    batches, bad, by_chunk = [], 0, {}
    for r in range(draw(st.integers(1, 3))):
        chunks = range(r * slots, (r + 1) * slots)
        seq = [honest(rnd, w, c, slots, workers, k, job) for c in chunks for w in range(workers)]
        rnd.shuffle(seq)
        for c in chunks:
            by_chunk[c] = [p for p in seq if p[0]["chunk"] == c]
        for _ in range(rnd.randint(0, 6)):
            c = rnd.choice(chunks)
            victim = rnd.choice(by_chunk[c])
            kind = rnd.choice([*ALWAYS_DROPPED, "round"])
            first, last = seq.index(by_chunk[c][0]), seq.index(by_chunk[c][-1])
            if kind == "round":
                if last - first < 1:
                    continue
                # a chunk or size that differs from a round in progress: after its first packet,
                # before its last (a copy that is empty or complete would take it as a new round)
                h, values = dict(victim[0]), list(victim[1])
                if rnd.random() < 0.5:
                    h["chunk"] += rnd.choice([1, slots, 2 * slots])
                elif h["msg_type"] == 4:  # a sparse round is pinned by its block, not its size
                    h["block"] += 1
                else:
                    h["size"] = (h["size"] + 1) % (k // 64 + 1)
                    values = [rnd.randint(-(2**31), 2**31 - 1) for _ in range(64 * h["size"])]
                seq.insert(rnd.randint(first + 1, last), (h, values))
            else:
                seq.insert(rnd.randint(0, len(seq)), broken(rnd, victim, slots, workers, k, what=kind))
            bad += 1
        cuts = sorted(rnd.sample(range(1, len(seq)), min(rnd.randint(0, 3), len(seq) - 1)))
        batches += [seq[a:b] for a, b in zip([0, *cuts], [*cuts, len(seq)], strict=True)]
    return slots, workers, k, job, batches, bad, by_chunk


def check_rounds(case: tuple) -> None:
    slots, workers, k, job, batches, bad, by_chunk = case
    switch = AggregationSwitch(slots, workers, k, job)
    results = {}
    for batch in batches:
        headers, payload, extra = to_arrays(batch, k)
        res = switch.process(headers, payload, sparse=extra)
        for h, p, x in zip(res.headers, res.payload, res.sparse, strict=True):
            assert h["worker"] == MULTICAST
            results[int(h["chunk"])] = (int(h["exponent"]), int(x[1]), p[: 64 * int(h["size"])].tolist())
    assert (switch.stats.invalid + switch.stats.malformed, switch.stats.stale) == (bad, 0)
    assert sorted(results) == sorted(by_chunk)  # every chunk completed once
    for c, packets in by_chunk.items():
        if packets[0][0]["msg_type"] == 4:  # the least next block, its announcers' largest exponent
            nxt = min(h["next"] for h, _ in packets)
            want = (max(h["exponent"] for h, _ in packets if h["next"] == nxt), nxt)
            widest = max(packets, key=lambda p: len(p[1]))[1]
            sums = int32_sums([(h, v + [0] * (len(widest) - len(v))) for h, v in packets])
        else:
            want, sums = (max(h["exponent"] for h, _ in packets), 0), int32_sums(packets)
        assert results[c] == (*want, sums)


@settings(FAST, max_examples=350)
@given(case=honest_rounds())
def test_malformed_packets_never_reach_an_aggregate(case) -> None:
    check_rounds(case)


def test_a_batch_whose_arrays_do_not_fit_is_dropped_whole() -> None:
    switch = AggregationSwitch(2, 2, 64, job=1)
    rnd = random.Random(1)
    good = [honest(rnd, w, 1, 2, 2, 64, 1) for w in (0, 1)]
    headers, payload, _ = to_arrays(good, 64)
    for args in [(headers, payload[:, :32]), (headers, payload[:1]), (headers, payload.astype(np.int64)),
                 (headers, payload, np.zeros((3, 2))), (headers[["msg_type", "job"]], payload),
                 (headers, np.array([["a"] * 64] * 2))]:
        assert len(switch.process(*args)) == 0
    assert (switch.stats.packets, switch.stats.malformed, switch.stats.results) == (12, 12, 0)
    assert not switch.bitmap.any() and not switch.count.any()  # no effect at all
    res = switch.process(headers, payload)  # the pool works as if nothing had come
    assert len(res) == 1 and res.payload[0].tolist() == int32_sums(good)


def test_a_round_in_progress_refuses_another_chunk_and_size() -> None:
    switch = AggregationSwitch(1, 3, 128, job=0)
    rnd = random.Random(2)
    a, b, c = (honest(rnd, w, 1, 1, 3, 128, 0) for w in range(3))
    stale = ({**b[0], "chunk": 3}, b[1])  # same slot and copy, another round
    wrong_size = ({**c[0], "size": 0}, [])
    headers, payload, _ = to_arrays([a, stale, wrong_size, b, c], 128)
    res = switch.process(headers, payload)
    assert switch.stats.malformed == 2 and len(res) == 1 and res.headers[0]["chunk"] == 1
    assert res.payload[0][:64].tolist() == int32_sums([a, b, c])


# the leaf role's vectors name each frame's side ({"from", "frame"}); the others are frames
VECTOR_FRAMES = [f["frame"] if isinstance(f, dict) else f for path in sorted(OUT.glob("**/*.json"))
                 for step in json.loads(path.read_text())["steps"] for f in step["in"]]


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Frames of the conformance vectors, damaged; or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=400))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    data = bytearray(bytes.fromhex(rnd.choice(VECTOR_FRAMES)))
    for _ in range(rnd.randint(1, 3)):
        what = rnd.choice(["flip", "flip", "truncate", "extend", "header"])
        if what == "flip":
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        elif what == "truncate":
            del data[rnd.randrange(len(data)):]
        elif what == "extend":
            data += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 300)))
        elif len(data) >= 58:  # one field of the emu header (offset 42)
            data[42 + rnd.randrange(16)] = rnd.randrange(256)
        if not data:
            break
    return bytes(data)


def check_parse(data: bytes) -> str:
    try:
        header, payload, extra = wire.parse_packet(wire.unframe(data))
    except wire.MalformedPacket as exc:
        assert isinstance(exc, EmuError) and isinstance(exc, ValueError)
        assert str(exc) and "\n" not in str(exc)
        return "malformed"
    assert int(header["msg_type"]) in (wire.MsgType.CONTRIB, wire.MsgType.RESULT, wire.MsgType.SPARSE_CONTRIB,
                                       wire.MsgType.SPARSE_RESULT, wire.MsgType.SCATTER_DONE)
    assert len(payload) == 64 * int(header["size"]) and payload.dtype == np.int32
    # what parses is what the sender framed: framing it again gives the same bytes
    body = payload if len(payload) else None
    if extra is None:
        again = wire.agg_packet(header, body)
    else:
        again = wire.sparse_packet({**{n: header[n] for n in wire.AGG_HEADER.names}, "block": extra[0],
                                    "next": extra[1]}, body)
    assert wire.unframe(wire.frame(again)) == wire.unframe(data)
    return "packet"


@settings(FAST, max_examples=500)
@given(data=frames())
def test_the_parsers_return_a_packet_or_raise_malformed(data: bytes) -> None:
    assert check_parse(data) in ("packet", "malformed")


def test_padding_is_not_payload_and_lengths_are_checked() -> None:
    h, _ = honest(random.Random(3), 0, 0, 2, 2, 64, 1)  # chunk 0: size 0, a 58-byte frame
    frame = wire.frame(wire.agg_packet(h))
    assert len(frame) == 58
    padded = frame + bytes(2)  # what an Ethernet NIC sends for it: 60 bytes
    assert wire.unframe(padded) == wire.unframe(frame) and check_parse(padded) == "packet"
    with pytest.raises(wire.MalformedPacket, match="UDP length 100 does not fit the 24 bytes received"):
        wire.unframe(frame[:38] + (100).to_bytes(2, "big") + frame[40:])
    with pytest.raises(wire.MalformedPacket, match="not an IPv4 UDP packet without options"):
        wire.unframe(frame[:14] + b"\x46" + frame[15:])
    with pytest.raises(wire.MalformedPacket, match="10 bytes, shorter than the 16-byte header"):
        wire.parse_agg_packet(bytes(10))
    with pytest.raises(wire.MalformedPacket, match="message type 3 is not an aggregation packet's"):
        wire.parse_agg_packet(b"\x03" + bytes(15))
    with pytest.raises(wire.MalformedPacket, match="payload of 3 bytes is not whole int32 elements"):
        wire.parse_agg_packet(b"\x01" + bytes(15) + bytes(3))
    with pytest.raises(wire.MalformedPacket, match="payload of 1 elements, header says 64"):
        wire.parse_agg_packet(b"\x01" + bytes(10) + b"\x01" + bytes(4) + bytes(4))


@pytest.mark.slow
@settings(SLOW, max_examples=5_000)
@given(case=traffic())
def test_many_switch_batches_against_the_reference(case) -> None:
    check_against_reference(*case)


@pytest.mark.slow
@settings(SLOW, max_examples=3_000)
@given(case=honest_rounds())
def test_many_honest_rounds_with_malformed_packets(case) -> None:
    check_rounds(case)


@pytest.mark.slow
@settings(SLOW, max_examples=20_000)
@given(data=frames())
def test_many_damaged_frames(data: bytes) -> None:
    assert check_parse(data) in ("packet", "malformed")


@st.composite
def collective_rounds(draw: st.DrawFn) -> tuple[int, int, int, list[list[Packet]], dict[int, tuple[str, int]]]:
    """Rounds of all_reduces, reduce_scatters and all_gathers on one pool (each chunk of its own
    kind, with an owner), shuffled and cut into batches."""
    slots, workers, k = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.sampled_from([64, 256]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    batches, kinds = [], {}
    for r in range(draw(st.integers(1, 3))):
        seq = []
        for c in range(r * slots, (r + 1) * slots):
            kind, owner = rnd.choice(["dense", "scatter", "gather"]), rnd.randrange(workers)
            kinds[c] = (kind, owner)
            for w in range(workers):
                flags = (c // slots) % 2 | {"dense": 0, "scatter": wire.FLAG_SCATTER, "gather": wire.FLAG_GATHER}[kind]
                size = k // 64 if kind != "gather" or w == owner else 0
                if kind != "dense" and w == owner:
                    flags |= wire.FLAG_OWNER
                mine = random.Random(c * 7919 + w)
                seq.append(({"msg_type": 1, "flags": flags, "job": 1, "worker": w, "num_workers": workers,
                             "slot": c % slots, "exponent": mine.randint(-128, 127), "size": size, "chunk": c},
                            mine.choices(range(-(2**31), 2**31), k=64 * size)))
        rnd.shuffle(seq)
        cuts = sorted(rnd.sample(range(1, len(seq)), min(rnd.randint(0, 3), len(seq) - 1)))
        batches += [seq[a:b] for a, b in zip([0, *cuts], [*cuts, len(seq)], strict=True)]
    return slots, workers, k, batches, kinds


@settings(FAST, max_examples=200)
@given(case=collective_rounds())
def test_a_scatter_sum_reaches_its_owner_alone_and_a_gather_block_everyone(case) -> None:
    slots, workers, k, batches, kinds = case
    switch = AggregationSwitch(slots, workers, k, 1)
    got: dict[int, list[tuple[int, int, list[int]]]] = {}
    packets: dict[int, list[Packet]] = {}
    for batch in batches:
        for h, v in batch:
            packets.setdefault(h["chunk"], []).append((h, v))
        headers, payload, extra = to_arrays(batch, k)
        res = switch.process(headers, payload, sparse=extra)
        for h, p in zip(res.headers, res.payload, strict=True):
            got.setdefault(int(h["chunk"]), []).append((int(h["msg_type"]), int(h["worker"]),
                                                        p[: 64 * int(h["size"])].tolist()))
    assert switch.stats.malformed == switch.stats.invalid == 0 and sorted(got) == sorted(kinds)
    for c, (kind, owner) in kinds.items():
        sums = int32_sums([(h, v + [0] * (k - len(v))) for h, v in packets[c]])[: k]
        if kind == "scatter":
            assert got[c] == [(wire.MsgType.RESULT, owner, sums), (wire.MsgType.SCATTER_DONE, owner, [])]
        else:  # a gather's "sum" is the owner's block, bit for bit
            want = next(v for h, v in packets[c] if h["worker"] == owner) if kind == "gather" else sums
            assert got[c] == [(wire.MsgType.RESULT, MULTICAST, want)]
