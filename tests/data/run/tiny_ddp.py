"""A tiny DDP script for emu run's tests: trains a few steps on rank-seeded data and, where
EMU_TEST_OUT is set, writes each rank's final parameters there (rank<R>.npy), so a test can
compare them with a real gloo run's. It knows nothing of emu."""

import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("TINY_STEPS", "5"))

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
ddp = DDP(model, bucket_cap_mb=0.01)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(100 + rank)
for _ in range(STEPS):
    x = torch.randn(16, 32, generator=gen)
    y = torch.randint(0, 4, (16,), generator=gen)
    opt.zero_grad()
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)  # a plain blocking all_reduce, outside DDP
out = os.environ.get("EMU_TEST_OUT")
if out:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    np.save(os.path.join(out, f"rank{rank}.npy"), np.append(flat, total.numpy()))
dist.destroy_process_group()
