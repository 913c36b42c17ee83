"""MLCommons Chakra execution traces: Chakra's own test data imported, inspected and replayed; emu
traces written as Chakra and read back (exactly with emu's attributes, within a stated tolerance
without them); Chakra's own reader on what emu writes; bad input as one line and exit 2."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.cli import cli
from emu.errors import TraceError
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path, trace_to_dict
from emu.traces.chakra import import_chakra, is_chakra, read_et
from emu.traces.chakra.schema import messages
from emu.traces.chakra.write import write_chakra
from emu.traces.model import CollKind, Iteration, RankProgram, Source, Trace, TraceMeta

DATA = Path(__file__).parent.parent / "data" / "chakra" / "chakra.0.et.gz"
FAST = settings(deadline=None, database=None, derandomize=True, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def test_chakras_own_test_data_imports() -> None:
    """Chakra's feeder test trace (its PyTorch converter's output): the GPU kernels are the compute,
    the GPU collectives the communication, the host operators order them and are counted."""
    trace = import_chakra([DATA], world_size=8)
    (program,) = trace.ranks
    (it,) = program.iterations
    assert trace.meta.world_size == 8 and trace.meta.source.value == "chakra"
    kinds = [(op.kind, op.count, op.dtype.value) for op in it.colls]
    assert kinds == [(CollKind.BROADCAST, 53_120, "float32"), (CollKind.BROADCAST, 53, "int64"),
                     (CollKind.ALL_REDUCE, 2_049_000, "float32"), (CollKind.ALL_REDUCE, 7_875_584, "float32"),
                     (CollKind.ALL_REDUCE, 6_563_840, "float32"), (CollKind.ALL_REDUCE, 6_637_568, "float32"),
                     (CollKind.ALL_REDUCE, 2_431_040, "float32")]
    assert sum(op.bytes for op in it.colls) == 212_480 + 424 + 8_196_000 + 31_502_336 + 26_255_360 + 26_550_272 \
        + 9_724_160  # the comm_size attributes, in bytes
    assert it.compute_us == 292_828.0  # the 1,209 GPU kernels' duration_micros
    gaps = " ".join(trace.meta.gaps)
    assert "2434 host operator nodes" in gaps and "14 host collective calls" in gaps
    assert "iteration time: Chakra records none" in gaps


def test_a_chakra_file_inspects_and_replays_at_64_workers(tmp_path: Path) -> None:
    """Given to emu inspect and emu replay directly (recognised by content), and replayed at 64
    workers with every sum checked."""
    assert is_chakra(DATA) and not is_chakra(sample_path("mlp"))
    result = CliRunner().invoke(cli, ["inspect", str(DATA), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["world_size"] == 1 and summary["iterations"] == 1
    assert any("world size: the Chakra files do not say" in g for g in summary["gaps"])
    report = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["replay", str(DATA), "--workers", "64", "--fabric", "ina", "--iters", "1",
                                      "--report", str(report)])
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    assert doc["verification"]["ok"] and doc["verification"]["elements_checked"] > 0
    assert doc["config"]["workers"] == 64


@pytest.mark.parametrize("name", ["mlp", "tp", "pp", "moe", "fsdp"])
def test_emu_to_chakra_to_emu_is_exact(name: str, tmp_path: Path) -> None:
    """With emu's attributes, a trace reads back with the same programs and meta (its source aside)."""
    trace = load_trace(sample_path(name))
    files = write_chakra(trace, tmp_path, name)
    assert [f.name for f in files] == [f"{name}.{r.rank}.et" for r in trace.ranks]
    back = import_chakra(files)
    a, b = trace_to_dict(trace), trace_to_dict(back)
    assert b["ranks"] == a["ranks"]
    assert {k: v for k, v in b["meta"].items() if k != "source"} == {k: v for k, v in a["meta"].items()
                                                                     if k != "source"}


def _replayed(trace, workers: int):
    return replay(trace, ReplayConfig(workers=workers, fabric="ring"))


