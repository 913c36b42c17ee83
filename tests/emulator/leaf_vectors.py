"""Conformance vectors of hierarchical aggregation's leaf role (docs/protocol.md, "Leaf and spine").

The spine is the one-switch data plane whose workers are the job's leaves, so the one-switch
vectors (``tests.emulator.vectors``) are the spine's. The leaf's are here: packets in from its
workers' ports and from the spine's port, packets out to each. ``LeafReference`` is the role
written as plainly as possible over the plain one-switch reference, independent of
``tests.emulator.leaf_switch``; ``python -m tests.emulator.leaf_vectors`` writes the vectors to
``tests/data/conformance/leaf/`` and a test checks that the files are current.
"""

from __future__ import annotations

import json

from tests.emulator.vectors import OUT, Reference, contrib, encode, vals

LEAF_OUT = OUT / "leaf"
SPINE = "spine"
MULTICAST = 0xFFFF


class LeafReference:
    """A leaf holding ``ranks`` of a job of ``job_workers``; it is leaf ``leaf`` of ``leaves``."""

    def __init__(self, slots: int, elements: int, job: int, ranks: list[int], job_workers: int, leaf: int,
                 leaves: int) -> None:
        self.inner = Reference(slots, len(ranks), elements, job)
        self.ranks, self.m, self.leaf, self.leaves, self.job, self.k = ranks, job_workers, leaf, leaves, job, elements
        self.final: dict[tuple[int, int], tuple[int, int, list[int]]] = {}  # copy -> (chunk, exponent, sums)
        self.askers: dict[tuple[int, int], list[int]] = {}
        self.served: dict[tuple[int, int], list[int]] = {}  # who got the final sum from the spine's results

    def from_worker(self, h: dict, payload: list[int]) -> list[tuple[int | str, dict, list[int]]]:
        if h["msg_type"] != 1 or h["job"] != self.job or h["num_workers"] != self.m or h["worker"] not in self.ranks:
            return []
        inner = dict(h, worker=self.ranks.index(h["worker"]), num_workers=len(self.ranks))
        s, c = h["slot"], h["flags"] & 1
        duplicate = s < self.inner.slots and inner["worker"] in self.inner.state[(s, c)]["bits"]
        outs = self.inner.packet(inner, payload)
        if not outs:
            return []
        st = self.inner.state[(s, c)]
        if not duplicate:  # the copy completed: its partial sum goes up, nothing down yet
            self.final.pop((s, c), None)
            self.askers.pop((s, c), None)
            self.served.pop((s, c), None)
            return [(SPINE, self._partial(s, c), st["acc"][: 64 * st["size"]])]
        rank = self.ranks[outs[0][0]]
        final = self.final.get((s, c))
        if final is not None and final[0] == st["chunk"]:  # a duplicate, answered with the final sum
            return [(rank, self._result(s, c, rank), final[2][: 64 * st["size"]])]
        waiting = self.askers.setdefault((s, c), [])
        if rank not in waiting:
            waiting.append(rank)
        return [(SPINE, self._partial(s, c), st["acc"][: 64 * st["size"]])]  # the partial again

    def from_spine(self, h: dict, payload: list[int]) -> list[tuple[int | str, dict, list[int]]]:
        if (h["msg_type"] != 2 or h["job"] != self.job or h["num_workers"] != self.leaves
                or h["slot"] >= self.inner.slots or h["worker"] not in (MULTICAST, self.leaf)):
            return []
        s, c = h["slot"], h["flags"] & 1
        st = self.inner.state[(s, c)]
        if st["count"] != len(self.ranks) or st["chunk"] != h["chunk"]:
            return []  # stale: the copy moved on
        waiting = self.askers.pop((s, c), [])
        kept = self.final.get((s, c))
        served = self.served.setdefault((s, c), [])
        if kept is not None and kept[0] == h["chunk"]:  # a second result for a kept sum
            dests = list(waiting)
            if h["worker"] == MULTICAST:  # and the workers the first one missed
                dests += [r for r in self.ranks if r not in served and r not in dests]
            served += [r for r in dests if r not in served]
            return [(rank, self._result(s, c, rank), kept[2][: 64 * st["size"]]) for rank in dests]
        self.final[(s, c)] = (h["chunk"], h["exponent"], list(payload) + [0] * (self.k - len(payload)))
        dests = self.ranks if h["worker"] == MULTICAST else waiting
        self.served[(s, c)] = list(dests)
        return [(rank, self._result(s, c, rank), self.final[(s, c)][2][: 64 * st["size"]]) for rank in dests]

    def _partial(self, s: int, c: int) -> dict:
        st = self.inner.state[(s, c)]
        return {"msg_type": 1, "flags": c, "job": self.job, "worker": self.leaf, "num_workers": self.leaves,
                "slot": s, "exponent": st["exp"], "size": st["size"], "chunk": st["chunk"]}

    def _result(self, s: int, c: int, dest: int) -> dict:
        chunk, exp, _ = self.final[(s, c)]
        return {"msg_type": 2, "flags": c, "job": self.job, "worker": dest, "num_workers": self.m, "slot": s,
                "exponent": exp, "size": self.inner.state[(s, c)]["size"], "chunk": chunk}


