"""An embedding with sparse gradients under DDP on gloo (test data generator).

DDP all-reduces the embedding's sparse gradient on its own, as an all_reduce of a sparse COO
tensor (gloo's ``sparse_all_reduce``: each rank's rows and indices are all-gathered and summed),
and the dense layers' bucket as usual. Each rank looks up 64 rows of 20,000 per step, from its own
seeded draw, so the ranks' rows overlap a little.

    emu capture --world-size 2 --warmup 1 --iters 2 --keep-kineto DIR -o /tmp/sparse.json.gz -- \\
        python tests/data/gloo-sparse-embedding-world2/sparse_embedding.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(20_000, 32, sparse=True), torch.nn.Flatten(),
                            torch.nn.Linear(64 * 32, 16))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
draw = torch.Generator().manual_seed(1 + rank)
for _ in range(5):
    rows = torch.randint(0, 20_000, (1, 64), generator=draw)
    rows[0, :8] = torch.arange(8)  # a few rows every rank touches
    opt.zero_grad()
    ddp(rows).square().sum().backward()
    opt.step()
dist.destroy_process_group()