def test_export_at_8_workers_replays_as_the_original(tmp_path: Path) -> None:
    """emu export mlp --chakra out --workers 8: 8 files; read back, their replay at 8 workers gives
    the original's every emulated number."""
    result = CliRunner().invoke(cli, ["export", "mlp", "--chakra", str(tmp_path / "out"), "--workers", "8"])
    assert result.exit_code == 0, result.output
    files = sorted((tmp_path / "out").glob("*.et"))
    assert len(files) == 8
    out = tmp_path / "back.json.gz"
    result = CliRunner().invoke(cli, ["capture", "--chakra", str(tmp_path / "out"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    original, back = _replayed(load_trace(sample_path("mlp")), 8), _replayed(load_trace(out), 8)
    assert back.summary == original.summary
    assert back.iterations == original.iterations


def _stripped(files: list[Path], out: Path) -> list[Path]:
    """The files without emu's attributes: what a Chakra tool that rewrote them would keep."""
    classes = messages()
    out.mkdir()
    paths = []
    for f in files:
        et = read_et(f)
        meta = classes["GlobalMetadata"](version=et.version)
        body = []
        for node in et.nodes:
            keep = [a for a in node.attr if not a.name.startswith("emu.")]
            del node.attr[:]
            node.attr.extend(keep)
            body.append(node)
        path = out / f.name
        path.write_bytes(b"".join(_framed(m) for m in (meta, *body)))
        paths.append(path)
    return paths


def _framed(message) -> bytes:
    from emu.traces.chakra.write import _frame

    return _frame(message)


@pytest.mark.parametrize("name", ["fsdp", "tp"])
def test_without_emus_attributes_the_replay_stays_within_one_percent(name: str, tmp_path: Path) -> None:
    """Chakra's fields alone: durations round to a microsecond, all_gathers' counts come from the
    input's bytes, waits from the dependencies, streams from ``stream``; one iteration's replay stays
    within 1% of the original's (the stated tolerance, docs/trace-format.md). Several iterations
    read back as one (Chakra has no steps), so the comparison takes one."""
    full = load_trace(sample_path(name))
    trace = replace(full, ranks=tuple(replace(r, iterations=r.iterations[:1]) for r in full.ranks))
    files = _stripped(write_chakra(trace, tmp_path / "full", name), tmp_path / "bare")
    back = import_chakra(files)
    assert [(op.kind, op.count, op.stream) for op in back.ranks[0].iterations[0].colls] == \
        [(op.kind, op.count, op.stream) for op in trace.ranks[0].iterations[0].colls]
    want = _replayed(trace, trace.meta.world_size).iterations[0].emulated_us
    got = _replayed(back, trace.meta.world_size).iterations[0].emulated_us
    assert abs(got - want) / want < 0.01, (got, want)


@pytest.mark.skipif(importlib.util.find_spec("chakra") is None,
                    reason="Chakra's own reader is not installed (pip install --no-deps mlc-chakra 'protobuf>=6.31.1')")
def test_chakras_own_reader_loads_what_emu_writes(tmp_path: Path) -> None:
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node, NodeType
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    from emu.replay import laid_out

    tp, mlp = load_trace(sample_path("tp")), laid_out(load_trace(sample_path("mlp")), 8)
    pairs = [*zip(write_chakra(tp, tmp_path / "tp", "tp"), tp.ranks, strict=True),
             *zip(write_chakra(mlp, tmp_path / "mlp", "mlp"), mlp.ranks, strict=True)]
    assert len(pairs) == 4 + 8
    for path, program in pairs:
        f = openFileRd(str(path))
        meta = GlobalMetadata()
        assert decodeMessage(f, meta) and meta.version == "1.0.0"
        nodes = []
        node = Node()
        while decodeMessage(f, node):
            nodes.append(node)
            node = Node()
        colls = [n for n in nodes if n.type == NodeType.Value("COMM_COLL_NODE")]
        computes = [n for n in nodes if n.type == NodeType.Value("COMP_NODE")]
        assert len(colls) == sum(len(it.colls) for it in program.iterations)
        assert len(computes) == sum(1 for it in program.iterations for op in it.ops if type(op).__name__ == "Compute")
        sizes = [next(a.int64_val for a in n.attr if a.name == "comm_size") for n in colls]
        want = [op.bytes // op.group_size if op.kind == CollKind.ALL_GATHER else op.bytes
                for it in program.iterations for op in it.colls]
        assert sizes == want


def _fails_in_one_line(path: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["capture", "--chakra", str(path), "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr, result.stderr


def test_bad_chakra_files_give_one_line_and_exit_2(tmp_path: Path) -> None:
    good = write_chakra(load_trace(sample_path("mlp")), tmp_path / "good", "mlp")[0].read_bytes()
    classes = messages()
    node = classes["Node"](id=2, name="a", type=4, duration_micros=5)
    node.data_deps.append(3)
    other = classes["Node"](id=3, name="b", type=4, duration_micros=5)
    other.data_deps.append(2)
    cases = {
        "truncated.et": good[: len(good) // 2],
        "empty.et": b"",
        "random.et": bytes(random.Random(0).randrange(256) for _ in range(4000)),
        "version.et": _framed(classes["GlobalMetadata"](version="9.9.9")),
        "old.et": _framed(classes["Node"](id=7, name="x", type=4)),  # a pre-0.0.4 file starts with a node
        "cycle.et": b"".join(_framed(m) for m in (classes["GlobalMetadata"](version="1.0.0"), node, other)),
        "types.et": _framed(classes["GlobalMetadata"](version="1.0.0")) + b"\x05\x08\x96\x01\x1a\x00",
        "gzip.et.gz": gzip.compress(good)[:100],
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        _fails_in_one_line(tmp_path / name, tmp_path)
    result = CliRunner().invoke(cli, ["capture", "--chakra", str(tmp_path / "version.et"), "-o", "x.json"])
    assert "emu reads 0.0.4, 1.0.0" in result.stderr


_GOOD: list[bytes] = []


def _good_pp(folder: Path) -> bytes:
    if not _GOOD:
        _GOOD.append(write_chakra(load_trace(sample_path("pp")), folder, "pp")[0].read_bytes())
    return _GOOD[0]


@FAST
@given(data=st.data())
def test_fuzzed_chakra_input_is_a_trace_or_one_trace_error(data: st.DataObject, tmp_path_factory) -> None:
    """Cut, flipped or spliced bytes of a real export: a trace, or a TraceError naming the file."""
    folder = tmp_path_factory.mktemp("fuzz")
    raw = bytearray(_good_pp(folder))
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = folder / "f.et"
    path.write_bytes(bytes(raw))
    try:
        import_chakra([path], world_size=4)
    except TraceError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


def _two_ranks(ops) -> Trace:
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=2, backend="gloo", device="cpu", framework="test",
                     dtype="float32", captured_at="2026-12-04T00:00:00Z", model="hand")
    it = Iteration(step=0, measured_us=100.0, ops=tuple(ops))
    return Trace(meta=meta, ranks=tuple(RankProgram(rank=r, iterations=(it,)) for r in range(2)))


def test_chakra_dependencies_hold_a_wait_until_the_next_compute(tmp_path: Path) -> None:
    """Coll A, Wait(A), Coll B, Compute K: K depends on A (Chakra schedules by data_deps alone), and
    so does B; without emu's attributes the walk puts the wait before B, where emu had it."""
    from emu.traces.model import Coll, Compute, Dtype, Wait

    a = Coll(id=0, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=1000, bytes=4000, group_size=2)
    b = Coll(id=1, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=10, bytes=40, group_size=2)
    trace = _two_ranks([Compute("f", 10.0), a, Wait(ids=(0,)), b, Compute("k", 5.0), Wait(ids=(1,))])
    files = write_chakra(trace, tmp_path / "w", "hand")
    nodes = {n.name: n for n in read_et(files[0]).nodes}
    coll_a, coll_b = (n for n in read_et(files[0]).nodes if n.name == "emu:all_reduce")
    assert coll_a.id in nodes["k"].data_deps and coll_a.id in coll_b.data_deps
    assert nodes["f"].id in nodes["k"].data_deps
    back = import_chakra(_stripped(files, tmp_path / "bare"))
    assert [type(op).__name__ for op in back.ranks[0].iterations[0].ops] == \
        ["Compute", "Coll", "Wait", "Coll", "Compute", "Wait"]


def test_exports_and_imports_refuse_to_mix(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert CliRunner().invoke(cli, ["export", "mlp", "--chakra", str(out), "--workers", "4"]).exit_code == 0
    result = CliRunner().invoke(cli, ["export", "mlp", "--chakra", str(out), "--workers", "2"])
    assert result.exit_code == 2 and "mlp.2.et, mlp.3.et of another export" in result.stderr
    other = tmp_path / "other"
    CliRunner().invoke(cli, ["export", "cnn", "--chakra", str(other), "--name", "mlp"])
    (out / "mlp.0.et").write_bytes((other / "mlp.0.et").read_bytes())
    result = CliRunner().invoke(cli, ["capture", "--chakra", str(out), "-o", str(tmp_path / "t.json")])
    assert result.exit_code == 2 and "different exports" in result.stderr
    for args in (["capture", "--chakra", "-o", str(tmp_path / "t.json")],
                 ["export", "mlp", "--chakra", str(tmp_path / "n"), "--name", "../up"],
                 ["export", "mlp", "--chakra", str(tmp_path / "m"), "--mesh", "dp=2"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, (args, result.output)


def test_damaged_gzip_and_bad_groups_are_one_line(tmp_path: Path) -> None:
    damaged = tmp_path / "t.json.gz"
    damaged.write_bytes(gzip.compress(b'{"schema": "emu-trace"}' * 100)[:40] + b"\x00" * 40)
    with pytest.raises(TraceError):
        load_trace(damaged)
    classes = messages()
    init = classes["Node"](id=1, name="## process_group:init ##", type=1)
    init.inputs.values = json.dumps([{"pg_name": "0", "ranks": ["a"], "group_size": 1}])
    compute = classes["Node"](id=2, name="c", type=4, duration_micros=3)
    bad = tmp_path / "g.0.et"
    bad.write_bytes(b"".join(_framed(m) for m in (classes["GlobalMetadata"](version="1.0.0"), init, compute)))
    _fails_in_one_line(bad, tmp_path)
