"""A two-stage pipeline inside data parallel (pp x dp over a DeviceMesh) on gloo, as users write it.

The model's blocks are split into two stages (``torch.distributed.pipelining``, GPipe's schedule
of microbatches): stage 0 sends each microbatch's activations to stage 1 and receives their
gradients back (send/recv between the ``pp`` ranks), and after the schedule each stage's
gradients, flattened into one bucket, are all-reduced over the ``dp`` ranks that hold the same
stage (DDP does not follow a schedule's several backward passes). Run it with torchrun, or let emu start the ranks
and profile it:

    torchrun --nproc-per-node 4 examples/pp_train.py --steps 20
    emu capture --world-size 4 -o pp.json.gz -- python examples/pp_train.py --steps 20

It knows nothing of emu.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

STAGES = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % STAGES:
        raise SystemExit(f"the world size {world} must divide by the {STAGES} stages")
    mesh = init_device_mesh("cpu", (STAGES, world // STAGES), mesh_dim_names=("pp", "dp"))
    stage_index = mesh["pp"].get_local_rank()
    torch.manual_seed(args.seed)
    blocks = [nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)]
    per = args.blocks // STAGES
    layers = blocks[stage_index * per:(stage_index + 1) * per]
    if stage_index == STAGES - 1:
        layers.append(nn.Linear(args.width, 10))
    stage_module = nn.Sequential(*layers)
    dp = mesh["dp"].get_group()
    stage = PipelineStage(stage_module, stage_index, STAGES, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, args.microbatches, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed + 1 + mesh["dp"].get_local_rank())
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=gen)
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        opt.zero_grad()
        if stage_index == 0:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            if mesh["dp"].get_local_rank() == 0 and step % 10 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.3f}", flush=True)
        grads = [p.grad for p in stage_module.parameters()]
        bucket = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(bucket, group=dp)
        bucket /= dist.get_world_size(dp)
        for g, b in zip(grads, torch.split(bucket, [g.numel() for g in grads]), strict=True):
            g.copy_(b.view_as(g))
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
