"""Conformance vectors of the aggregation protocol: scenarios and a reference model.

The reference model below is the protocol written as plainly as possible, one
packet at a time with Python ints and dicts, independent of the numpy switch. It
computes the expected output of each scenario; ``python -m tests.emulator.vectors``
writes them to ``tests/data/conformance/`` (frames in hex: Ethernet/IPv4/UDP
template + emu header + payload), and a test checks the files are current. The
software switch runs them in every test run; the P4 program runs them on BMv2. The sparse
stream's vectors (``SPARSE_CONTRIB``, docs/sparse.md) are in ``sparse/``: the software switch
runs them too; the P4 program, which stays dense, does not. So are the reduce_scatter's and
all_gather's rounds (``FLAG_SCATTER``, ``FLAG_GATHER``: docs/protocol.md), in ``collectives/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from emu.emulator.protocol import wire

OUT = Path(__file__).resolve().parents[1] / "data" / "conformance"
SPARSE_OUT = OUT / "sparse"
COLLECTIVES_OUT = OUT / "collectives"
SCATTER, GATHER, OWNER = wire.FLAG_SCATTER, wire.FLAG_GATHER, wire.FLAG_OWNER
NONE = 0xFFFFFFFF  # wire.BLOCK_NONE


class Reference:
    def __init__(self, slots: int, workers: int, elements: int, job: int) -> None:
        self.slots, self.workers, self.k, self.job = slots, workers, elements, job
        self.state = {(s, c): {"acc": [0] * elements, "bits": set(), "count": 0, "exp": -128,
                               "size": 0, "chunk": 0, "sparse": False, "block": 0, "next": NONE,
                               "kind": 0, "owner": -1}
                      for s in range(slots) for c in (0, 1)}

    @staticmethod
    def ident(h: dict) -> int:
        """What pins a round besides its chunk: a dense packet's size, a sparse packet's block, a
        reduce_scatter's size apart from an all_reduce's, an all_gather's kind alone."""
        if h["msg_type"] == 4:
            return 256 + h.get("block", 0)
        kind = h["flags"] & (SCATTER | GATHER)
        return -1000 if kind == GATHER else -1 - h["size"] if kind == SCATTER else h["size"]

    @staticmethod
    def state_ident(st: dict) -> int:
        """The same of the round a slot copy holds."""
        if st["sparse"]:
            return 256 + st["block"]
        return -1000 if st["kind"] == GATHER else -1 - st["size"] if st["kind"] == SCATTER else st["size"]

    def packet(self, h: dict, payload: list[int]) -> list[tuple[int, dict, list[int]]]:
        kind, owns = h["flags"] & (SCATTER | GATHER), bool(h["flags"] & OWNER)
        if (h["msg_type"] not in (1, 4) or h["job"] != self.job or h["num_workers"] != self.workers
                or h["slot"] >= self.slots or h["worker"] >= self.workers or h["size"] * 64 > self.k
                or kind == SCATTER | GATHER or (kind and h["msg_type"] == 4)
                or (kind == GATHER and h["size"] and not owns)):
            return []
        s, c, w = h["slot"], h["flags"] & 1, h["worker"]
        st = self.state[(s, c)]
        # a copy in progress, or complete with this worker in it, holds its round: another chunk or
        # kind is dropped unapplied; a complete copy this worker left takes a new round, but not the
        # chunk it completed (a stale retransmission), also dropped unapplied
        pinned = st["count"] > 0 and (st["count"] < self.workers or w in st["bits"])
        if pinned and (h["chunk"] != st["chunk"] or self.ident(h) != self.state_ident(st)):
            return []
        if not pinned and st["count"] == self.workers and h["chunk"] == st["chunk"]:
            return []
        self.state[(s, 1 - c)]["bits"].discard(w)
        if w in st["bits"]:
            if st["count"] != self.workers:
                return []
            out = self._result(s, c, w)
            if st["kind"] == SCATTER and st["owner"] >= 0 and w != st["owner"]:
                out[1]["size"] = 0  # the sum is the owner's alone
                return [(w, out[1], [])]
            return [out]
        st["bits"].add(w)
        values = payload + [0] * (self.k - len(payload))
        sparse, nxt = h["msg_type"] == 4, h.get("next", 0)
        if st["count"] in (0, self.workers):
            st.update(acc=values, count=1, exp=h["exponent"], size=h["size"], chunk=h["chunk"], sparse=sparse,
                      block=h.get("block", 0), next=nxt if sparse else NONE, kind=kind, owner=w if owns else -1)
        else:
            st["acc"] = [((a + b + 2**31) % 2**32) - 2**31 for a, b in zip(st["acc"], values, strict=True)]
            st["count"] += 1
            st["size"] = max(st["size"], h["size"])
            if owns:
                st["owner"] = max(st["owner"], w)
            if not sparse:
                st["exp"] = max(st["exp"], h["exponent"])
            else:  # the smallest next block wins; among the packets that named it, the largest exponent
                st["size"] = max(st["size"], h["size"])
                if nxt < st["next"]:
                    st["next"], st["exp"] = nxt, h["exponent"]
                elif nxt == st["next"]:
                    st["exp"] = max(st["exp"], h["exponent"])
        if st["count"] == self.workers:
            if st["kind"] == SCATTER and st["owner"] >= 0:  # the sum to the owner, a completion to the rest
                owner = st["owner"]
                done = {**self._result(s, c, owner)[1], "msg_type": 6, "size": 0}
                return [self._result(s, c, owner)] + [(d, done, []) for d in range(self.workers) if d != owner]
            return [self._result(s, c, dest) for dest in range(self.workers)]
        return []

    def _result(self, s: int, c: int, dest: int) -> tuple[int, dict, list[int]]:
        st = self.state[(s, c)]
        header = {"msg_type": 5 if st["sparse"] else 2, "flags": c | st["kind"], "job": self.job, "worker": dest,
                  "num_workers": self.workers, "slot": s, "exponent": st["exp"], "size": st["size"],
                  "chunk": st["chunk"]}
        if st["sparse"]:
            header.update(block=st["block"], next=st["next"])
        return dest, header, st["acc"][: 64 * st["size"]]


