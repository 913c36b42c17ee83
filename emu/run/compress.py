"""Gradient compression on a real rank of ``emu run --compress`` (docs/compression.md, "emu run").

The rank compresses its own gradient for real, with the compressors replay uses
(``emu.emulator.compression.compressors``), and what crosses emu's fabric is the compressor's
output: the backend (``emu.run.backend``) turns a float all_reduce into the collective that
output needs, through the coordinator and the recorded trace alike, so that the replay moves and
verifies those bytes:

- an all_gather of the packed bytes (top-k, the quantizers, the sign methods): every worker
  receives every worker's message and decompresses it;
- an all_reduce of the compressed form where it can be summed: fp16's float16 values, randomk's
  values at indices drawn from a seed every rank shares (the collective's number).

Only all_reduces issued from backward are compressed (DDP's buckets): a loss or a metric the
script reduces elsewhere stays exact. A float64 gradient is compressed as float32 (what the
compressors take) and its aggregate cast back. The aggregate the script gets is the
decompressed one: the workers' decompressed messages combined (a sum; signsgd's majority vote),
divided by M for an avg (not a vote: it stays +1 or -1). Error feedback is per rank and tensor
(its place among the compressed all_reduces of the backward pass, and its length), as GRACE's
residual memory. A fake worker mirrors its real rank's tensor (docs/run.md), so it
mirrors its message too: worker ``w`` sends real rank ``w mod K``'s bytes, and the K distinct
messages are what a rank decompresses (each stands for ``M / K`` workers).

Refused here, with what to do instead: PowerSGD (it needs the bucket's parameter shapes, which a
process group never sees: DDP's own PowerSGD hook runs on emu's backend as it is) and DGC (its
message length differs per worker; an all_gather moves equal lengths).
"""

from __future__ import annotations

import numpy as np

from emu.emulator.compression.compressors import (
    Aggregation,
    Compressor,
    ErrorFeedback,
    message_seed,
    mirrored,
    parse_compress,
)
from emu.errors import ConfigError

SEED = 0x636F6D70  # stochastic rounding and randomk's indices: from (SEED, the collective's number)
REFUSED = {
    "powersgd": "PowerSGD needs the bucket's parameter shapes, which emu's backend never sees; register "
                "DDP's own hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook) in the script: its "
                "all_reduces run on emu's backend as they are",
    "dgc": "DGC's message length differs per worker and an all_gather moves equal lengths; use topk",
}


def live_compressor(text: str) -> Compressor:
    """``--compress NAME[:PARAM]`` for emu run (ConfigError naming the option where refused)."""
    if text.strip().lower().startswith("adaptive"):
        raise ConfigError(f"emu run --compress {text!r}: adaptive compression is emu replay's; give emu run one "
                          "compressor, e.g. --compress topk:0.01")
    comp = parse_compress(text)
    if comp.name in REFUSED:
        raise ConfigError(f"emu run --compress {comp.label}: {REFUSED[comp.name]}")
    return comp


class RankCompressor:
    """One real rank's compressor and error-feedback memory."""

    def __init__(self, comp: Compressor, rank: int, real: int, workers: int) -> None:
        self.comp, self.rank, self.real, self.workers = comp, rank, real, workers
        self.memory = ErrorFeedback(comp)
        self.position = 0  # compressed all_reduces so far in this iteration

    @property
    def gathers(self) -> bool:
        """The messages are all-gathered (else all-reduced)."""
        return self.comp.aggregation == Aggregation.ALL_GATHER

    def takes(self, dtype: np.dtype, count: int, op: str | None) -> bool:
        """A float all_reduce that sums or averages: a gradient (the rule replay applies)."""
        return op in ("sum", "avg") and self.comp.takes(dtype.kind == "f", dtype.itemsize, count)

    def next_iteration(self) -> None:
        """A new backward pass (or optimizer step): its first compressed all_reduce is position 0."""
        self.position = 0

    def encode(self, x: np.ndarray, seq: int) -> np.ndarray:
        """The rank's message for float32 gradient ``x``: uint8 bytes to all-gather, or the values
        to all-reduce (float16 for fp16, float32 for randomk)."""
        data = self.memory.message(self.rank, (self.position, x.size), x, message_seed(self.comp, SEED, seq, self.rank))
        self.position += 1
        return data if self.gathers else data.view(np.dtype(self.comp.values).newbyteorder("<"))

    def decode(self, received: list[np.ndarray], n: int, seq: int) -> np.ndarray:
        """The aggregate over the M workers (float64) of what their messages decompress to: their
        sum, or signsgd's vote.
        ``received``: the all_gather's M outputs (worker ``w`` < K holds real rank ``w``'s message,
        each standing for ``M / K`` workers), or the all_reduce's one result."""
        if not self.gathers:
            raw = np.ascontiguousarray(received[0]).view(np.uint8)
            return self.comp.decompress(raw, n, message_seed(self.comp, SEED, seq, 0)).astype(np.float64)
        parts = [self.comp.decompress(np.asarray(received[w]).view(np.uint8), n, message_seed(self.comp, SEED, seq, w))
                 for w in range(self.real)]
        return mirrored(self.comp, parts, self.workers // self.real)
