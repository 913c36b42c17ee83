"""A data-parallel script with a task it can learn, and its loss reported to emu run.

The labels come from a fixed random teacher network, so the loss falls (examples/ddp_train.py
trains on random labels, whose loss never does). Before every optimizer step, and after the
last, each rank reports the loss of the parameters it holds on a held-out batch with
``emu.run.report_loss``, which does nothing outside emu run: the script runs under torchrun as
it is.

    torchrun --nproc-per-node 2 examples/ddp_learn.py --steps 40
    emu run --workers 8 --compress topk:0.01 -- python examples/ddp_learn.py --steps 40
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from emu.run import report_loss
except ImportError:  # emu is not installed: nothing to report to
    def report_loss(loss: float) -> None:
        pass


def teacher_labels(x: torch.Tensor, teacher: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same parameters and teacher on every rank, and in every run
    teacher = (torch.randn(64, 64) / 8.0, torch.randn(64, 10))
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    ddp = DDP(model, bucket_cap_mb=1)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    held_out = torch.randn(1024, 64, generator=torch.Generator().manual_seed(12345))
    held_labels = teacher_labels(held_out, teacher)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps + 1):
        with torch.no_grad():
            loss = nn.functional.cross_entropy(model(held_out), held_labels).item()
        report_loss(loss)  # the loss after `step` optimizer steps
        if rank == 0 and step % 10 == 0:
            print(f"step {step} held-out loss {loss:.3f}", flush=True)
        if step == args.steps:
            break
        x = torch.randn(args.batch_size, 64, generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), teacher_labels(x, teacher)).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
