"""Fuzzing the Kineto import: whatever the rank files hold, a correct trace or one clear KinetoError.

Seeds are the real traces in tests/data/: both gloo ranks of every collective kind,
rank 0 of the gloo DDP MLP, and a reduced copy of the A100/NCCL trace (its three
steps with every event the conversion reads, a sample of the rest, so that one
import takes milliseconds). Mutations aim at what the conversion reads (the
arguments of collectives, kernels, step spans, times, ids, distributedInfo) and at
any node of the file, and the file may be damaged at the byte level. The only
allowed outcomes: a trace that passes validation and the file format's round
trip, whose gaps name the file; or a KinetoError, one line naming the file.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.capture import import_kineto
from emu.errors import KinetoError
from emu.traces import load_trace, save_trace, trace_to_dict, validate_trace
from tests.conftest import A100, GLOO_COLLECTIVES, GLOO_MLP
from tests.traces.test_fuzz_traces import FAST, SLOW, json_values, mutate_at, nodes, serialize, usually


def _read(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def _reduced_a100() -> dict[str, Any]:
    """The A100 trace with every event the conversion reads and one in 400 of the rest."""
    raw = _read(A100)
    keep_names = ("record_param_comms", "torch.distributed.ddp.reducer::copy_bucket_to_grad")
    keep_prefixes = ("ProfilerStep#", "DistributedDataParallel.forward", "Optimizer.")

    def kept(i: int, e: dict[str, Any]) -> bool:
        name, cat = e.get("name", ""), e.get("cat")
        if e.get("ph") != "X":
            return False
        if name.startswith("autograd::engine::evaluate_function"):
            return i % 50 == 0
        return (name in keep_names or name.startswith(keep_prefixes) or i % 400 == 0
                or (cat == "kernel" and name.lower().startswith("nccl"))
                or (cat == "cuda_runtime" and "Synchronize" in name))

    return {**raw, "traceEvents": [e for i, e in enumerate(raw["traceEvents"]) if kept(i, e)]}


# name -> the rank files of one job, as JSON texts (parsed afresh for each input)
SEEDS: dict[str, list[str]] = {
    "gloo-collectives": [json.dumps(_read(GLOO_COLLECTIVES / f"rank{r}.json.gz")) for r in (0, 1)],
    "gloo-mlp-rank0": [json.dumps(_read(GLOO_MLP / "rank0.json.gz"))],
    "nccl-a100-reduced": [json.dumps(_reduced_a100())],
}
# Argument keys the conversion reads, and values that break them in interesting ways.
ARG_KEYS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Ranks",
            "External id", "Input Dims", "Input type", "Concrete Inputs")
EVENT_KEYS = ("name", "ts", "dur", "pid", "tid", "cat", "ph", "args")
HOT = ("record_param_comms", "ProfilerStep#", "c10d::", "gloo:", "nccl", "copy_bucket_to_grad",
       "DistributedDataParallel.forward", "Optimizer.")
ARG_VALUES = st.sampled_from([None, "", "Float", "Half", "Byte", "complex", "allreduce", "wait", "gather", 0, -1,
                              2**40 + 1, 10**30, "[0, 1]", "[0, 7]", "[a]", [0, 1], [0, 0], [[1000]], [[-1]],
                              [[[[1]]]], [["x"]], ["float"], [], ["0", "1", "2", "True", "1"]]) | json_values


def _events(doc: dict[str, Any], rnd: random.Random) -> list[dict[str, Any]]:
    """The events of one kind the conversion reads (a kind drawn first: one DDP trace
    holds hundreds of bucket copies and a few collectives), else all events."""
    raw = doc.get("traceEvents")
    events = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    by_kind = {h: [e for e in events if h in str(e.get("name", ""))] for h in HOT}
    kinds = [evs for evs in by_kind.values() if evs]
    return rnd.choice(kinds) if kinds and rnd.random() < 0.9 else events


def mutate_kineto(draw: st.DrawFn, rnd: random.Random, doc: dict[str, Any]) -> None:
    """One mutation, mostly of what the conversion reads."""
    where = draw(st.sampled_from(["arg", "arg", "event", "event", "drop", "info", "anywhere"]))
    events = _events(doc, rnd)
    if where in ("arg", "event", "drop") and events:
        ev = rnd.choice(events)
        if where == "drop":
            doc["traceEvents"].remove(ev)
        elif where == "arg" and isinstance(ev.get("args"), dict):
            key = rnd.choice(ARG_KEYS if rnd.random() < 0.7 else tuple(ev["args"]) or ARG_KEYS)
            if draw(st.booleans()) and key in ev["args"]:
                del ev["args"][key]
            else:
                ev["args"][key] = draw(ARG_VALUES)
        else:
            key = rnd.choice(EVENT_KEYS)
            if key in ev:
                mutate_at(draw, ev, key)
    elif where == "info" and isinstance(doc.get("distributedInfo"), dict):
        info = doc["distributedInfo"]
        key = rnd.choice(["rank", "world_size", "backend", "pg_config", "baseTimeNanoseconds"])
        if key == "baseTimeNanoseconds":
            doc[key] = draw(st.sampled_from([-1, 2**63, 1.5, "now", 10**30]) | json_values)
        elif key in info:
            mutate_at(draw, info, key)
    else:
        # any node: of the document's top level, or inside one event (walking every event
        # of the file for each input would cost more than the import)
        top = [(doc, key) for key in doc]
        inside = nodes(rnd.choice(events)) if events else []
        targets = rnd.choice([t for t in (top, inside) if t] or [[]])
        if targets:
            mutate_at(draw, *rnd.choice(targets))


class Files(list):
    """Rank files; a short repr, since hypothesis prints failing inputs (the files stay in the
    test's temporary folder, rank0.json...)."""

    def __repr__(self) -> str:
        return f"Files({[len(f) for f in self]} bytes)"


@st.composite
def mutated_jobs(draw: st.DrawFn) -> list[bytes]:
    """The rank files of one seed job, one or more of them mutated."""
    # a PRNG seeded by a drawn number picks the seed and the events: hypothesis's own
    # draws favour the first of a list
    rnd = random.Random(draw(st.integers(0, 2**32)))
    docs = [json.loads(t) for t in SEEDS[rnd.choice(sorted(SEEDS))]]
    for _ in range(draw(st.integers(1, 3))):
        mutate_kineto(draw, rnd, rnd.choice(docs))
    return Files(serialize(draw, d) if i == 0 or draw(st.booleans()) else json.dumps(d).encode()
                 for i, d in enumerate(docs))


event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i"]),
     "name": st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "record_param_comms", "c10d::allreduce_",
                              "gloo:all_reduce", "ncclKernel_AllReduce", "aten::mm"]),
     "cat": st.sampled_from(["user_annotation", "cpu_op", "kernel", ""]),
     "ts": usually(st.sampled_from([0, 10, 100, 150]) | st.floats(0, 200)),
     "dur": usually(st.sampled_from([1, 50, 200]) | st.floats(0, 200)),
     "tid": st.sampled_from([1, 2, "stream 7"])},
    optional={"args": st.dictionaries(st.sampled_from(ARG_KEYS), ARG_VALUES, max_size=5) | json_values,
              "pid": usually(st.just(7))})
