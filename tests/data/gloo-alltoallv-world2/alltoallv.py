"""Uneven all_to_all_single, as a mixture of experts routes tokens, once per step (test data generator).

Rank r sends rows [3 + r, 5 - r] (step s adds s to the first) of 8 floats to ranks 0 and 1, and a
second, even all_to_all of 4 rows a rank; recorded as it ran:

    emu capture --world-size 2 --warmup 1 --iters 2 --keep-kineto DIR -o /tmp/alltoallv.json.gz -- \
        python tests/data/gloo-alltoallv-world2/alltoallv.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
weight = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([weight], lr=0.1)
for step in range(5):
    send = [3 + rank + step, 5 - rank]
    # what each peer sends this rank: peer p's send[rank]
    recv = [(3 + p + step) if rank == 0 else (5 - p) for p in range(world)]
    out = torch.zeros(sum(recv), 8)
    dist.all_to_all_single(out, torch.ones(sum(send), 8), output_split_sizes=recv, input_split_sizes=send)
    dist.all_to_all_single(torch.zeros(8, 8), torch.ones(8, 8))
    weight.grad = torch.ones(4)
    opt.step()
dist.destroy_process_group()
