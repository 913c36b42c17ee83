"""The built-in workloads, written with torch.nn alone (no torchvision).

Each model comes with a synthetic batch of the right shape so that a capture needs
no data set. Sizes are chosen to span what the replay must handle: a small MLP
(a few buckets), a CNN with BatchNorm buffers (DDP broadcasts them every step),
a transformer of about 25M parameters (the realistic size for scale tests) and a
DLRM-style recommender whose embedding tables make most gradient blocks zero (what
sparse aggregation, as OmniReduce does, exploits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

DLRM_DENSE, DLRM_TABLES, DLRM_ROWS = 13, 4, 50_000
DLRM_BAG = 8  # ids per table per sample (multi-hot, summed by the bag)
DLRM_ZIPF = 1.05  # exponent of the ids' popularity: row k (by rank) drawn with weight 1 / k**s


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


class DLRM(nn.Module):
    """A DLRM-style recommender (Naumov et al., 2019), small: 13 dense features through a bottom MLP,
    4 categorical features through embedding tables of 50,000 rows x 32, the pairwise dot products
    of the 5 vectors, and a top MLP to one logit (about 6.4M parameters, 99% of them in the tables).

    The tables are ``nn.EmbeddingBag`` with dense gradients (``sparse=False``): DDP buckets dense
    gradients, and a row no id of the batch looked up gets a zero gradient row, which is where the
    block sparsity of its all_reduces comes from.
    """

    def __init__(self, dense: int = DLRM_DENSE, tables: int = DLRM_TABLES, rows: int = DLRM_ROWS,
                 dim: int = 32) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        vectors = tables + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.stack([x, *(table(ids[:, t]) for t, table in enumerate(self.tables))], dim=1)
        # the pairs' indices are made here, not kept as a buffer: DDP would broadcast a buffer every step
        i, j = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, i, j]
        return self.top(torch.cat((x, dots), dim=1)).squeeze(1)


Inputs = torch.Tensor | tuple[torch.Tensor, ...]
"""A batch's model input: one tensor, or the model's positional arguments."""


@dataclass(frozen=True)
class Workload:
    """A model, how to make a batch for it, and its loss."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], tuple[Inputs, torch.Tensor]]
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


class _ZipfIds:
    """Categorical ids whose popularity follows a Zipf law, as real click logs do: every rank
    draws from the same law, so the hot rows overlap across ranks but not fully. The popularity
    ranks are scattered over each table by a fixed permutation (per table, the same on every
    rank), as hashed ids are, so the hot rows are not packed into a few blocks by construction."""

    def __init__(self) -> None:
        self._weights: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    def __call__(self, batch: int, gen: torch.Generator) -> tuple[Inputs, torch.Tensor]:
        if self._weights is None:
            self._weights = torch.arange(1, DLRM_ROWS + 1, dtype=torch.float64) ** -DLRM_ZIPF
            fixed = torch.Generator().manual_seed(20190531)  # the data set's, not the run's seed
            self._rows = torch.stack([torch.randperm(DLRM_ROWS, generator=fixed) for _ in range(DLRM_TABLES)])
        assert self._rows is not None
        popular = torch.multinomial(self._weights, batch * DLRM_TABLES * DLRM_BAG, replacement=True, generator=gen)
        popular = popular.view(batch, DLRM_TABLES, DLRM_BAG)  # 0 is the most popular id of a table
        ids = torch.stack([self._rows[t][popular[:, t]] for t in range(DLRM_TABLES)], dim=1)
        dense = torch.randn(batch, DLRM_DENSE, generator=gen)
        clicks = torch.randint(0, 2, (batch,), generator=gen).float()
        return (dense, ids), clicks


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload("mlp", MLP, _classify((1024,)), nn.functional.cross_entropy, 32),
    "cnn": Workload("cnn", CNN, _classify((3, 32, 32)), nn.functional.cross_entropy, 32),
    "transformer": Workload("transformer", Transformer, _tokens, _lm_loss, 4),
    "dlrm": Workload("dlrm", DLRM, _ZipfIds(), nn.functional.binary_cross_entropy_with_logits, 128),
}