def contrib(w: int, chunk: int, slots: int, workers: int, values: list[int] | None, exponent: int = 0,
            job: int = 1, **override: int) -> tuple[dict, list[int]]:
    h = {"msg_type": 1, "flags": (chunk // slots) % 2, "job": job, "worker": w, "num_workers": workers,
         "slot": chunk % slots, "exponent": exponent, "size": 0 if values is None else len(values) // 64,
         "chunk": chunk}
    h.update(override)
    return h, values or []


def vals(seed: int, n: int = 64) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.integers(-(2**20), 2**20, n)]


def scenarios() -> list[tuple[str, str, dict, list[list[tuple[dict, list[int]]]]]]:
    """(name, description, config, steps); each step is one batch of packets in order."""
    out = []
    cfg = {"slots": 2, "workers": 3, "elements": 64, "job": 1}
    out.append(("basic-sum", "three workers fill slot 0 copy 0; the third completes it and the sum goes to all",
                cfg, [[contrib(w, 0, 2, 3, vals(w)) for w in range(3)]]))
    steps = []
    for chunk in range(6):  # 3 rounds of each slot: copies alternate 0, 1, 0
        steps.append([contrib(w, chunk, 2, 3, vals(100 * chunk + w), exponent=chunk - w) for w in (2, 0, 1)])
    out.append(("copy-alternation", "chunks 0..5 on 2 slots: copies alternate, a new round overwrites, "
                "exponents take the maximum", cfg, steps))
    steps = [
        [contrib(0, 0, 2, 3, vals(1)), contrib(1, 0, 2, 3, vals(2))],
        [contrib(0, 0, 2, 3, vals(1))],  # duplicate of an incomplete copy: dropped
        [contrib(2, 0, 2, 3, vals(3)), contrib(1, 0, 2, 3, vals(2))],  # completes; then a duplicate: answered
        [contrib(1, 0, 2, 3, vals(2)), contrib(0, 2, 2, 3, vals(4))],  # answered; worker 0 moves to copy 1
        [contrib(0, 0, 2, 3, vals(1))],  # worker 0 cleared its bit in copy 0: a stale retransmission
    ]
    out.append(("duplicates", "a retransmission of an incomplete copy is dropped, of a complete one answered "
                "to its sender alone, also inside one batch; clearing the other copy's bit", cfg, steps))
    steps = [
        [contrib(w, 0, 2, 3, vals(w)) for w in range(3)],  # slot 0 copy 0 completes
        # worker 0 goes on to copy 1, then its late copy of chunk 0 arrives: stale, dropped without
        # clearing its bit in copy 1 (its retransmission of chunk 2 below is answered)
        [contrib(0, 2, 2, 3, vals(20)), contrib(0, 0, 2, 3, vals(0)), contrib(1, 2, 2, 3, vals(21)),
         contrib(2, 2, 2, 3, vals(22)), contrib(0, 2, 2, 3, vals(20))],
        # copy 0 holds chunk 4's round: chunk 8 (same copy) and a header-only chunk 4 are other rounds
        [contrib(1, 4, 2, 3, vals(41)), contrib(2, 8, 2, 3, vals(82)), contrib(0, 4, 2, 3, None),
         contrib(0, 4, 2, 3, vals(40)), contrib(2, 4, 2, 3, vals(42))],
    ]
    out.append(("stale-and-other-rounds", "a stale copy of a completed round, and packets of another chunk or "
                "size than the round their copy holds, are dropped without any effect", cfg, steps))
    cfg4 = {"slots": 4, "workers": 2, "elements": 64, "job": 1}
    steps = [[contrib(w, c, 4, 2, vals(10 * c + w)) for c in range(8) for w in range(2)]]
    steps.append([contrib(w, c, 4, 2, vals(10 * c + w)) for w in range(2) for c in range(8, 12)])
    out.append(("full-pool", "both copies of all 4 slots in flight in one batch, then the next round", cfg4, steps))
    cfg256 = {"slots": 2, "workers": 2, "elements": 256, "job": 1}
    steps = [[contrib(0, 0, 2, 2, None, exponent=-3), contrib(1, 0, 2, 2, None, exponent=5)],
             [contrib(0, 1, 2, 2, vals(7, 256), exponent=1), contrib(1, 1, 2, 2, vals(8, 256), exponent=2)],
             [contrib(0, 2, 2, 2, vals(9, 64)), contrib(1, 2, 2, 2, vals(10, 64))]]
    out.append(("exponents-and-sizes", "an exponents-only round (no payload), 256-element packets, then "
                "64-element packets in a 256-element pool", cfg256, steps))
    cfg64 = {"slots": 2, "workers": 2, "elements": 64, "job": 1}
    steps = [[contrib(0, 0, 2, 2, None, exponent=-3), contrib(1, 0, 2, 2, None, exponent=5)],
             [contrib(0, 1, 2, 2, vals(11), exponent=-7), contrib(1, 1, 2, 2, vals(12), exponent=-2)]]
    out.append(("exponents-only", "an exponents-only round (header-only packets: the largest exponent back), then a "
                "round with payload, in 64-element packets (the P4 program's)", cfg64, steps))
    steps = [[contrib(0, 0, 2, 3, vals(1), job=2), contrib(1, 0, 2, 3, vals(1), num_workers=4),
              contrib(2, 0, 2, 3, vals(1), slot=7), contrib(5, 0, 2, 3, vals(1)),
              contrib(0, 0, 2, 3, vals(1), msg_type=2), contrib(0, 0, 2, 3, vals(1))]]
    out.append(("invalid", "packets of another job, worker count, slot, worker or type are dropped", cfg, steps))
    return out


