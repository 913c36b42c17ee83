"""All-reduces at the edges of what gloo traces look like (test data generator).

``scalar``: a dense 0-dim all_reduce (a loss average) beside a 1000-element one; a 0-dim tensor's
profiled strides are empty, as a sparse tensor's are. ``sparse_tiny``: a sparse COO tensor with one
row on rank 0 and none on rank 1, whose summed result gloo coalesces without narrowing it.
Two profiled steps each, 2 ranks on 127.0.0.1:

    python tests/data/gloo-edge-all-reduces-world2/edge_all_reduces.py scalar OUTDIR
    python tests/data/gloo-edge-all-reduces-world2/edge_all_reduces.py sparse_tiny OUTDIR
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank: int, world: int, mode: str, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29611" if mode == "scalar" else "29622"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)

    def ready(p: torch.profiler.profile) -> None:
        p.export_chrome_trace(f"{out}/rank{rank}.json")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=ready) as p:
        for _ in range(3):
            dist.all_reduce(torch.randn(1000))
            if mode == "scalar":
                dist.all_reduce(torch.tensor(1.5 + rank))
            else:
                idx = torch.tensor([[3]]) if rank == 0 else torch.zeros((1, 0), dtype=torch.long)
                dist.all_reduce(torch.sparse_coo_tensor(idx, torch.ones((idx.shape[1], 4)), (100, 4)))
            p.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(sys.argv[2], exist_ok=True)
    mp.spawn(main, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
