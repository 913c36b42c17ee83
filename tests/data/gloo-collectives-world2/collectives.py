"""Every collective emu reads from gloo traces, once per optimizer step (test data generator).

    emu capture --world-size 2 --warmup 1 --iters 2 --keep-kineto DIR -o /tmp/collectives.json.gz -- \
        python tests/data/gloo-collectives-world2/collectives.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
weight = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([weight], lr=0.1)
for _ in range(5):
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    dist.broadcast(t, src=1)
    dist.all_gather([torch.zeros(1000) for _ in range(world)], t)
    dist.all_gather_into_tensor(torch.zeros(1000 * world), t)
    dist.reduce_scatter_tensor(torch.zeros(500), torch.ones(500 * world))
    dist.all_to_all_single(torch.zeros(1000), torch.ones(1000))
    dist.barrier()
    if rank == 0:
        dist.send(torch.ones(77, dtype=torch.float16), 1)
    else:
        dist.recv(torch.zeros(77, dtype=torch.float16), 0)
    dist.all_reduce(torch.ones(10, dtype=torch.bfloat16))
    dist.all_reduce(torch.ones(10, dtype=torch.int64))
    weight.grad = torch.ones(4)
    opt.step()
dist.destroy_process_group()
