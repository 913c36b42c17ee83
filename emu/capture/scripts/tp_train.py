"""Tensor parallel inside data parallel (dp x tp over a DeviceMesh) on gloo, as users write it.

Each MLP block is split over the ``tp`` ranks (the first linear column-wise, the second
row-wise, so a block's forward ends with an all_reduce of its activations and its backward
with one of their gradients), and DDP all-reduces the gradients over the ``dp`` ranks that hold
the same shards. Run it with torchrun, or let emu start the ranks and profile it:

    torchrun --nproc-per-node 4 examples/tp_train.py --tp 2 --steps 20
    emu capture --world-size 4 -o tp.json.gz -- python examples/tp_train.py --tp 2 --steps 20

It knows nothing of emu.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.act = nn.ReLU()
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(args.seed)  # the same weights on every rank before they are split
    model = nn.Sequential(*[Block(args.width, 4 * args.width) for _ in range(args.blocks)], nn.Linear(args.width, 10))
    for block in model[:-1]:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    _pre_dp_module_transform(model)  # DDP over the tensor-parallel shards (PyTorch's 2-D recipe)
    ddp = DDP(model, process_group=mesh["dp"].get_group(), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    # one batch per data-parallel replica: the tensor-parallel ranks of a replica see the same data
    gen = torch.Generator().manual_seed(args.seed + 1 + mesh["dp"].get_local_rank())
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=gen)
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