def encode(h: dict, payload: list[int]) -> str:
    make = wire.sparse_packet if h["msg_type"] in (4, 5) else wire.agg_packet
    return wire.frame(make(h, np.array(payload, dtype=np.int64) if payload else None)).hex()


def build(sparse: bool = False, collectives: bool = False) -> dict[str, dict]:
    files = {}
    chosen = collective_scenarios() if collectives else sparse_scenarios() if sparse else scenarios()
    for name, description, cfg, steps in chosen:
        ref = Reference(**cfg)
        doc_steps = []
        for step in steps:
            outs = []
            for h, payload in step:
                outs += ref.packet(h, payload)
            doc_steps.append({"in": [encode(h, p) for h, p in step],
                              "out": [{"port": port, "frame": encode(h, p)} for port, h, p in outs]})
        files[name] = {"name": name, "description": description, "config": cfg, "steps": doc_steps}
    return files


def sparse(w: int, chunk: int, slots: int, workers: int, block: int, nxt: int, values: list[int] | None,
           exponent: int = 0, job: int = 1) -> tuple[dict, list[int]]:
    """A packet of the sparse stream: ``block`` it sums (NONE for an announcement), ``nxt`` the
    sender's next non-zero block of the slot's partition, ``values`` None if it holds no data."""
    h, v = contrib(w, chunk, slots, workers, values, exponent, job, msg_type=4)
    h.update(block=block, next=nxt)
    return h, v


