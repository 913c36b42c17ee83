"""What a real rank of ``emu run`` does around the unmodified script (``python -m emu.run``)."""

from __future__ import annotations

import functools

import torch.distributed as dist
import zmq
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from emu.capture.inject import _run_target
from emu.run import backend
from emu.run.protocol import ComputeClock


def run(address: str, clock: ComputeClock, timeout_s: float, target: list[str], compress: str | None = None) -> int:
    """Run ``target`` with emu's backend in place of the one it asks for (its gradients
    compressed by ``compress``, where given); its exit status."""
    backend.register(address, clock, timeout_s, compress)
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: object, **kwargs: object) -> object:
        # whatever the script asks for (gloo, nccl, "cpu:gloo,cuda:nccl" or nothing), emu's backend
        if args:
            args = (backend.NAME, *args[1:])
        else:
            kwargs["backend"] = backend.NAME
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    try:  # init_device_mesh calls its own imported name: without this it would start gloo and hang
        import torch.distributed.device_mesh as device_mesh

        if hasattr(device_mesh, "init_process_group"):
            device_mesh.init_process_group = init_process_group  # type: ignore[attr-defined]
    except ImportError:
        pass
    followed: list[int] = []

    def on(phase: str, optimizer: object, *_: object) -> None:
        if not followed:
            followed.append(id(optimizer))
        ch = backend.channel()
        if followed[0] == id(optimizer) and ch is not None:
            ch.step(phase)

    pre = register_optimizer_step_pre_hook(functools.partial(on, "pre"))
    post = register_optimizer_step_post_hook(functools.partial(on, "post"))
    try:
        code = _run_target(target)
    finally:
        pre.remove()
        post.remove()
        ch = backend.channel()
        if ch is not None:
            try:
                ch.call({"kind": "done"})
            except (zmq.ZMQError, RuntimeError):  # the channel broke with the script: its error stands
                pass
    return code
