"""A script whose collectives carry tensors a test can predict: each step, rank r all_reduces
arange(N) * (r + 1) + step and broadcasts a tensor of its rank from rank 1, then steps an
optimizer (which is where emu run cuts iterations). It knows nothing of emu."""

import os

import torch
import torch.distributed as dist

N = int(os.environ.get("KNOWN_N", "3000"))
STEPS = int(os.environ.get("KNOWN_STEPS", "4"))

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(STEPS):
    t = torch.arange(N, dtype=torch.float32) * (rank + 1) + step
    dist.all_reduce(t)
    b = torch.full((50,), float(rank), dtype=torch.float64)
    dist.broadcast(b, src=1)
    w.grad = t[:4] / dist.get_world_size()
    opt.step()
dist.destroy_process_group()
