"""emu run's coordinator: the real ranks' collectives, answered as a job of M workers would, and
their program, recorded (docs/run.md).

The K real ranks call into emu's backend; each call comes here. A collective is answered once
every real rank has issued it, with what a job of M workers gives when worker ``w`` holds the
data of real rank ``w mod K`` (the fake workers mirror the real ones, ``M / K`` each): an
all_reduce's sum is ``M / K`` times the real ranks' sum, so DDP's average over M is the K real
ranks' average and training proceeds as a K-rank run would. Each result is computed in float64
from the ranks' tensors and sent in their dtype. The coordinator does not check it: each rank
does, in its own process, on what it received, against digests of what every real rank
contributed (``emu.run.backend``), which the coordinator relays untouched; the ranks' counts
come back with their calls (``checked``).

The coordinator also keeps each collective's payload vectors (``emu.emulator.payload.recorded``): the
first elements of what each real rank contributes, as many as a replay at M workers will send
(``keep``), so that the replay's workers send the real ranks' tensors through the fabric. Past
``PAYLOAD_CAP_BYTES`` it stops keeping them, and the replay sends generated payload instead.

Every call also carries the compute the rank did since its previous call returned, so the
coordinator records each rank's program (compute, collectives, waits), cut into iterations at
the optimizer's steps: an emu trace of the live run (``emu.traces`` schema 1, source ``live``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from emu.emulator.payload.recorded import RecordedPayload
from emu.errors import RunFailed
from emu.run import protocol
from emu.run.protocol import Checked
from emu.traces.model import Coll, CollKind, Compute, Dtype, Iteration, Op, RankProgram, Splits, Wait

POLL_MS = 50
PAYLOAD_CAP_BYTES = 1 << 30  # the real ranks' tensors kept for the replay, all collectives together
_KIND = {"all_reduce": CollKind.ALL_REDUCE, "broadcast": CollKind.BROADCAST, "all_gather": CollKind.ALL_GATHER,
         "reduce_scatter": CollKind.REDUCE_SCATTER, "barrier": CollKind.BARRIER, "all_to_all": CollKind.ALL_TO_ALL}


class RunProtocolFailed(RunFailed):
    """The real ranks disagreed, or sent what emu run cannot answer."""


@dataclass
class _Rank:
    """One real rank's program as it is recorded."""

    ops: list[Op] = field(default_factory=list)
    outstanding: list[int] = field(default_factory=list)  # collectives not yet waited for
    iterations: list[Iteration] = field(default_factory=list)
    collectives: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)  # (optimizer steps completed, the loss reported)


