"""Fully sharded data parallel training (FSDP2's ``fully_shard``) on gloo, as users write it.

Every block's parameters are sharded over the ranks: each block's forward gathers them
(all_gather), its backward gathers them again and reduce-scatters the gradients. Run it with
torchrun, or let emu start the ranks and profile it:

    torchrun --nproc-per-node 4 examples/fsdp_train.py --steps 20
    emu capture --world-size 4 -o fsdp.json.gz -- python examples/fsdp_train.py --steps 20

It knows nothing of emu.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    torch.manual_seed(args.seed)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)],
                          nn.Linear(args.width, 10))
    for block in model[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed + 1 + dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=gen)
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