random_jobs = st.fixed_dictionaries(
    {"traceEvents": st.lists(event, max_size=12),
     "distributedInfo": usually(st.fixed_dictionaries(
         {"rank": usually(st.sampled_from([0, 1])), "world_size": usually(st.sampled_from([2, 1])),
          "backend": st.sampled_from(["nccl", "gloo"])},
         optional={"pg_config": usually(st.just([{"pg_name": "0", "ranks": [0, 1]}]))}))},
    optional={"baseTimeNanoseconds": usually(st.just(1_700_000_000_000_000_000)),
              "deviceProperties": usually(st.just([{"name": "GPU"}]))})


@st.composite
def random_files(draw: st.DrawFn) -> list[bytes]:
    return Files([serialize(draw, draw(random_jobs))])


def check_import(folder: Path, files: list[bytes]) -> str:
    """Import the files: a trace that validates and round-trips, or a clear KinetoError."""
    paths = []
    for rank, data in enumerate(files):
        path = folder / f"rank{rank}.json"
        path.write_bytes(data)
        paths.append(path)
    try:
        trace = import_kineto(paths)
    except KinetoError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) < 1500, msg
        assert any(str(p) in msg for p in paths), msg
        return "error"
    validate_trace(trace, "imported")
    assert all(any(p.name in line for p in paths) for line in trace.meta.gaps)
    # the file keeps times to the nanosecond, so compare documents, not the unrounded floats
    assert trace_to_dict(load_trace(save_trace(trace, folder / "trace.json"))) == trace_to_dict(trace)
    return "trace"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-kineto")


@settings(FAST, max_examples=60)
@given(files=mutated_jobs())
def test_mutated_real_traces_import_or_fail_clearly(workdir: Path, files: list[bytes]) -> None:
    assert check_import(workdir, files) in ("trace", "error")


@settings(FAST, max_examples=160)
@given(files=random_files())
def test_random_files_import_or_fail_clearly(workdir: Path, files: list[bytes]) -> None:
    assert check_import(workdir, files) in ("trace", "error")


def test_the_seeds_import(workdir: Path) -> None:
    # every seed is a valid job: the fuzzers start from files that import
    for texts in SEEDS.values():
        assert check_import(workdir, [t.encode() for t in texts]) == "trace"


@pytest.mark.slow
@settings(SLOW, max_examples=10_000)
@given(files=mutated_jobs() | random_files())
def test_many_mutated_and_random_kineto_files(workdir: Path, files: list[bytes]) -> None:
    assert check_import(workdir, files) in ("trace", "error")