class Coordinator:
    """Serves the real ranks on ``address`` from a thread of its own (``start``, ``stop``)."""

    def __init__(self, address: str, workers: int, real: int,
                 keep: Callable[[int, int], int] | None = None, warmup: int = 0, compress_speed: float = 1.0) -> None:
        """``keep(count, itemsize)``: the elements of a collective's payload vectors to keep (None:
        none kept), from the end of the ``warmup``-th optimizer step (what comes before is never
        replayed); ``compress_speed``: the device compresses and decompresses this many times
        faster than the real ranks measured (``emu run --compress-speed``)."""
        self.warmup = warmup
        self.compress_speed = compress_speed
        if workers % real:
            raise ValueError("the workers must be a multiple of the real ranks")
        self.address, self.m, self.k = address, workers, real
        self.keep = keep
        self.payloads: dict[int, np.ndarray] = {}  # collective number: (K, kept) payload vectors
        self.payload_bytes = 0
        self.payload_dropped: str | None = None  # why the payload vectors were not all kept
        self.mirror = workers // real  # fake workers (and itself) that hold each real rank's data
        self.ranks = [_Rank() for _ in range(real)]
        self.pending: dict[int, dict[int, tuple[bytes, dict[str, Any], list[np.ndarray]]]] = {}
        self.reports: dict[int, Checked] = {}  # per real rank, the latest counts of its check
        self.error: BaseException | None = None
        self.done: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="emu-run-coordinator", daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def check(self) -> None:
        """Raise what went wrong in the coordinator's thread, if anything."""
        if self.error is not None:
            raise self.error

    @property
    def checked(self) -> Checked:
        """What the real ranks checked of the results they received, as they last reported it."""
        return sum(self.reports.values(), Checked())

    # -- the thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_FRAME + protocol.MAX_HEADER)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            self.error = RunFailed(f"emu run cannot listen on {self.address}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(POLL_MS):
                    continue
                parts = sock.recv_multipart(copy=True)
                if len(parts) < 3 or parts[1] != b"":
                    continue  # not a REQ socket's envelope: dropped
                ident, body = parts[0], parts[2:]
                for to, reply in self._handle(ident, body):
                    sock.send_multipart([to, b"", *reply], copy=False)
        except (protocol.ProtocolError, RunProtocolFailed, ValueError) as exc:
            self.error = exc if isinstance(exc, RunFailed) else RunProtocolFailed(str(exc))
        except Exception as exc:  # reported to the caller, which stops the ranks
            self.error = RunFailed(f"emu run's coordinator failed: {exc!r}")
        finally:
            sock.close(0)
            ctx.term()

    def _handle(self, ident: bytes, body: list[bytes]) -> list[tuple[bytes, list]]:
        head = protocol.header_of(body)
        r = head["rank"]
        if not 0 <= r < self.k:
            raise RunProtocolFailed(f"a request from rank {r}, not one of the {self.k} real ranks")
        rank = self.ranks[r]
        if "check" in head:
            self.reports[r] = head["check"]
        ok = protocol.encode({"v": protocol.VERSION, "ok": True})
        kind = head["kind"]
        if kind == "hello":
            if head.get("world_size") != self.m:
                raise RunProtocolFailed(f"rank {r} made a process group of {head.get('world_size')} ranks; the job "
                                        f"has {self.m} (the script must use the world size it is given)")
            return [(ident, protocol.encode({"v": protocol.VERSION, "ok": True, "real": self.k}))]
        if kind == "done":
            self.done.add(r)
            for seq, got in sorted(self.pending.items()):
                if r not in got:
                    waiting = ", ".join(map(str, sorted(got)))
                    raise RunProtocolFailed(f"rank {r} finished while rank {waiting} waits for it in collective "
                                            f"{seq} ({next(iter(got.values()))[1]['coll']}): the script's ranks do "
                                            "not issue the same collectives")
            return [(ident, ok)]
        rank.ops.append(Compute(name="compute", dur_us=float(head["compute_us"])))
        if kind == "loss":
            rank.losses.append((len(rank.iterations), float(head["value"])))
            return [(ident, ok)]
        if kind == "wait":
            ids = tuple(int(i) for i in head.get("ids", ()) if int(i) in rank.outstanding)
            if ids:
                rank.ops.append(Wait(ids=ids))
                rank.outstanding = [i for i in rank.outstanding if i not in ids]
            self._decompress(rank, head)
            return [(ident, ok)]
        if kind == "step":
            if rank.outstanding:  # the optimizer steps once every gradient is reduced (pre); the iteration ends
                rank.ops.append(Wait(ids=tuple(rank.outstanding)))
                rank.outstanding = []
            self._decompress(rank, head)
            if head.get("phase") != "pre":
                rank.iterations.append(Iteration(step=len(rank.iterations), measured_us=float(head.get("wall_us", 0.0)),
                                                 ops=tuple(op for op in rank.ops if not _empty(op))))
                rank.ops = []
            return [(ident, ok)]
        seq = head.get("seq")
        if seq != rank.collectives:
            raise RunProtocolFailed(f"rank {r} issued collective {seq!r}, expected {rank.collectives}")
        rank.collectives += 1
        if head.get("compress_us"):  # the rank compressed the gradient this collective carries
            rank.ops.append(Compute(name="compress", dur_us=float(head["compress_us"]) / self.compress_speed))
        got = self.pending.setdefault(seq, {})
        got[r] = (ident, head, protocol.arrays(head, body))
        gone = sorted(self.done - set(got))
        if gone:  # a rank that finished can never join it
            raise RunProtocolFailed(f"rank {gone[0]} finished while rank {r} waits for it in collective {seq} "
                                    f"({head['coll']}): the script's ranks do not issue the same collectives")
        if len(got) < self.k:
            return []
        del self.pending[seq]
        return self._answer(seq, got)

    def _answer(self, seq: int, got: dict[int, tuple[bytes, dict[str, Any], list[np.ndarray]]]) -> list[tuple[bytes, list]]:
        first = got[0][1]
        for r, (_, head, _) in got.items():
            # an all_to_all's rows differ between ranks (a router's split sizes): its row shape must not
            keys = ("coll", "dtype", "op", "root") if first["coll"] == "all_to_all" else (
                "coll", "dtype", "shapes", "op", "root")
            same = all(head.get(key) == first.get(key) for key in keys) and (
                first["coll"] != "all_to_all" or head["shapes"][0][1:] == first["shapes"][0][1:])
            if not same:
                raise RunProtocolFailed(
                    f"collective {seq}: rank {r} issued {head['coll']} of {head['dtype']} {head['shapes']} "
                    f"({head.get('op')}, root {head.get('root')}) where rank 0 issued {first['coll']} of "
                    f"{first['dtype']} {first['shapes']} ({first.get('op')}, root {first.get('root')})")
        coll = first["coll"]
        data = [got[r][2] for r in range(self.k)]
        heads = [got[r][1] for r in range(self.k)]
        results = self._exchanged(seq, heads, data) if coll == "all_to_all" else self._results(coll, first, data)
        digests = self._digests(seq, coll, [got[r][1].get("digest") for r in range(self.k)])
        uneven = coll == "all_to_all" and any(len({*h["in_splits"], *h["out_splits"]}) > 1 for h in heads)
        for r in range(self.k):
            self.ranks[r].ops.append(self._record(seq, got[r][1], data[r], uneven))
            self.ranks[r].outstanding.append(seq)
        self._keep(seq, self.ranks[0].ops[-1], data)
        return [(got[r][0], protocol.encode({"v": protocol.VERSION, "ok": True, "digests": digests[r]},
                                            [np.ascontiguousarray(a).tobytes() for a in results[r]]))
                for r in range(self.k)]

    def _digests(self, seq: int, coll: str, sent: list[list[Any] | None]) -> list[list[Any] | None]:
        """Per real rank, the digests its result is checked against, relayed as the ranks sent
        them: each real rank's entry for the tensor that result reduces or copies (a
        reduce_scatter's r-th input, otherwise the one)."""
        if all(d is None for d in sent):
            return [None] * self.k
        want = self.k if coll == "reduce_scatter" else 1
        for r, d in enumerate(sent):
            if d is None or len(d) != want:
                raise RunProtocolFailed(f"collective {seq} ({coll}): rank {r} sent {'no' if d is None else len(d)} "
                                        f"digests where the result needs {want} (the ranks must run one emu install)")
        return [[d[r if coll == "reduce_scatter" else 0] for d in sent] for r in range(self.k)]

    def _results(self, coll: str, head: dict[str, Any], data: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Per real rank, the tensors its call returns (all_gather: the M outputs)."""
        dt = np.dtype(protocol.DTYPES[head["dtype"]])
        if coll == "barrier":
            return [[] for _ in range(self.k)]
        if coll == "broadcast":
            src = int(head.get("root") or 0) % self.k  # a fake root holds its real rank's data
            return [[data[src][0]] for _ in range(self.k)]
        if coll == "all_gather":
            outs = [data[w % self.k][0] for w in range(self.m)]
            return [outs for _ in range(self.k)]
        if coll == "all_reduce":
            reduced = self._reduce([d[0] for d in data], head["op"], dt)
            return [[reduced] for _ in range(self.k)]
        # reduce_scatter: each worker's inputs are its real rank's list of M; real rank r gets the
        # reduction of every worker's r-th input
        if any(len(d) != self.m for d in data):
            raise RunProtocolFailed(f"reduce_scatter: give {self.m} input tensors (one per worker)")
        return [[self._reduce([d[r] for d in data], head["op"], dt)] for r in range(self.k)]

    def _exchanged(self, seq: int, heads: list[dict[str, Any]], data: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """An all_to_all's pieces for each real rank: from worker w, what real rank q = w mod K sends
        the worker at r's offset from w, r - (w - q) (every fake worker its real rank's copy, every
        offset kept); each piece the rows the receiver expects from w."""
        m, k = self.m, self.k
        pieces = []
        for q, head in enumerate(heads):
            if len(head["in_splits"]) != m or len(head["out_splits"]) != m:
                raise RunProtocolFailed(f"collective {seq} (all_to_all): rank {q} gave split sizes for "
                                        f"{len(head['in_splits'])} and {len(head['out_splits'])} workers; the job "
                                        f"has {m}")
            pieces.append(np.split(data[q][0], np.cumsum(head["in_splits"])[:-1]))
        out = []
        for r in range(k):
            got = [pieces[w % k][(r - (w - w % k)) % m] for w in range(m)]
            expect = heads[r]["out_splits"]
            bad = next((w for w in range(m) if len(got[w]) != expect[w]), None)
            if bad is not None:
                raise RunProtocolFailed(f"collective {seq} (all_to_all): rank {r} expects {expect[bad]} "
                                        f"rows from worker {bad}, which sends it {len(got[bad])} (rank {bad % k}'s "
                                        f"rows for worker {(r - (bad - bad % k)) % m}): the ranks' split sizes disagree")
            out.append(got)
        return out

    def _reduce(self, xs: list[np.ndarray], op: str, dt: np.dtype) -> np.ndarray:
        """The reduction over M workers that hold the K real ranks' tensors, ``M / K`` each."""
        wide = [x.astype(np.float64) if dt.kind == "f" else x.astype(np.int64) for x in xs]
        if op in ("sum", "avg"):
            total = sum(wide) * self.mirror
            if op == "avg":
                total = total / self.m
        elif op == "max":
            total = np.maximum.reduce(wide)
        elif op == "min":
            total = np.minimum.reduce(wide)
        else:
            total = np.prod(wide, axis=0) ** self.mirror
        if dt.kind in "iub":
            total = np.asarray(total).astype(np.int64)
        return np.asarray(total).astype(dt)

    def _keep(self, seq: int, op: Op, data: list[list[np.ndarray]]) -> None:
        """Keep collective ``seq``'s payload vectors (module docstring), within the cap."""
        if self.keep is None or self.payload_dropped is not None or not isinstance(op, Coll) \
                or op.kind in (CollKind.BARRIER, CollKind.ALL_TO_ALL) or len(self.ranks[0].iterations) < self.warmup:
            return
        n = min(op.count, self.keep(op.count, op.dtype.itemsize))
        vectors = np.stack([_payload_vector(op.kind, d, n) for d in data])
        if self.payload_bytes + vectors.nbytes > PAYLOAD_CAP_BYTES:
            self.payload_dropped = (f"the real ranks' tensors came to more than {PAYLOAD_CAP_BYTES >> 20} MiB at "
                                    f"collective {seq}; the replay sent generated payload")
            self.payloads.clear()
            return
        self.payloads[seq] = vectors
        self.payload_bytes += vectors.nbytes

    def _record(self, seq: int, head: dict[str, Any], tensors: list[np.ndarray], uneven: bool = False) -> Coll:
        """The collective as the rank's program records it; ``uneven``: an all_to_all some rank gave
        unequal sizes, whose per-peer sizes every rank's copy keeps."""
        kind = _KIND[head["coll"]]
        dtype = Dtype(head["dtype"])
        n = int(tensors[0].size) if tensors else 0
        count = {CollKind.ALL_GATHER: n * self.m, CollKind.REDUCE_SCATTER: n * self.m}.get(kind, n)
        if kind == CollKind.REDUCE_SCATTER:
            count = sum(int(t.size) for t in tensors)
        splits = None
        if uneven:  # per-peer sizes, in elements
            row = int(np.prod(head["shapes"][0][1:], dtype=np.int64))
            splits = Splits(tuple(n * row for n in head["in_splits"]), tuple(n * row for n in head["out_splits"]))
        return Coll(id=seq, kind=kind, dtype=dtype, count=count, bytes=count * dtype.itemsize, group_size=self.m,
                    root=int(head["root"]) if kind == CollKind.BROADCAST and head.get("root") is not None else None,
                    splits=splits)

    def payload(self, programs: tuple[RankProgram, ...]) -> RecordedPayload | None:
        """The payload vectors of ``programs``' collectives (None where they were not kept)."""
        if self.keep is None or self.payload_dropped is not None or not programs:
            return None
        colls = [op for it in programs[0].iterations for op in it.colls]
        per_iteration = len(programs[0].iterations[0].colls) if programs[0].iterations else 0
        return RecordedPayload(real_ranks=self.k, per_iteration=per_iteration,
                               dtypes=tuple(op.dtype.value for op in colls),
                               tensors=tuple(self.payloads.get(op.id) for op in colls))

    def _decompress(self, rank: _Rank, head: dict[str, Any]) -> None:
        """The rank decompressed what it waited for: compute after the wait."""
        if head.get("decompress_us"):
            rank.ops.append(Compute(name="decompress", dur_us=float(head["decompress_us"]) / self.compress_speed))

    def losses(self) -> tuple[tuple[int, float], ...]:
        """The script's loss curve: per count of optimizer steps completed, the mean over the real
        ranks that reported a loss there of the last each reported (``emu.run.report_loss``)."""
        by_step: dict[int, dict[int, float]] = {}
        for r, rank in enumerate(self.ranks):
            for steps, value in rank.losses:
                by_step.setdefault(steps, {})[r] = value
        return tuple((steps, float(np.mean(list(v.values())))) for steps, v in sorted(by_step.items()))

    def programs(self, warmup: int) -> tuple[RankProgram, ...]:
        """Each real rank's recorded iterations after the first ``warmup`` (DDP builds, then
        rebuilds, its buckets there)."""
        return tuple(RankProgram(rank=r, iterations=tuple(
            Iteration(step=i, measured_us=it.measured_us, ops=it.ops)
            for i, it in enumerate(self.ranks[r].iterations[warmup:])))
            for r in range(self.k))


def _payload_vector(kind: CollKind, tensors: list[np.ndarray], n: int) -> np.ndarray:
    """The first ``n`` values a worker holding these tensors contributes to the collective
    (``emu.emulator.payload.recorded``): all_gather's input repeats over the output, reduce_scatter's
    inputs go end to end."""
    if kind == CollKind.ALL_GATHER:
        return np.resize(tensors[0].ravel(), n)
    flat = tensors[0].ravel() if kind != CollKind.REDUCE_SCATTER else np.concatenate([t.ravel() for t in tensors])
    return flat[:n].copy()


def _empty(op: Op) -> bool:
    return isinstance(op, Compute) and op.dur_us == 0.0
