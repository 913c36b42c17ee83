"""Conformance vectors of the aggregation protocol: scenarios and a reference model.

The reference model below is the protocol written as plainly as possible, one
packet at a time with Python ints and dicts, independent of the numpy switch. It
computes the expected output of each scenario; ``python -m tests.emulator.vectors``
writes them to ``tests/data/conformance/`` (frames in hex: Ethernet/IPv4/UDP
template + emu header + payload), and a test checks the files are current. The
software switch runs them in every test run; the P4 program runs them on BMv2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from emu.emulator import wire

OUT = Path(__file__).resolve().parents[1] / "data" / "conformance"


class Reference:
    def __init__(self, slots: int, workers: int, elements: int, job: int) -> None:
        self.slots, self.workers, self.k, self.job = slots, workers, elements, job
        self.state = {(s, c): {"acc": [0] * elements, "bits": set(), "count": 0, "exp": -128,
                               "size": 0, "chunk": 0} for s in range(slots) for c in (0, 1)}

    def packet(self, h: dict, payload: list[int]) -> list[tuple[int, dict, list[int]]]:
        if (h["msg_type"] != 1 or h["job"] != self.job or h["num_workers"] != self.workers
                or h["slot"] >= self.slots or h["worker"] >= self.workers or h["size"] * 64 > self.k):
            return []
        s, c, w = h["slot"], h["flags"] & 1, h["worker"]
        self.state[(s, 1 - c)]["bits"].discard(w)
        st = self.state[(s, c)]
        if w in st["bits"]:
            return [self._result(s, c, w)] if st["count"] == self.workers else []
        st["bits"].add(w)
        values = payload + [0] * (self.k - len(payload))
        if st["count"] in (0, self.workers):
            st.update(acc=values, count=1, exp=h["exponent"], size=h["size"], chunk=h["chunk"])
        else:
            st["acc"] = [((a + b + 2**31) % 2**32) - 2**31 for a, b in zip(st["acc"], values, strict=True)]
            st["count"] += 1
            st["exp"] = max(st["exp"], h["exponent"])
        if st["count"] == self.workers:
            return [self._result(s, c, dest) for dest in range(self.workers)]
        return []

    def _result(self, s: int, c: int, dest: int) -> tuple[int, dict, list[int]]:
        st = self.state[(s, c)]
        header = {"msg_type": 2, "flags": c, "job": self.job, "worker": dest,
                  "num_workers": self.workers, "slot": s, "exponent": st["exp"], "size": st["size"],
                  "chunk": st["chunk"]}
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
        [contrib(0, 0, 2, 3, vals(1))],  # worker 0 cleared its bit in copy 0: a stale retransmission adds
    ]
    out.append(("duplicates", "a retransmission of an incomplete copy is dropped, of a complete one answered "
                "to its sender alone, also inside one batch; clearing the other copy's bit", cfg, steps))
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
    steps = [[contrib(0, 0, 2, 3, vals(1), job=2), contrib(1, 0, 2, 3, vals(1), num_workers=4),
              contrib(2, 0, 2, 3, vals(1), slot=7), contrib(5, 0, 2, 3, vals(1)),
              contrib(0, 0, 2, 3, vals(1), msg_type=2), contrib(0, 0, 2, 3, vals(1))]]
    out.append(("invalid", "packets of another job, worker count, slot, worker or type are dropped", cfg, steps))
    return out


def encode(h: dict, payload: list[int]) -> str:
    return wire.frame(wire.agg_packet(h, np.array(payload, dtype=np.int64) if payload else None)).hex()


def build() -> dict[str, dict]:
    files = {}
    for name, description, cfg, steps in scenarios():
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


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for name, doc in build().items():
        (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT / name}.json")
