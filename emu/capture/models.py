"""The built-in workloads, written with torch.nn alone (no torchvision).

Each model comes with a synthetic batch of the right shape so that a capture needs
no data set. Sizes are chosen to span what the replay must handle: a small MLP
(a few buckets), a CNN with BatchNorm buffers (DDP broadcasts them every step)
and a transformer of about 25M parameters (the realistic size for scale tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, inputs: int = 1024, hidden: int = 2048, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """A small VGG-style network for 3x32x32 images."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), block(128, 256))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(256 * 2 * 2, 512), nn.ReLU(), nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Transformer(nn.Module):
    """A decoder-only language model: 6 layers, d_model 512, vocabulary 6144 (about 25M)."""

    def __init__(self, vocab: int = 6144, d_model: int = 512, layers: int = 6, heads: int = 8,
                 ff: int = 2048, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        x = self.blocks(x, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.out(self.norm(x))


@dataclass(frozen=True)
class Workload:
    """A model, how to make a batch for it, and its loss."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    default_batch_size: int


def _classify(shape: tuple[int, ...]) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    def make(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    return make


def _tokens(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    seq = torch.randint(0, 6144, (batch, 65), generator=gen)
    return seq[:, :-1], seq[:, 1:]


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload("mlp", MLP, _classify((1024,)), nn.functional.cross_entropy, 32),
    "cnn": Workload("cnn", CNN, _classify((3, 32, 32)), nn.functional.cross_entropy, 32),
    "transformer": Workload("transformer", Transformer, _tokens, _lm_loss, 4),
}
