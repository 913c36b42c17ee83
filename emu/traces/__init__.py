"""The emu trace: data model, files, validation, summaries and shipped samples.

This package imports nothing else of emu (but the leaf ``emu.errors``): every
other part builds on it.
"""

from emu.traces.io import LOADERS, SCHEMA_VERSION, load_trace, save_trace, trace_digest, trace_sha256, trace_to_dict
from emu.traces.model import (
    Coll,
    CollKind,
    Compute,
    Dtype,
    Iteration,
    Op,
    RankProgram,
    Source,
    Sparsity,
    Trace,
    TraceMeta,
    Wait,
)
from emu.traces.samples import MODELS, SAMPLES, sample_path
from emu.traces.summary import CollStats, TraceSummary, iteration_comm_us, summarize
from emu.traces.validate import validate_trace

__all__ = [
    "LOADERS", "MODELS", "SCHEMA_VERSION", "SAMPLES", "Coll", "CollKind", "CollStats", "Compute", "Dtype",
    "Iteration", "Op", "RankProgram", "Source", "Sparsity", "Trace", "TraceMeta", "TraceSummary", "Wait",
    "iteration_comm_us", "load_trace", "sample_path", "save_trace", "summarize", "trace_digest", "trace_sha256",
    "trace_to_dict",
    "validate_trace",
]