def sparse_scenarios() -> list[tuple[str, str, dict, list[list[tuple[dict, list[int]]]]]]:
    """The sparse stream on one slot (partition 0 of blocks 0, 2, 4, ... with 2 slots)."""
    out = []
    cfg = {"slots": 2, "workers": 3, "elements": 64, "job": 1}
    # worker 0 holds blocks 2 and 6; worker 1 holds 2 and 4; worker 2 holds none of partition 0
    steps = [
        [sparse(0, 0, 2, 3, NONE, 2, None, exponent=3), sparse(1, 0, 2, 3, NONE, 2, None, exponent=5),
         sparse(2, 0, 2, 3, NONE, NONE, None, exponent=-128)],  # announcements: block 2, exponent 5
        [sparse(0, 2, 2, 3, 2, 6, vals(1), exponent=1), sparse(2, 2, 2, 3, 2, NONE, None, exponent=-128),
         sparse(1, 2, 2, 3, 2, 4, vals(2), exponent=7)],  # block 2 summed; next is 4 (worker 1's), exponent 7
        [sparse(1, 4, 2, 3, 4, NONE, vals(3)), sparse(0, 4, 2, 3, 4, 6, None, exponent=2),
         sparse(2, 4, 2, 3, 4, NONE, None, exponent=-128)],  # block 4: worker 1 alone sends data
        [sparse(0, 6, 2, 3, 6, NONE, vals(4), exponent=-128), sparse(1, 6, 2, 3, 6, NONE, None, exponent=-128),
         sparse(2, 6, 2, 3, 6, NONE, None, exponent=-128)],  # the last block: next NONE ends the partition
    ]
    out.append(("sparse-stream", "announcements, then only the union's blocks: the holders send data, "
                "the others a header with their next block; the result carries the minimum next and its "
                "holders' largest exponent, and NONE ends the partition", cfg, steps))
    steps = [
        [sparse(0, 0, 2, 3, NONE, 2, None, exponent=3), sparse(1, 0, 2, 3, NONE, 2, None, exponent=5)],
        [sparse(0, 0, 2, 3, NONE, 2, None, exponent=3)],  # duplicate of an incomplete round: dropped
        [sparse(2, 0, 2, 3, NONE, 8, None, exponent=9), sparse(1, 0, 2, 3, NONE, 2, None, exponent=5)],
        [sparse(0, 2, 2, 3, 2, NONE, vals(5)), sparse(1, 2, 2, 3, 2, 8, None, exponent=4),
         sparse(2, 2, 2, 3, 2, 8, vals(6), exponent=2)],  # block 2 from two holders
        [sparse(1, 2, 2, 3, 2, 8, None, exponent=4)],  # a retransmission after completion: answered alone
    ]
    out.append(("sparse-duplicates", "a duplicate announcement of an incomplete round is dropped, then "
                "answered from the shadow copy once complete; the same for a header-only packet",
                cfg, steps))
    return out


