"""Fuzzing the trace loader: whatever the file holds, a correct trace or one clear TraceError.

Inputs are the shipped samples mutated (fields deleted, retyped, scaled, nested,
lists shortened or doubled, integers of thousands of digits, files truncated or
corrupted byte by byte) and documents generated from the format's grammar with
random values. The only allowed outcomes: a trace that validates and survives a
save and load unchanged (to the file's nanosecond), or a TraceError whose message
is one line that starts with the file's path and names a field or what is wrong
with the file. Any other exception fails the test.

The generic mutation machinery (``json_values``, ``mutate_at``, ``serialize``)
is shared with tests/capture/test_fuzz_kineto.py.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.errors import TraceError
from emu.traces import SAMPLES, load_trace, sample_path, save_trace, trace_to_dict, validate_trace

# Deterministic in the default suite (the same inputs on every run, so a failure
# reproduces); the slow variants draw fresh ones each run.
FAST = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BIG_INT = "__emu_fuzz_big_int__"  # a placeholder json.dumps cannot write as digits (past 4300 it refuses)
INTERESTING: list[Any] = [
    0, -1, 1, 2, 3, 7, 2**31, 2**40, 2**40 + 1, 2**53 + 1, 2**63, 2**64, 10**39, -(10**39), 0.5, -0.0, 1e-9,
    86_400e6, 86_400e6 + 1, 1e308, -1e308, math.nan, math.inf, -math.inf, "", "x", "float32", "bfloat16",
    "all_reduce", "all_gather", "send", "coll", "wait", "compute", "Float", "allreduce", "[0, 1]", "[",
    "emu-trace", True, False, None, [], {}, [[]], [[1, 2]], [[-1]], [0, 0], ["a"], {"a": 1},
]
scalars = (st.sampled_from(INTERESTING) | st.none() | st.booleans() | st.integers()
           | st.floats() | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
KINDS = ("delete", "replace", "replace", "nest", "scale", "retype", "duplicate", "empty", "big_int")


def nodes(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) of a document, the root's children first."""
    out, todo = [], [doc]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            out.append((node, key))
            if isinstance(value, (dict, list)):
                todo.append(value)
    return out


def mutate_at(draw: st.DrawFn, parent: Any, key: Any) -> None:
    """Apply one drawn mutation to ``parent[key]`` in place."""
    kind = draw(st.sampled_from(KINDS))
    value = parent[key]
    if kind == "delete":
        del parent[key]
    elif kind == "replace":
        parent[key] = draw(json_values)
    elif kind == "nest":
        depth = draw(st.sampled_from([1, 2, 3, 60, 70, 200]))
        for _ in range(depth):
            value = [value] if draw(st.booleans()) else {"x": value}
        parent[key] = value
    elif kind == "scale":
        factor = draw(st.sampled_from([-1, 1000, 10**6, 10**9, 10**12, 2**40, 0.001]))
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        parent[key] = value * factor if numeric else draw(json_values)
    elif kind == "retype":
        parent[key] = draw(st.sampled_from([str(value)[:40], [value], None, True, 1.5]))
    elif kind == "duplicate":
        if isinstance(value, list) and value:
            value.extend(value[: draw(st.integers(1, len(value)))])
        elif isinstance(parent, list):
            parent.insert(key, value)
    elif kind == "empty":
        parent[key] = type(value)() if isinstance(value, (list, dict, str)) else 0
    else:
        parent[key] = BIG_INT


