"""Small real traces captured on the build machine, shipped for demos and tests.

``samples/README.md`` records the command that made each one.
"""

from __future__ import annotations

from pathlib import Path

from emu.errors import TraceError

_DIR = Path(__file__).parent / "samples"
# The built-in data-parallel workloads (emu capture --model, emu validate --models), each with its
# sample trace
MODELS = ("mlp", "cnn", "transformer", "dlrm")
# The built-in sharded and split ones (emu capture --model: the scripts of emu/capture/scripts/, at
# world size 4), each with its sample trace too (docs/parallelism.md)
PARALLEL_MODELS = ("fsdp", "tp", "pp", "moe")
BUILT_IN = MODELS + PARALLEL_MODELS
SAMPLES = BUILT_IN


def sample_path(name: str) -> Path:
    """The path of a shipped sample trace by model name."""
    if name not in SAMPLES:
        raise TraceError(f"no sample trace named {name!r}; the samples are: {', '.join(SAMPLES)}")
    return _DIR / f"{name}.json.gz"