def collective_scenarios() -> list[tuple[str, str, dict, list[list[tuple[dict, list[int]]]]]]:
    """A reduce_scatter's rounds (the sum to the shard's owner, completions to the rest) and an
    all_gather's (the owner's block, everyone's headers, the block to all)."""
    out = []
    cfg = {"slots": 2, "workers": 3, "elements": 64, "job": 1}

    def rs(w: int, chunk: int, owner: int, values: list[int] | None, exponent: int = 0) -> tuple[dict, list[int]]:
        return contrib(w, chunk, 2, 3, values, exponent, flags=(chunk // 2) % 2 | SCATTER | (OWNER if w == owner else 0))

    def ag(w: int, chunk: int, owner: int, values: list[int]) -> tuple[dict, list[int]]:
        return contrib(w, chunk, 2, 3, values if w == owner else None, -128,
                       flags=(chunk // 2) % 2 | GATHER | (OWNER if w == owner else 0))

    steps = [[rs(w, 0, 1, vals(w), exponent=w) for w in range(3)],  # worker 1's shard: its sum, the others' done
             [rs(w, 1, 2, vals(10 + w)) for w in (2, 0, 1)],
             [rs(w, 2, 0, vals(20 + w), exponent=-w) for w in range(3)]]  # slot 0's other copy, worker 0's shard
    out.append(("scatter-to-owner", "a reduce_scatter's rounds: every worker's block is summed, the sum goes to the "
                "block's owner alone, a header-only completion with the agreed exponent to every other worker",
                cfg, steps))
    steps = [[rs(0, 0, 2, vals(1)), rs(2, 0, 2, vals(2))],
             [rs(2, 0, 2, vals(2))],  # the owner's duplicate of an incomplete round: dropped
             [rs(1, 0, 2, vals(3))],  # completes
             [rs(2, 0, 2, vals(2)), rs(0, 0, 2, vals(1))]]  # duplicates: the owner gets the sum, worker 0 a header
    out.append(("scatter-duplicates", "duplicates of a reduce_scatter's round: dropped while incomplete, then the "
                "owner's answered with the sum and another worker's with a header alone", cfg, steps))
    edge = [-(2**31), 2**31 - 1, -1, 0] * 16  # raw bits: the sum of one block and nothing is the block
    steps = [[ag(w, 0, 0, edge) for w in (1, 0, 2)],
             [ag(w, 1, 2, vals(5)) for w in range(3)],
             [contrib(1, 2, 2, 3, vals(6), -128, flags=1 | GATHER)]]  # a gather block not its owner's: dropped
    out.append(("gather-multicast", "an all_gather's rounds: the owner sends its block, the others a header; the "
                "block, bit for bit, goes to every worker; data from a worker that does not own the block is dropped",
                cfg, steps))
    return out


if __name__ == "__main__":
    for folder, sparse_set in ((OUT, False), (SPARSE_OUT, True)):
        folder.mkdir(parents=True, exist_ok=True)
        for name, doc in build(sparse_set).items():
            (folder / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {folder / name}.json")
    COLLECTIVES_OUT.mkdir(parents=True, exist_ok=True)
    for name, doc in build(collectives=True).items():
        (COLLECTIVES_OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {COLLECTIVES_OUT / name}.json")