def serialize(draw: st.DrawFn, doc: Any) -> bytes:
    """The document as a file: JSON, sometimes gzip, sometimes damaged at the byte level."""
    text = json.dumps(doc)
    if BIG_INT in text:
        digits = draw(st.sampled_from([41, 300, 4299, 5000, 20000]))
        text = text.replace(f'"{BIG_INT}"', "9" * digits)
    data = text.encode()
    damage = draw(st.sampled_from(["none"] * 12 + ["truncate", "flip", "gzip", "gzip_truncated"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    elif damage == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    elif damage == "gzip":
        data = gzip.compress(data, mtime=0)
    elif damage == "gzip_truncated":
        data = gzip.compress(data, mtime=0)
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data


# What a TraceError that is not about one field says: the reader's refusals.
FILE_PROBLEMS = ("not a JSON file", "nests arrays and objects more than", "holds an integer of",
                 "cannot read it", "decompresses to more than", "this is not an emu trace")


def check_load(path: Path, data: bytes) -> str:
    """Load ``data`` from ``path``: a trace that round-trips, or a clear TraceError. Returns which."""
    path.write_bytes(data)
    try:
        trace = load_trace(path)
    except TraceError as exc:
        msg = str(exc)
        assert msg.startswith(f"{path}: "), msg
        assert "\n" not in msg and len(msg) < 1000, msg
        assert "field '" in msg or any(p in msg for p in FILE_PROBLEMS), msg
        return "error"
    validate_trace(trace, str(path))
    again = save_trace(trace, path.with_name("again.json"))
    # files keep times to the nanosecond: compare what is written, not the unrounded floats
    assert trace_to_dict(load_trace(again)) == trace_to_dict(trace)
    return "trace"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-traces")


SEEDS = {name: trace_to_dict(load_trace(sample_path(name))) for name in SAMPLES}
SEED_TEXT = {name: json.dumps(doc) for name, doc in SEEDS.items()}


@st.composite
def mutated_samples(draw: st.DrawFn) -> bytes:
    doc = json.loads(SEED_TEXT[draw(st.sampled_from(sorted(SEEDS)))])
    # a PRNG seeded by a drawn number picks the nodes: hypothesis's own draws favour
    # small values, so sampled_from (or its randoms()) would keep mutating the first key
    rnd = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(1, 3))):
        targets = nodes(doc)
        if not targets:
            break
        mutate_at(draw, *rnd.choice(targets))
    return serialize(draw, doc)


def usually(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good``, and about one time in twelve any scalar instead (a residue, not a bound:
    hypothesis draws the ends of a range often)."""
    return st.integers(0, 2**16).flatmap(lambda i: scalars if i % 12 == 11 else good)


# A grammar of the format with random values: most documents get far into the loader.
ops = st.one_of(
    st.fixed_dictionaries({"op": st.just("compute"), "name": usually(st.sampled_from(["forward", "backward"])),
                           "dur_us": usually(st.sampled_from([0, 10.5, 1e5]))}),
    st.fixed_dictionaries({"op": st.just("coll"), "id": usually(st.sampled_from([0, 1, 2, -1])),
                           "kind": usually(st.sampled_from(["all_reduce", "all_gather", "broadcast", "send"])),
                           "dtype": usually(st.sampled_from(["float32", "int8"])),
                           "count": usually(st.sampled_from([0, 4, 6])), "bytes": st.sampled_from([0, 16, 24, 6]),
                           "group_size": usually(st.sampled_from([1, 2]))},
                          optional={"observed_us": usually(st.sampled_from([None, 3.0])),
                                    "root": scalars, "peer": st.integers(0, 2), "group": json_values,
                                    "tensors": st.sampled_from([[[2, 2]], [[4]], [[2, 3]], [[-1]]])}),
    st.fixed_dictionaries({"op": st.just("wait"), "ids": st.lists(st.sampled_from([0, 1, 2, -1]), max_size=3)},
                          optional={"blocked_us": usually(st.sampled_from([0.0, 5.0]))}),
    json_values,
)
iterations = st.fixed_dictionaries({"step": usually(st.sampled_from([3, 0, 5, -1])), "measured_us": usually(st.sampled_from([100.0])),
                                    "ops": st.lists(ops, min_size=1, max_size=5)})
grammar_docs = st.fixed_dictionaries({
    "schema": usually(st.sampled_from(["emu-trace"])),
    "schema_version": usually(st.sampled_from([1])),
    "meta": st.fixed_dictionaries(
        {"source": usually(st.sampled_from(["capture", "kineto"])), "world_size": usually(st.sampled_from([2, 1, 3, 0])),
         "backend": usually(st.just("gloo")), "device": st.just("cpu"), "framework": st.just("t"),
         "dtype": st.just("float32"), "captured_at": usually(st.just("2026-01-01T00:00:00Z"))},
        optional={"model": usually(st.just("mlp")), "batch_size": usually(st.just(32)),
                  "params": usually(st.just(100)), "kineto_files": usually(st.lists(st.text(max_size=5))),
                  "gaps": st.lists(st.text(max_size=10), max_size=2)}),
    "ranks": st.lists(st.fixed_dictionaries({"rank": usually(st.integers(0, 2)),
                                             "iterations": st.lists(iterations, min_size=1, max_size=2)}),
                      min_size=1, max_size=2),
})


@st.composite
def grammar_files(draw: st.DrawFn) -> bytes:
    return serialize(draw, draw(grammar_docs))


@settings(FAST, max_examples=60)
@given(data=mutated_samples())
def test_mutated_samples_load_or_fail_clearly(workdir: Path, data: bytes) -> None:
    assert check_load(workdir / "trace.json", data) in ("trace", "error")


@settings(FAST, max_examples=100)
@given(data=grammar_files())
def test_generated_documents_load_or_fail_clearly(workdir: Path, data: bytes) -> None:
    assert check_load(workdir / "trace.json", data) in ("trace", "error")


@settings(FAST, max_examples=75)
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_bytes_fail_clearly(workdir: Path, data: bytes) -> None:
    assert check_load(workdir / "trace.json", data) == "error"


def test_the_seeds_load_and_mutations_reach_every_outcome(workdir: Path) -> None:
    # the fuzzers start from valid files: if the seeds failed, every input would be an error
    for name, text in SEED_TEXT.items():
        assert check_load(workdir / f"{name}.json", text.encode()) == "trace"
    seen = set()

    @settings(FAST, max_examples=75)
    @given(data=mutated_samples())
    def outcomes(data: bytes) -> None:
        seen.add(check_load(workdir / "trace.json", data))

    outcomes()
    assert seen == {"trace", "error"}


@pytest.mark.slow
@settings(SLOW, max_examples=20_000)
@given(data=mutated_samples() | grammar_files())
def test_many_mutated_and_generated_traces(workdir: Path, data: bytes) -> None:
    assert check_load(workdir / "trace.json", data) in ("trace", "error")
