"""The shipped sample traces load, are small, and hold what their models are."""

from __future__ import annotations

import pytest

from emu.errors import TraceError
from emu.traces import MODELS, CollKind, load_trace, sample_path
from emu.traces.model import GroupRole
from emu.traces.samples import PARALLEL_MODELS

PARAMS = {"mlp": 6_316_042, "cnn": 918_826, "transformer": 25_245_696, "dlrm": 6_405_793}


@pytest.mark.parametrize("name", MODELS)
def test_sample(name: str) -> None:
    path = sample_path(name)
    assert path.stat().st_size < 300_000
    trace = load_trace(path)
    assert trace.meta.model == name and trace.meta.params == PARAMS[name]
    assert trace.meta.command.startswith(f"emu capture --model {name}")
    assert trace.iterations >= 3 and len(trace.ranks) == trace.meta.world_size == 2
    for program in trace.ranks:
        for it in program.iterations:
            assert sum(op.count for op in it.colls if op.kind == CollKind.ALL_REDUCE) == PARAMS[name]
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.05)


# per sharded or split sample: its mesh, and per rank and iteration the collectives of each role
PARALLEL = {
    "fsdp": ({"fsdp": 4}, {GroupRole.FSDP: {CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER}}),
    "tp": ({"dp": 2, "tp": 2}, {GroupRole.TP: {CollKind.ALL_REDUCE}, GroupRole.DP: {CollKind.ALL_REDUCE}}),
    "pp": ({"pp": 2, "dp": 2}, {GroupRole.PP: {CollKind.SEND, CollKind.RECV}, GroupRole.DP: {CollKind.ALL_REDUCE}}),
    # pure expert parallelism: the token exchanges and the replicated parameters' all_reduce on one group
    "moe": ({"ep": 4}, {GroupRole.EP: {CollKind.ALL_TO_ALL, CollKind.ALL_REDUCE}}),
}


@pytest.mark.parametrize("name", PARALLEL_MODELS)
def test_parallel_sample(name: str) -> None:
    """Captured at world size 4, one thread a rank on the machine's two cores, with its mesh, and
    every collective on its group with its role (docs/parallelism.md)."""
    mesh, kinds = PARALLEL[name]
    trace = load_trace(sample_path(name))
    meta = trace.meta
    assert meta.model == name and meta.command.startswith(f"emu capture --model {name} --world-size 4")
    assert len(trace.ranks) == meta.world_size == 4 and meta.threads_per_rank == 1 and meta.cpu_cores >= 1
    assert {d.name: d.size for d in meta.mesh.dims} == mesh
    assert meta.params == (1_055_754 if name == "fsdp" else None)  # stages and tp shards hold parts of the model
    for program in trace.ranks:
        for it in program.iterations:
            roles = {op.group_role for op in it.colls}
            assert roles == set(kinds)
            for op in it.colls:
                assert op.kind in kinds[op.group_role]
                want = meta.mesh.slice(program.rank, (meta.mesh.names.index(op.group_role.value),))
                assert (op.group or tuple(range(4))) == want
            assert it.compute_us + it.blocked_us == pytest.approx(it.measured_us, abs=0.05)
    if name == "fsdp":  # FSDP2 gathers each block's parameters twice (forward, backward) and reduce-scatters once
        it = trace.ranks[0].iterations[0]
        gathered = sum(op.count for op in it.colls if op.kind == CollKind.ALL_GATHER)
        scattered = sum(op.count for op in it.colls if op.kind == CollKind.REDUCE_SCATTER)
        assert scattered >= meta.params and gathered >= 2 * meta.params - 2 * 6156


def test_unknown_sample() -> None:
    with pytest.raises(TraceError, match="the samples are: mlp, cnn, transformer"):
        sample_path("resnet")
