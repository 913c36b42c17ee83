"""A plain data-parallel training script, as users write them: DDP on gloo, torchrun's environment.

Run it with torchrun, or let emu start the ranks and profile it:

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 20
    emu capture --world-size 2 -o ddp.json.gz -- python examples/ddp_train.py --steps 20

``--comm-hook fp16`` (or bf16) registers PyTorch's compression hook, as users do to halve the
gradients' bytes. It knows nothing of emu.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--comm-hook", choices=["none", "fp16", "bf16"], default="none")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )
    ddp = DDP(model, bucket_cap_mb=2)
    if args.comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.fp16_compress_hook if args.comm_hook == "fp16" else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 512, generator=gen)
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
