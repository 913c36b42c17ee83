"""A small mixture-of-experts transformer block with pure expert parallelism on gloo, as users write it.

Every rank holds ``experts / world`` of the experts and its own batch of tokens. A replicated
router scores each token against every expert and keeps its top 2; each expert takes at most
``capacity = ceil(capacity_factor * tokens * 2 / experts)`` tokens of a rank's batch and drops the
rest (they pass through on the residual only), as GShard and Switch routers do. Tokens go to their
experts' ranks and back by ``all_to_all_single`` with the split sizes the router produced, which
differ between ranks and steps (the router is never balanced); the replicated (dense) parameters'
gradients are all-reduced over the ranks. Run it with torchrun, or let emu start the ranks and
profile it:

    torchrun --nproc-per-node 4 emu/capture/scripts/moe_train.py --steps 20
    emu capture --world-size 4 -o moe.json.gz -- python emu/capture/scripts/moe_train.py --steps 20

It knows nothing of emu.
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with its backward (the gradients go back with the splits swapped), as
    DeepSpeed-MoE and fairseq wrap it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_rows: list[int], in_rows: list[int], group) -> torch.Tensor:
        ctx.rows, ctx.group = (out_rows, in_rows), group
        out = x.new_empty(sum(out_rows), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_rows, in_rows, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_rows, in_rows = ctx.rows
        back = grad.new_empty(sum(in_rows), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), in_rows, out_rows, group=ctx.group)
        return back, None, None, None


class Expert(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MoE(nn.Module):
    """Attention-free transformer block: layer norm, a top-2 mixture of experts, a residual."""

    def __init__(self, width: int, experts: int, world: int, rank: int, capacity_factor: float) -> None:
        super().__init__()
        self.experts, self.world, self.capacity_factor = experts, world, capacity_factor
        self.local = experts // world  # experts per rank: rank r holds experts r * local .. (r + 1) * local - 1
        self.norm = nn.LayerNorm(width)
        self.router = nn.Linear(width, experts, bias=False)
        self.mine = nn.ModuleList(Expert(width, 2 * width) for _ in range(self.local))
        self.rank = rank

    def forward(self, x: torch.Tensor, group) -> torch.Tensor:
        tokens, width = x.shape
        h = self.norm(x)
        gates = torch.softmax(self.router(h), dim=-1)
        weight, expert = gates.topk(2, dim=-1)  # (tokens, 2)
        capacity = math.ceil(self.capacity_factor * tokens * 2 / self.experts)
        flat_expert, flat_token = expert.reshape(-1), torch.arange(tokens).repeat_interleave(2)
        flat_weight = weight.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)  # by expert, then token: who is first in line
        flat_expert, flat_token, flat_weight = flat_expert[order], flat_token[order], flat_weight[order]
        place = torch.arange(len(order)) - torch.searchsorted(flat_expert, flat_expert)
        kept = place < capacity  # past an expert's capacity a token is dropped
        flat_expert, flat_token, flat_weight = flat_expert[kept], flat_token[kept], flat_weight[kept]
        dest = flat_expert // self.local
        send_splits = torch.bincount(dest, minlength=self.world)
        recv_splits = torch.empty_like(send_splits)
        dist.all_to_all_single(recv_splits, send_splits, group=group)  # how many tokens each peer sends
        send_rows, recv_rows = send_splits.tolist(), recv_splits.tolist()
        payload = torch.cat([h[flat_token], (flat_expert % self.local).unsqueeze(1).float()], dim=1)
        got = AllToAll.apply(payload, recv_rows, send_rows, group)
        out = torch.zeros(len(got), width)
        which = got[:, -1].long()
        for e, expert_net in enumerate(self.mine):
            rows = (which == e).nonzero(as_tuple=True)[0]
            if len(rows):
                out = out.index_add(0, rows, expert_net(got[rows, :-1]))
        back = AllToAll.apply(out, send_rows, recv_rows, group)
        mixed = torch.zeros(tokens, width).index_add(0, flat_token, back * flat_weight.unsqueeze(1))
        return x + mixed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256, help="tokens a rank")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.experts % world:
        raise SystemExit(f"--experts {args.experts} does not divide over the world size {world}")
    group = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))["ep"].get_group()
    torch.manual_seed(args.seed)  # the same router, norm and head on every rank
    model = MoE(args.width, args.experts, world, rank, args.capacity_factor)
    head = nn.Linear(args.width, 10)
    dense = [*model.norm.parameters(), *model.router.parameters(), *head.parameters()]
    torch.manual_seed(args.seed + 1 + rank)  # each rank's own experts
    for layer in model.mine.modules():
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed + 100 + rank)
    centre = torch.randn(args.width, generator=torch.Generator().manual_seed(args.seed))  # a skew the router learns
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=gen) + centre
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(model(x, group)), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in dense])  # the replicated parameters' gradients
        dist.all_reduce(flat, group=group)
        at = 0
        for p in dense:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p) / world)
            at += p.numel()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
