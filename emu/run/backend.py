"""emu's torch.distributed backend, in a real rank's process (docs/run.md).

A process group written in Python (torch accepts them: its own tests define one) and registered
as the ``emu`` backend. Every collective goes to emu run's coordinator with the rank's tensors and
the compute the rank did since its previous call into the backend returned; the answer, what a job
of M workers gives, is copied into the rank's tensors, so the returned work is complete. Waits
and the optimizer's steps are reported too, so the coordinator can record the rank's program.

Compute is measured on the calling thread's CPU clock by default (``thread``): the real ranks
and emu share the machine's cores, and CPU time is what the rank's work costs whatever else
runs; ``wall`` measures wall time instead (for work spread over threads, or on a quiet machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import zmq

from emu.run import protocol

NAME = "emu"
_REDUCE = ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
           (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.PRODUCT, "product"))
_DTYPE = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.int64: "int64",
          torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


class Unsupported(RuntimeError):
    """A call emu run cannot serve (the script sees it as the backend's error)."""


class Channel:
    """The rank's connection to the coordinator, and its compute clock."""

    def __init__(self, address: str, rank: int, clock: str, timeout_s: float) -> None:
        self.rank = rank
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.timeout_ms = int(min(timeout_s, 30 * 86400) * 1000)
        self.sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        self.sock.connect(address)
        self.clock = time.thread_time if clock == "thread" else time.perf_counter
        self.mark = self.clock()
        self.wall_mark = time.perf_counter()
        self.seq = 0
        self.outstanding: list[int] = []  # collectives issued and not yet waited for
        self.queued = False  # a wait at the end of the running backward pass is queued

    def compute_us(self) -> float:
        """The rank's compute since its previous call into the backend returned."""
        return max(0.0, (self.clock() - self.mark) * 1e6)

    def resume(self) -> None:
        """The backend returns to the script: its compute starts again (time in here is emu's)."""
        self.mark = self.clock()

    def call(self, head: dict[str, Any], frames: list[bytes] | None = None,
             compute_us: float | None = None) -> list[bytes]:
        """Send a request; the reply's frames. ``compute_us``: measured before the request was
        built (default: now); the caller resumes the clock when it has copied the reply out."""
        head = {"v": protocol.VERSION, "rank": self.rank,
                "compute_us": self.compute_us() if compute_us is None else compute_us, **head}
        self.sock.send_multipart(protocol.encode(head, frames))
        try:
            reply = self.sock.recv_multipart()
        except zmq.Again:
            raise RuntimeError(f"emu run: no answer from emu's coordinator within {self.timeout_ms / 1000:.0f} s "
                               "(--timeout)") from None
        return reply[1:]

    def wait(self, ids: list[int]) -> None:
        """Tell the coordinator the rank waited here for ``ids``."""
        ids = [i for i in ids if i in self.outstanding]
        if ids:
            compute = self.compute_us()
            self.outstanding = [i for i in self.outstanding if i not in ids]
            self.call({"kind": "wait", "ids": ids}, compute_us=compute)
            self.resume()

    def end_of_backward(self) -> None:
        """Queued into autograd's engine when backward issued collectives: DDP waits for its
        buckets as backward ends (its own callback, queued first, runs first)."""
        self.queued = False
        self.wait(list(self.outstanding))

    def step(self, phase: str) -> None:
        compute = self.compute_us()
        now = time.perf_counter()
        extra = {"wall_us": (now - self.wall_mark) * 1e6} if phase == "post" else {}
        if phase == "pre":  # whatever backward left unwaited, the optimizer needs now
            self.outstanding = []
        self.call({"kind": "step", "phase": phase, **extra}, compute_us=compute)
        if phase == "post":
            self.wall_mark = time.perf_counter()
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

    def _issue(self, coll: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
               op: object = None, root: int | None = None) -> EmuWork:
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
        compute = ch.compute_us()  # before the copies: they are emu's work, not the script's
        arrays = [t.detach().contiguous().numpy() for t in inputs]
        if sum(a.nbytes for a in arrays) > protocol.MAX_FRAME:
            raise Unsupported(f"emu run: a {coll} of {sum(a.nbytes for a in arrays)} bytes, more than 4 GiB")
        seq = ch.seq
        ch.seq += 1
        head = {"kind": "coll", "seq": seq, "coll": coll, "dtype": _DTYPE[next(iter(dtypes))] if dtypes else "uint8",
                "shapes": [list(a.shape) for a in arrays], "op": reduce, "root": root}
        reply = ch.call(head, [a.tobytes() for a in arrays], compute_us=compute)
        if len(reply) != len(outputs):
            raise RuntimeError(f"emu run: {coll} came back with {len(reply)} tensors, not {len(outputs)}")
        for out, frame in zip(outputs, reply, strict=True):
            arr = np.frombuffer(frame, dtype=protocol.DTYPES[head["dtype"]]).reshape(tuple(out.shape))
            out.copy_(torch.from_numpy(arr.copy()))
        ch.outstanding.append(seq)
        if not ch.queued and torch._C._current_autograd_node() is not None:
            # issued from backward (DDP's buckets): the rank waits for it when backward ends
            ch.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(ch.end_of_backward)
        ch.resume()
        return EmuWork(ch, seq, outputs)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> EmuWork:
        _one("allreduce", tensors)
        return self._issue("all_reduce", tensors, tensors, opts.reduceOp)

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

    # what emu run does not serve yet: an error that names the call (docs/run.md, "Limits")
    send = recv = recv_anysource = _refuse("send/recv (point to point)")
    alltoall = alltoall_base = _refuse("all_to_all")
    reduce = _refuse("reduce", "all_reduce")
    gather = _refuse("gather", "all_gather")
    scatter = _refuse("scatter")
    allreduce_coalesced = _refuse("coalesced all_reduce (several tensors at once)")
    allgather_coalesced = _refuse("coalesced all_gather (several tensors at once)")


def _one(name: str, tensors: list[torch.Tensor]) -> None:
    if len(tensors) != 1:
        raise Unsupported(f"emu run: {name} of {len(tensors)} tensors at once is not supported")


_CHANNEL: list[Channel] = []


def channel() -> Channel | None:
    return _CHANNEL[0] if _CHANNEL else None


def register(address: str, clock: str, timeout_s: float) -> None:
    """Register the ``emu`` backend, which connects to the coordinator at ``address``."""

    def create(store: object, rank: int, size: int, timeout: object) -> EmuProcessGroup:
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if _CHANNEL or size != world:
            raise Unsupported(f"emu run: process groups other than the job's ({size} of its {world} ranks: "
                              "new_group, a device mesh's dimensions) are not supported yet")
        _CHANNEL.append(Channel(address, rank, clock, timeout_s))
        _CHANNEL[0].call({"kind": "hello", "world_size": size})
        _CHANNEL[0].resume()
        return EmuProcessGroup(_CHANNEL[0], rank, size)

    dist.Backend.register_backend(NAME, create, devices=["cpu"])
