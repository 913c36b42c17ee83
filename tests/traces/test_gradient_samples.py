"""A capture's gradient samples in the trace file (``Trace.gradient_samples``): kept on a round trip,
checked on load, each naming a float all_reduce of its rank and iteration."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from emu.errors import TraceError
from emu.traces import load_trace, sample_path, save_trace
from emu.traces.model import GradientSample


def _sampled():
    trace = load_trace(sample_path("mlp"))
    rng = np.random.default_rng(1)
    samples = tuple(GradientSample(p.rank, i, op.id, rng.standard_normal(100).astype("<f4").tobytes())
                    for p in trace.ranks for i, it in enumerate(p.iterations) for op in it.colls
                    if op.kind.value == "all_reduce" and op.dtype.is_float)
    return dataclasses.replace(trace, gradient_samples=samples)


def test_samples_survive_a_round_trip(tmp_path: Path) -> None:
    trace = _sampled()
    save_trace(trace, tmp_path / "t.json.gz")
    back = load_trace(tmp_path / "t.json.gz")
    assert back.gradient_samples == trace.gradient_samples and len(back.gradient_samples) > 0
    assert back.gradient_samples[0].array().dtype == np.float32 and len(back.gradient_samples[0].array()) == 100


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda g: g.update(values="not base64!"), "field 'gradient_samples[0].values' is not base64"),
    (lambda g: g.update(values="AAA="), "holds 2 bytes"),
    (lambda g: g.update(coll=999), "is not a float all_reduce of the trace"),
    (lambda g: g.pop("rank"), "needs rank, iteration and coll"),
])
def test_a_bad_sample_names_itself(tmp_path: Path, mutate, expected: str) -> None:
    save_trace(_sampled(), tmp_path / "t.json.gz")
    doc = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    mutate(doc["gradient_samples"][0])
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=re.escape(expected)):
        load_trace(tmp_path / "bad.json")