def spine_result(chunk: int, slots: int, leaves: int, values: list[int], exponent: int = 0, job: int = 1,
                 dest: int = MULTICAST) -> tuple[dict, list[int]]:
    h = {"msg_type": 2, "flags": (chunk // slots) % 2, "job": job, "worker": dest, "num_workers": leaves,
         "slot": chunk % slots, "exponent": exponent, "size": len(values) // 64, "chunk": chunk}
    return h, values


def _sum(*parts: list[int]) -> list[int]:
    return [((sum(col) + 2**31) % 2**32) - 2**31 for col in zip(*parts, strict=True)]


Step = list[tuple[str, tuple[dict, list[int]]]]  # ("worker" or "spine", packet)


def scenarios() -> list[tuple[str, str, dict, list[Step]]]:
    """(name, description, config, steps): leaf 1 of 2 holds ranks 1 and 3 of a job of 4 workers."""
    cfg = {"slots": 2, "elements": 64, "job": 1, "ranks": [1, 3], "job_workers": 4, "leaf": 1, "leaves": 2}
    m, s, lv = 4, 2, 2
    a, b = vals(11), vals(13)
    other = vals(17)  # the other leaf's partial sum
    total = _sum(a, b, other)
    out = []
    out.append(("leaf-round", "both workers of the leaf contribute: one partial sum goes up, nothing down; the "
                "spine's multicast result goes to both workers", cfg,
                [[("worker", contrib(1, 0, s, m, a, exponent=2)), ("worker", contrib(3, 0, s, m, b, exponent=5))],
                 [("spine", spine_result(0, s, lv, total, exponent=5))]]))
    out.append(("leaf-duplicates", "a duplicate before the copy is complete is dropped; after, before the final "
                "sum, the partial goes up again and the spine's answer to the leaf goes to the asker alone; "
                "after the final sum, the leaf answers itself", cfg,
                [[("worker", contrib(1, 0, s, m, a)), ("worker", contrib(1, 0, s, m, a))],
                 [("worker", contrib(3, 0, s, m, b)), ("worker", contrib(3, 0, s, m, b))],
                 [("spine", spine_result(0, s, lv, total, dest=1))],
                 [("worker", contrib(1, 0, s, m, a))]]))
    out.append(("leaf-recycling", "chunks 0..4 on 2 slots: copies alternate; chunk 4 reopens chunk 0's copy, "
                "whose final sum goes with it: a late spine result for chunk 0 is stale, dropped, and a worker's "
                "duplicate of chunk 4's incomplete copy is dropped", cfg,
                [[("worker", contrib(w, c, s, m, vals(10 * c + w))) for c in (0, 1) for w in (1, 3)],
                 [("spine", spine_result(c, s, lv, vals(50 + c))) for c in (0, 1)],
                 [("worker", contrib(w, c, s, m, vals(10 * c + w))) for c in (2, 3) for w in (3, 1)],
                 [("spine", spine_result(2, s, lv, vals(52))), ("worker", contrib(3, 4, s, m, vals(43)))],
                 [("spine", spine_result(0, s, lv, vals(60))), ("worker", contrib(3, 4, s, m, vals(43)))]]))
    out.append(("leaf-invalid", "a rank the leaf does not hold, another job, worker count or type; a spine "
                "result for another leaf or leaf count", cfg,
                [[("worker", contrib(0, 0, s, m, a)), ("worker", contrib(1, 0, s, m, a, job=2)),
                  ("worker", contrib(1, 0, s, 3, a)), ("worker", contrib(1, 0, s, m, a, msg_type=2))],
                 [("worker", contrib(1, 0, s, m, a)), ("worker", contrib(3, 0, s, m, b))],
                 [("spine", spine_result(0, s, lv, total, dest=0)), ("spine", spine_result(0, s, 3, total))]]))
    out.append(("leaf-twice", "the spine's unicast answer to a resent partial overtakes its multicast: the "
                "late multicast goes to the workers the answer missed, and a third copy to no one",
                cfg,
                [[("worker", contrib(1, 0, s, m, a)), ("worker", contrib(3, 0, s, m, b)),
                  ("worker", contrib(1, 0, s, m, a))],
                 [("spine", spine_result(0, s, lv, total, dest=1)), ("spine", spine_result(0, s, lv, total))],
                 [("worker", contrib(3, 0, s, m, b)), ("spine", spine_result(0, s, lv, total))]]))
    one = {"slots": 2, "elements": 256, "job": 1, "ranks": [2], "job_workers": 4, "leaf": 0, "leaves": 3}
    out.append(("leaf-one-worker", "a leaf of one worker: its contribution is its partial sum; an exponent-only "
                "round (no payload) and 256-element packets pass the same way", one,
                [[("worker", contrib(2, 0, s, m, None, exponent=-3))],
                 [("spine", spine_result(0, s, 3, [], exponent=4))],
                 [("worker", contrib(2, 1, s, m, vals(21, 256), exponent=4))],
                 [("worker", contrib(2, 1, s, m, vals(21, 256), exponent=4)),
                  ("spine", spine_result(1, s, 3, vals(22, 256), exponent=4))],
                 [("worker", contrib(2, 1, s, m, vals(21, 256), exponent=4))]]))
    return out


def build() -> dict[str, dict]:
    files = {}
    for name, description, cfg, steps in scenarios():
        ref = LeafReference(**cfg)
        doc_steps = []
        for step in steps:
            outs = []
            for side, (h, payload) in step:
                outs += ref.from_worker(h, payload) if side == "worker" else ref.from_spine(h, payload)
            doc_steps.append({"in": [{"from": side, "frame": encode(h, p)} for side, (h, p) in step],
                              "out": [{"port": port, "frame": encode(h, p)} for port, h, p in outs]})
        files[name] = {"name": name, "description": description, "config": cfg, "steps": doc_steps}
    return files


if __name__ == "__main__":
    LEAF_OUT.mkdir(parents=True, exist_ok=True)
    for name, doc in build().items():
        (LEAF_OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {LEAF_OUT / name}.json")
