"""emu's torch.distributed backend, in a real rank's process (docs/run.md).

A process group written in Python (torch accepts them: its own tests define one) and registered
as the ``emu`` backend. Every collective goes to emu run's coordinator with the rank's tensors and
the compute the rank did since its previous call into the backend returned; the answer, what a job
of M workers gives, is copied into the rank's tensors, so the returned work is complete. Waits
and the optimizer's steps are reported too, so the coordinator can record the rank's program.

Compute is measured on the calling thread's CPU clock by default (``thread``): the real ranks
and emu share the machine's cores, and CPU time is what the rank's work costs whatever else
runs; ``wall`` measures wall time instead (for work spread over threads, or on a quiet machine).

The rank checks every result it receives, here in its own process, on the tensors the script now
holds, against what the real ranks contributed, not against the coordinator's arithmetic: each
request carries a digest of the rank's own tensor (``digest``), the coordinator relays the K
ranks' digests with the result, and the rank compares (``verdict``). A sum's digest is its
projections on seeded random vectors, which are linear: the result's projections must be the
share of each real rank (``M / K``, or ``1 / K`` for avg) times the sum of the ranks', within a
rounding bound (``_bound``), or exactly mod 2^bits for integers. A copy's digest is a hash of its
bytes. What a rank checked goes to the coordinator with each call (``protocol.Checked``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import zmq

from emu.run import protocol
from emu.run.compress import RankCompressor, live_compressor
from emu.run.protocol import MAX_DIGESTS, PROJECTIONS

NAME = "emu"
MAX_ALL_TO_ALL = 1024  # workers of an all_to_all: its two split lists and M hashes fit a request's header
SEED = 0x656D75  # the projections' vectors are drawn from (SEED, the collective's seq, the tensor's index)
CHUNK = 1 << 16  # elements of the vectors drawn at a time (every rank draws them alike)
_REDUCE = ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
           (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.PRODUCT, "product"))
_DTYPE = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.int64: "int64",
          torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


class Unsupported(RuntimeError):
    """A call emu run cannot serve (the script sees it as the backend's error)."""


class Channel:
    """The rank's connection to the coordinator, and its compute clock."""

    def __init__(self, address: str, rank: int, clock: protocol.ComputeClock, timeout_s: float) -> None:
        self.rank = rank
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.timeout_ms = int(min(timeout_s, 30 * 86400) * 1000)
        self.sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        self.sock.connect(address)
        self.clock = clock.timer()
        self.mark = self.clock()
        self.wall_mark = time.perf_counter()
        self.seq = 0
        self.real = 1  # the real ranks (K): the coordinator's answer to hello
        self.checked = protocol.Checked()  # what this rank checked of the results it received
        self.outstanding: list[int] = []  # collectives issued and not yet waited for
        self.queued = False  # a wait at the end of the running backward pass is queued
        self.compressor: RankCompressor | None = None  # emu run --compress
        self.decompress_us: dict[int, float] = {}  # per compressed collective, its decompression, due at its wait

    def compute_us(self) -> float:
        """The rank's compute since its previous call into the backend returned."""
        return max(0.0, (self.clock() - self.mark) * 1e6)

    def resume(self) -> None:
        """The backend returns to the script: its compute starts again (time in here is emu's)."""
        self.mark = self.clock()

    def call(self, head: dict[str, Any], frames: list[bytes] | None = None,
             compute_us: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """Send a request, with what the rank has checked so far; the reply's checked header and
        its frames. ``compute_us``: measured before the request was built (default: now); the
        caller resumes the clock when it has copied the reply out."""
        head = {"v": protocol.VERSION, "rank": self.rank,
                "compute_us": self.compute_us() if compute_us is None else compute_us,
                "check": self.checked.header(), **head}
        self.sock.send_multipart(protocol.encode(head, frames))
        try:
            reply = self.sock.recv_multipart()
        except zmq.Again:
            raise RuntimeError(f"emu run: no answer from emu's coordinator within {self.timeout_ms / 1000:.0f} s "
                               "(--timeout)") from None
        try:
            return protocol.reply_of(reply), reply[1:]
        except protocol.ProtocolError as exc:
            raise RuntimeError(f"emu run: {exc} (the rank and emu run must be the same emu install)") from None

    def _due(self, ids: list[int]) -> dict[str, float]:
        """The decompression of compressed collectives among ``ids``: compute after their wait."""
        due = sum(self.decompress_us.pop(i, 0.0) for i in ids)
        return {"decompress_us": due} if due else {}

    def wait(self, ids: list[int]) -> None:
        """Tell the coordinator the rank waited here for ``ids``."""
        ids = [i for i in ids if i in self.outstanding]
        if ids:
            compute = self.compute_us()
            self.outstanding = [i for i in self.outstanding if i not in ids]
            self.call({"kind": "wait", "ids": ids, **self._due(ids)}, compute_us=compute)
            self.resume()

    def end_of_backward(self) -> None:
        """Queued into autograd's engine when backward issued collectives: DDP waits for its
        buckets as backward ends (its own callback, queued first, runs first)."""
        self.queued = False
        if self.compressor is not None:  # the next backward's buckets start again at the first
            self.compressor.next_iteration()
        self.wait(list(self.outstanding))

    def step(self, phase: str) -> None:
        compute = self.compute_us()
        now = time.perf_counter()
        extra = {"wall_us": (now - self.wall_mark) * 1e6} if phase == "post" else {}
        extra.update(self._due(self.outstanding))  # whatever backward left unwaited, the optimizer needs now
        self.outstanding = []
        self.call({"kind": "step", "phase": phase, **extra}, compute_us=compute)
        if phase == "post":
            self.wall_mark = time.perf_counter()
            if self.compressor is not None:
                self.compressor.next_iteration()
        self.resume()

    def loss(self, value: float) -> None:
        """Tell the coordinator the script's loss now (``emu.run.report_loss``)."""
        compute = self.compute_us()
        self.call({"kind": "loss", "value": value}, compute_us=compute)
        self.resume()


class EmuWork(dist._Work):
    """A finished collective: its result is in the tensors already. ``wait`` tells the
    coordinator where the rank waited for it (a blocking call waits at once)."""

    def __init__(self, channel: Channel, seq: int, result: list[torch.Tensor]) -> None:
        super().__init__()
        self.channel, self.seq = channel, seq
        self.future = torch.futures.Future()
        self.future.set_result(result)

    def wait(self, timeout: object = None) -> bool:
        self.channel.wait([self.seq])
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future


def _refuse(what: str, instead: str = "") -> Callable[..., EmuWork]:
    """A process-group method that refuses its call, naming it (and what to use instead)."""

    def method(self: object, *args: object) -> EmuWork:
        raise Unsupported(f"emu run: {what} is not supported yet{f' ({instead} is)' if instead else ''}")

    return method


class EmuProcessGroup(dist.ProcessGroup):
    """Rank ``rank`` of a job of ``size`` workers, most of them emulated."""

    def __init__(self, channel: Channel, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.channel = channel

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    # torch keeps a group's name on its backends, and a group written in Python has none: kept here,
    # so that what asks for it (a device mesh of the whole job uses the default group) finds it
    def _set_group_name(self, name: str) -> None:
        self._emu_group_name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_emu_group_name", "")

    def _issue(self, coll: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
               op: object = None, root: int | None = None, compute: float | None = None,
               extra: dict[str, Any] | None = None) -> EmuWork:
        dtypes = {t.dtype for t in inputs}
        if len(dtypes) > 1 or (dtypes and next(iter(dtypes)) not in _DTYPE):
            raise Unsupported(f"emu run: {coll} of {sorted(map(str, dtypes))} is not supported "
                              f"(one of {', '.join(map(str, _DTYPE))})")
        if any(t.device.type != "cpu" for t in inputs):
            raise Unsupported(f"emu run: {coll} of a {inputs[0].device.type} tensor; emu run's real ranks run "
                              "on the CPU (give the script CPU tensors)")
        reduce = None
        if op is not None:
            # opts carry a ReduceOp object, which compares equal to its type but does not hash as it
            reduce = next((name for kind, name in _REDUCE if op == kind), None)
            if reduce is None:
                raise Unsupported(f"emu run: the reduction {getattr(op, 'op', op)} is not supported (sum, avg, max, "
                                  "min, product)")
        ch = self.channel
        if compute is None:
            compute = ch.compute_us()  # before the copies: they are emu's work, not the script's
        arrays = [t.detach().contiguous().numpy() for t in inputs]
        if sum(a.nbytes for a in arrays) > protocol.MAX_FRAME:
            raise Unsupported(f"emu run: a {coll} of {sum(a.nbytes for a in arrays)} bytes, more than 4 GiB")
        seq = ch.seq
        ch.seq += 1
        head = {"kind": "coll", "seq": seq, "coll": coll, "dtype": _DTYPE[next(iter(dtypes))] if dtypes else "uint8",
                "shapes": [list(a.shape) for a in arrays], "op": reduce, "root": root, **(extra or {})}
        head["digest"] = digest(head, arrays, ch.real)
        frames = [a.tobytes() for a in arrays]  # copies: an in-place call's arrays become its result
        answer, reply = ch.call(head, frames, compute_us=compute)
        if len(reply) != len(outputs):
            raise RuntimeError(f"emu run: {coll} came back with {len(reply)} tensors, not {len(outputs)}")
        for out, frame in zip(outputs, reply, strict=True):
            arr = np.frombuffer(frame, dtype=protocol.DTYPES[head["dtype"]]).reshape(tuple(out.shape))
            out.copy_(torch.from_numpy(arr.copy()))
        if coll != "barrier":
            self._check(head, frames, outputs, answer.get("digests"))
        ch.outstanding.append(seq)
        if not ch.queued and torch._C._current_autograd_node() is not None:
            # issued from backward (DDP's buckets): the rank waits for it when backward ends
            ch.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(ch.end_of_backward)
        ch.resume()
        return EmuWork(ch, seq, outputs)

    def _check(self, head: dict[str, Any], frames: list[bytes], outputs: list[torch.Tensor],
               digests: list[dict[str, Any] | None] | None) -> None:
        """Check the result on the tensors the script now holds, and count it (``verdict``);
        ``frames``: the rank's own inputs, as sent."""
        received = [out.detach().numpy() for out in outputs]
        index = self.rank() if head["coll"] == "reduce_scatter" else 0
        own = np.frombuffer(frames[index], protocol.DTYPES[head["dtype"]]).reshape(head["shapes"][index])
        ch = self.channel
        reason, ok = verdict(head, received, own, digests, self.rank(), ch.real, self.size())
        ch.checked = ch.checked.record(reason, sum(int(y.size) for y in received), ok)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> EmuWork:
        _one("allreduce", tensors)
        comp = self.channel.compressor
        # a gradient: issued from backward (DDP's buckets); a loss or a metric reduced elsewhere stays exact
        if comp is not None and tensors[0].dtype in _DTYPE and tensors[0].device.type == "cpu" \
                and torch._C._current_autograd_node() is not None:
            op = next((name for kind, name in _REDUCE if opts.reduceOp == kind), None)
            if comp.takes(np.dtype(protocol.DTYPES[_DTYPE[tensors[0].dtype]]), tensors[0].numel(), op):
                return self._compressed(tensors[0], op == "avg")
        return self._issue("all_reduce", tensors, tensors, opts.reduceOp)

    def _compressed(self, tensor: torch.Tensor, avg: bool) -> EmuWork:
        """A gradient's all_reduce, compressed (``emu.run.compress``): the rank's message crosses
        as the collective it needs, and the tensor ends with the decompressed aggregate. The
        compression is compute before the collective, the decompression after its wait."""
        ch = self.channel
        comp = ch.compressor
        assert comp is not None
        compute = ch.compute_us()
        start = ch.clock()
        x = tensor.detach().reshape(-1).numpy().astype(np.float32)
        message = torch.from_numpy(comp.encode(x, ch.seq).copy())
        extra = {"compress_us": (ch.clock() - start) * 1e6}
        seq = ch.seq
        if comp.gathers:
            outs = [torch.empty_like(message) for _ in range(self.size())]
            work = self._issue("all_gather", [message], outs, compute=compute, extra=extra)
        else:
            outs = [message]
            work = self._issue("all_reduce", [message], outs, dist.ReduceOp.SUM, compute=compute, extra=extra)
        start = ch.clock()
        total = comp.decode([o.numpy() for o in outs], x.size, seq)
        if avg and not comp.comp.vote:  # a vote is a direction, not a sum to average
            total /= self.size()
        tensor.copy_(torch.from_numpy(total.reshape(tuple(tensor.shape))).to(tensor.dtype))
        spent = (ch.clock() - start) * 1e6  # K messages decompressed; a worker decompresses M
        ch.decompress_us[seq] = spent * (self.size() // ch.real if comp.gathers else 1)
        ch.resume()
        return EmuWork(ch, work.seq, [tensor])  # DDP copies the future's tensors into its bucket

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> EmuWork:
        _one("broadcast", tensors)
        return self._issue("broadcast", tensors, tensors, root=int(opts.rootRank))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> EmuWork:
        _one("allgather", inputs)
        if len(outputs) != 1 or len(outputs[0]) != self.size():
            raise Unsupported(f"emu run: allgather needs one list of {self.size()} outputs")
        return self._issue("all_gather", inputs, outputs[0])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> EmuWork:
        parts = list(output.view(self.size(), *input.shape).unbind(0))
        return self._issue("all_gather", [input], parts)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> EmuWork:
        _one("reduce_scatter", outputs)
        if len(inputs) != 1 or len(inputs[0]) != self.size():
            raise Unsupported(f"emu run: reduce_scatter needs one list of {self.size()} inputs")
        return self._issue("reduce_scatter", inputs[0], outputs, opts.reduceOp)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> EmuWork:
        parts = list(input.view(self.size(), *output.shape).unbind(0))
        return self._issue("reduce_scatter", parts, [output], opts.reduceOp)

    def barrier(self, opts: Any) -> EmuWork:
        return self._issue("barrier", [], [])

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any) -> EmuWork:
        """``all_to_all_single``: rows of ``input`` to each worker, rows of ``output`` from each (even
        where the sizes are empty). Worker w of the job holds real rank q = w mod K's data and sends
        worker p what q sends worker p - (w - q) (the matching peer: every offset kept), so the
        script receives from each worker what a job of M copies of the real ranks gives it."""
        m = self.size()
        if input.dim() == 0 or output.dim() == 0 or input.dtype != output.dtype \
                or tuple(input.shape[1:]) != tuple(output.shape[1:]):
            raise Unsupported("emu run: all_to_all_single needs an input and an output of one dtype and row shape")
        ins = [int(x) for x in input_split_sizes] or _even_rows(input.shape[0], m, "input")
        outs = [int(x) for x in output_split_sizes] or _even_rows(output.shape[0], m, "output")
        if len(ins) != m or len(outs) != m or sum(ins) != input.shape[0] or sum(outs) != output.shape[0]:
            raise Unsupported(f"emu run: all_to_all_single's split sizes ({len(ins)} and {len(outs)} of them) must "
                              f"give each of the {m} workers its rows of the {input.shape[0]}-row input and "
                              f"{output.shape[0]}-row output")
        return self._all_to_all(input, list(output.split(outs)), ins, outs)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> EmuWork:
        """``all_to_all`` of lists: tensor j of ``inputs`` to worker j, tensor w of ``outputs`` from
        worker w (each sent as a row of its elements)."""
        m = self.size()
        if len(inputs) != m or len(outputs) != m or len({t.dtype for t in (*inputs, *outputs)}) > 1:
            raise Unsupported(f"emu run: all_to_all needs {m} input and {m} output tensors of one dtype, one per worker")
        joined = torch.cat([t.detach().reshape(-1) for t in inputs]).reshape(-1, 1)
        return self._all_to_all(joined, outputs, [t.numel() for t in inputs], [t.numel() for t in outputs])

    def _all_to_all(self, rows: torch.Tensor, pieces: list[torch.Tensor], ins: list[int], outs: list[int]) -> EmuWork:
        if self.size() > MAX_ALL_TO_ALL:  # its split sizes and pieces' hashes travel in one 64 KiB header
            raise Unsupported(f"emu run: an all_to_all over {self.size()} workers; emu run serves it up to "
                              f"{MAX_ALL_TO_ALL} workers")
        return self._issue("all_to_all", [rows], pieces, extra={"in_splits": ins, "out_splits": outs})

    # what emu run does not serve yet: an error that names the call (docs/run.md, "Limits")
    send = recv = recv_anysource = _refuse("send/recv (point to point)")
    reduce = _refuse("reduce", "all_reduce")
    gather = _refuse("gather", "all_gather")
    scatter = _refuse("scatter")
    allreduce_coalesced = _refuse("coalesced all_reduce (several tensors at once)")
    allgather_coalesced = _refuse("coalesced all_gather (several tensors at once)")


def _even_rows(rows: int, m: int, which: str) -> list[int]:
    if rows % m:
        raise Unsupported(f"emu run: an even all_to_all_single's {which} of {rows} rows does not split over {m} "
                          "workers")
    return [rows // m] * m


def _one(name: str, tensors: list[torch.Tensor]) -> None:
    if len(tensors) != 1:
        raise Unsupported(f"emu run: {name} of {len(tensors)} tensors at once is not supported")


_CHANNEL: list[Channel] = []


def channel() -> Channel | None:
    return _CHANNEL[0] if _CHANNEL else None


def register(address: str, clock: protocol.ComputeClock, timeout_s: float, compress: str | None = None) -> None:
    """Register the ``emu`` backend, which connects to the coordinator at ``address``;
    ``compress``: the compressor of the rank's gradients (``emu run --compress``)."""

    def create(store: object, rank: int, size: int, timeout: object) -> EmuProcessGroup:
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if _CHANNEL or size != world:
            raise Unsupported(f"emu run: process groups other than the job's ({size} of its {world} ranks: "
                              "new_group, a device mesh's dimensions) are not supported yet")
        _CHANNEL.append(Channel(address, rank, clock, timeout_s))
        answer, _ = _CHANNEL[0].call({"kind": "hello", "world_size": size})
        _CHANNEL[0].real = int(answer["real"])
        if compress is not None:
            _CHANNEL[0].compressor = RankCompressor(live_compressor(compress), rank, _CHANNEL[0].real, size)
        _CHANNEL[0].resume()
        return EmuProcessGroup(_CHANNEL[0], rank, size)

    dist.Backend.register_backend(NAME, create, devices=["cpu"])


# -- the digests of the rank's contribution, and the check of its result ------------------------


def digest(head: dict[str, Any], arrays: list[np.ndarray], k: int) -> list[dict[str, Any] | None] | None:
    """The digest of this rank's contribution to the collective ``head`` (``protocol``'s docstring):
    per tensor whose result a real rank checks, its projections (a sum) or its hash (a copy); None
    where no result is checked from digests."""
    coll, op, dt = head["coll"], head["op"], np.dtype(protocol.DTYPES[head["dtype"]])
    if coll == "barrier" or k > MAX_DIGESTS:
        return None
    if coll == "all_to_all":
        if k * len(head["in_splits"]) > protocol.MAX_PIECE_HASHES:
            return None
        return [{"hs": [_hash(p) for p in np.split(arrays[0], np.cumsum(head["in_splits"])[:-1])]}]
    if coll in ("broadcast", "all_gather"):
        return [{"h": _hash(arrays[0])}]
    if op not in ("sum", "avg") or dt.kind == "b" or (op == "avg" and dt.kind != "f"):
        return None
    tensors = arrays[:1] if coll == "all_reduce" else arrays[:k]  # a reduce_scatter: real rank i's input
    return [_sum_digest(a.ravel(), head["seq"], i) for i, a in enumerate(tensors)]


def verdict(head: dict[str, Any], received: list[np.ndarray], own: np.ndarray,
            digests: list[dict[str, Any] | None] | None, rank: int, k: int, m: int) -> tuple[str | None, bool]:
    """Why rank ``rank``'s result of collective ``head`` is not checked (``protocol.UNCHECKED``;
    None: it is), and whether it passed what was checked. ``received``: the result's tensors as
    the script holds them; ``own``: the rank's own input to it (a reduce_scatter's ``rank``-th);
    ``digests``: per real rank, its digest of the tensor the result reduces or copies."""
    coll, op, dt = head["coll"], head["op"], np.dtype(protocol.DTYPES[head["dtype"]])
    if k > MAX_DIGESTS:
        return "ranks", True
    if coll == "all_to_all":  # worker w sends this rank what real rank w mod K sends rank - (w - w mod K)
        if k * m > protocol.MAX_PIECE_HASHES:
            return "a2a_size", True
        hashes = [(d or {}).get("hs") or [] for d in _relayed(head, digests, k)]
        want = [hashes[w % k][(rank - (w - w % k)) % m] if len(hashes[w % k]) == m else None for w in range(m)]
        return None, all(_hash(y) == h for y, h in zip(received, want, strict=True))
    if coll in ("broadcast", "all_gather"):
        hashes = [(d or {}).get("h") for d in _relayed(head, digests, k)]
        sources = [int(head["root"] or 0) % k] if coll == "broadcast" else [w % k for w in range(m)]
        return None, all(_hash(y) == hashes[src] for y, src in zip(received, sources, strict=True))
    if op == "product":
        return "product", True
    if op in ("max", "min"):
        return _bounded(op, received[0], own, k)
    if dt.kind == "b":
        return "bool", True
    if op == "avg" and dt.kind != "f":
        return "int_avg", True
    relayed = _relayed(head, digests, k)
    entries = [d for d in relayed if d is not None]
    if len(entries) < k:
        return "nonfinite", True  # a rank's tensor holds inf or NaN: it sent no projections
    if any(set(d) != ({"p", "a"} if dt.kind == "f" else {"p"}) for d in entries):
        raise RuntimeError(f"emu run: {coll} {head['seq']} came back with digests of another kind than a sum "
                           f"of {dt.name} (the rank and emu run must be the same emu install)")
    index = rank if coll == "reduce_scatter" else 0
    flat = received[0].ravel()
    if dt.kind != "f":
        return None, _wrapped_ok(flat, entries, m // k, head["seq"], index)
    share = m / k if op == "sum" else 1.0 / k  # the weight of each real rank's tensor: its workers'
    return _projected(flat, entries, share, k, head["seq"], index)


def _relayed(head: dict[str, Any], digests: list[dict[str, Any] | None] | None,
             k: int) -> list[dict[str, Any] | None]:
    """The coordinator's relayed digests, one per real rank."""
    if digests is None or len(digests) != k:
        raise RuntimeError(f"emu run: {head['coll']} {head['seq']} came back with {digests and len(digests)} "
                           f"digests of the {k} real ranks' tensors (the rank and emu run must be the same emu "
                           "install)")
    return digests


def _bounded(op: str, got: np.ndarray, own: np.ndarray, k: int) -> tuple[str | None, bool]:
    """A maximum (minimum) of workers that all hold this rank's tensor is that tensor, exactly;
    of several real ranks' it is at least (most) this rank's, which is all a rank can see."""
    if got.dtype.kind == "f" and (np.isnan(got).any() or np.isnan(own).any()):
        return "nonfinite", True
    if k == 1:
        return None, bool(np.array_equal(got, own))
    return "max_min", bool(np.all(got >= own) if op == "max" else np.all(got <= own))


def _vectors(seq: int, index: int, n: int, integer: bool) -> Iterator[tuple[slice, np.ndarray]]:
    """The ``PROJECTIONS`` vectors of tensor ``index`` of collective ``seq``, ``CHUNK`` elements at a
    time, as every rank draws them: uniform on [-1, 1) for floats (continuous, so that no error is
    orthogonal to them but with probability 0), uniform odd 64-bit words for integers."""
    rng = np.random.default_rng([SEED, seq, index])
    for start in range(0, n, CHUNK):
        c = min(CHUNK, n - start)
        if integer:
            # odd words: an odd v is invertible mod 2^bits, so an error in one element always moves
            # the projection (an even v hid a flipped sign bit one time in four)
            v = np.frombuffer(rng.bytes(8 * PROJECTIONS * c), dtype="<u8").reshape(PROJECTIONS, c) | np.uint64(1)
        else:
            v = rng.random((PROJECTIONS, c))
            v *= 2.0
            v -= 1.0
        yield slice(start, start + c), v


def _projections(flat: np.ndarray, seq: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """dot(x, v_j) and dot(|x|, |v_j|), in float64."""
    p, a = np.zeros(PROJECTIONS), np.zeros(PROJECTIONS)
    with np.errstate(all="ignore"):  # inf or NaN: the caller sees it in the projections
        for part, v in _vectors(seq, index, flat.size, False):
            x = flat[part].astype(np.float64)
            p += v @ x
            a += np.abs(v) @ np.abs(x)
    return p, a


def _wrapped(flat: np.ndarray, seq: int, index: int) -> list[int]:
    """dot(x, v_j) mod 2^64, the integers as two's complement words (numpy's uint64 wraps)."""
    acc = [0] * PROJECTIONS
    for part, v in _vectors(seq, index, flat.size, True):
        words = flat[part].astype(np.int64).view(np.uint64)
        acc = [(a + int(s)) % (1 << 64) for a, s in zip(acc, (v * words).sum(axis=1, dtype=np.uint64), strict=True)]
    return acc


def _sum_digest(flat: np.ndarray, seq: int, index: int) -> dict[str, Any] | None:
    if flat.dtype.kind != "f":
        return {"p": _wrapped(flat, seq, index)}
    p, a = _projections(flat, seq, index)
    if not (np.isfinite(p).all() and np.isfinite(a).all()):
        return None  # inf or NaN: no sum of it can be checked
    return {"p": p.tolist(), "a": a.tolist()}


def _wrapped_ok(flat: np.ndarray, digests: list[dict[str, Any]], share: int, seq: int, index: int) -> bool:
    """An integer sum is exact mod 2^bits, wrapped or not: y = share * sum_r x_r (mod 2^bits)
    elementwise, so dot(y, v_j) = share * sum_r dot(x_r, v_j) (mod 2^bits), and 2^bits divides
    2^64, in which the projections are formed."""
    mod = 1 << (8 * flat.dtype.itemsize)
    want = [share * sum(d["p"][j] for d in digests) % mod for j in range(PROJECTIONS)]
    return [g % mod for g in _wrapped(flat, seq, index)] == want


def _projected(flat: np.ndarray, digests: list[dict[str, Any]], share: float, k: int, seq: int,
               index: int) -> tuple[str | None, bool]:
    if not np.isfinite(flat).all():
        return "nonfinite", True  # an overflow to inf
    p, c = _projections(flat, seq, index)
    want = share * np.sum([d["p"] for d in digests], axis=0)
    mags = np.sum([d["a"] for d in digests], axis=0)
    if not (np.isfinite(p).all() and np.isfinite(c).all() and np.isfinite(want).all()):
        return "nonfinite", True
    return None, bool(np.all(np.abs(p - want) <= _bound(flat.dtype, flat.size, k, share, mags, c)))


def _bound(dt: np.dtype, n: int, k: int, share: float, mags: np.ndarray, c: np.ndarray) -> np.ndarray:
    """How far a correct result's projections may lie from ``share`` times the sum of the ranks',
    per projection j, for a result formed as the coordinator forms it: the K tensors summed in
    float64, times M/K (an avg: then divided by M), rounded once to the dtype. Rigorous, so that a
    correct result never fails. With u = 2^-53, u_d = eps/2 the dtype's unit roundoff, tiny its
    smallest subnormal, gamma(i) = i u / (1 - i u) (the bound on the rounding of any sum of i
    terms, in any order), z = share * sum_r x_r exactly, A_i = sum_r |x_r,i|, B_j = sum_r
    dot(|x_r|, |v_j|) (``mags``), C_j = dot(|y|, |v_j|) (``c``) and every |v_j,i| <= 1:

    - the result in float64: at most K + 1 roundings (K - 1 additions, the share, an avg's
      division), so |zhat_i - z_i| <= (K + 1) u share A_i, or below float64's normal range
      2^-1075 each for the two that are not additions (a sum that is subnormal is exact); its
      cast to the dtype rounds to nearest, |y_i - zhat_i| <= u_d |zhat_i| + tiny/2, with |zhat_i|
      within a factor 1 / (1 - u_d) of |y_i|. Projected: (K + 1) u share B_j + u_d C_j + n (tiny/2
      + 2^-1074);
    - the projections: dot(y, v_j) in float64 is off by at most gamma(n) C_j, each rank's dot(x_r,
      v_j) by gamma(n) dot(|x_r|, |v_j|), times the share, and share times their sum by gamma(K)
      share B_j; products that underflow float64 by 2^-1075 each, n (1 + K share) + 1 of them;
    - all of it twice, for the second-order terms, for B and C being formed in float64 themselves,
      and for the bound's own rounding (its absolute terms are at least 2^-1074, so it never
      underflows to 0).

    So an error is found where its projection is larger: a lost, doubled or wrong tensor, a wrong
    share; a single element slightly off in a large tensor passes (docs/run.md).
    """
    u, sub = 2.0 ** -53, 2.0 ** -1074  # float64's unit roundoff and smallest subnormal
    info = np.finfo(dt)
    u_d, tiny = float(info.eps) / 2, float(info.smallest_subnormal)

    def gamma(i: int) -> float:
        return i * u / (1 - i * u)

    relative = (k + 1) * u * share * mags + u_d * c + gamma(n + 1) * (c + share * mags) + gamma(k + 1) * share * mags
    absolute = n * tiny / 2 + (n * (3 + k * share) + 1) * sub / 2
    return 2 * (relative + absolute)


def _hash(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).reshape(-1).view(np.uint8), digest_size=16).hexdigest()
