"""The loader's bounds, with their exact messages: what no real file holds is refused where it is read.

JSON nesting and integer length, decompressed size, plausible sizes and times, tensor
shapes against counts, and an atomic save_trace (a failed write leaves the old file).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import pytest

from emu import files
from emu.errors import RunFailed, TraceError
from emu.traces import Compute, Iteration, RankProgram, Trace, load_trace, save_trace, trace_to_dict
from emu.traces import io as trace_io
from emu.traces.jsonfile import json_depth_exceeds
from tests.traces.test_io import small_trace, write_doc

EXPECTED = "give the path of an emu trace (.json or .json.gz) made by 'emu capture'"
CORRUPTED = ("no real job has that; the file is corrupted or was written by a bug; re-capture the trace "
             "(emu capture) or fix the tool that wrote it")
A_DAY = ("more than a day, which no training step takes; if the tool that wrote the trace counted ns or ms, "
         "convert to microseconds (the format's unit), else re-capture it")


def refused(path: Path) -> str:
    with pytest.raises(TraceError) as err:
        load_trace(path)
    return str(err.value)


def test_deep_nesting_is_a_trace_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert refused(path) == (f"{path}: nests arrays and objects more than 64 deep, which no real file does; "
                             f"the file is corrupted or not what emu reads; {EXPECTED}")
    doc = trace_to_dict(small_trace())
    doc["meta"]["model"] = json.loads("[" * 70 + "]" * 70)  # deep inside an otherwise valid trace
    assert "nests arrays and objects more than 64 deep" in refused(write_doc(tmp_path, doc))


def test_a_long_integer_is_a_trace_error_not_a_value_error(tmp_path: Path) -> None:
    text = json.dumps(trace_to_dict(small_trace())).replace('"count": 20', '"count": ' + "7" * 5000)
    path = tmp_path / "long.json"
    path.write_text(text)
    assert refused(path) == (f"{path}: holds an integer of 5000 digits, more than the 40 any real file holds; "
                             f"the file is corrupted; {EXPECTED}")


def test_depth_check_reads_strings_and_escapes_right() -> None:
    assert not json_depth_exceeds(b'{"a": "[[[[[[[[", "b": "\\"[[[[", "c\\\\": [1]}', 2)
    assert json_depth_exceeds(b'{"a": "\\\\", "b": [[1]]}', 2)
    assert not json_depth_exceeds(b"[" * 64 + b"]" * 64)
    assert json_depth_exceeds(b"[" * 65 + b"]" * 65)
    assert not json_depth_exceeds(b"[[[}")  # unbalanced: the parser's to report


def test_a_gzip_bomb_is_refused_by_its_decompressed_size(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * 100_000 + b"{}"))
    monkeypatch.setattr(trace_io, "MAX_TRACE_BYTES", 10_000)
    assert path.stat().st_size < 10_000
    assert refused(path) == (f"{path}: decompresses to more than the 10000 bytes emu reads from such a file; "
                             f"{EXPECTED}")


def _op(doc: dict, k: int, rank: int = 0) -> dict:
    return doc["ranks"][rank]["iterations"][0]["ops"][k]


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: (_op(d, 2).update(count=2**40 + 1, bytes=4 * (2**40 + 1)), _op(d, 2).pop("tensors")),
     "rank 0: iteration 0 (step 3): op 2: field 'count' is 1099511627777 elements; a collective holds 0..2**40 "
     f"(1099511627776) elements: {CORRUPTED}"),
    (lambda d: _op(d, 0).update(dur_us=86_400e6 + 1),
     f"rank 0: iteration 0 (step 3): op 0: field 'dur_us' is 86400000001.0 us (24 h), {A_DAY}"),
    (lambda d: d["ranks"][1]["iterations"][0].update(measured_us=9e10),
     f"rank 1: iteration 0 (step 3): field 'measured_us' is 90000000000.0 us (25 h), {A_DAY}"),
    (lambda d: _op(d, 2).update(observed_us=1e12),
     f"rank 0: iteration 0 (step 3): op 2: field 'observed_us' is 1000000000000.0 us (278 h), {A_DAY}"),
    (lambda d: _op(d, 0).update(dur_us=10**39),
     f"rank 0: iteration 0 (step 3): op 0: field 'dur_us' is {10**39} us (2.78e+29 h), {A_DAY}"),
    (lambda d: _op(d, 5).update(blocked_us=-3),
     "rank 0: iteration 0 (step 3): op 5: field 'blocked_us' must be a finite number >= 0, got -3"),
    (lambda d: _op(d, 0).update(dur_us=float("nan")),
     "rank 0: iteration 0 (step 3): op 0: field 'dur_us' must be a finite number >= 0, got nan"),
    (lambda d: _op(d, 2).update(tensors=[[4, 6]]),
     "rank 0: iteration 0 (step 3): op 2: field 'tensors' shapes hold 24 elements but count is 20: they must add "
     "up to the collective's tensor; drop 'tensors' or fix the count"),
    (lambda d: _op(d, 2).update(tensors=[[True, 20]]),
     "rank 0: iteration 0 (step 3): op 2: field 'tensors' must be a list of shapes (lists of integers >= 0)"),
    (lambda d: _op(d, 2).update(tensors=[[2**41, 0]]),
     "rank 0: iteration 0 (step 3): op 2: field 'tensors' holds a shape with a negative dimension or more than "
     f"2**40 elements: {CORRUPTED}"),
    (lambda d: d["meta"].update(world_size=2**21),
     f"field 'meta.world_size' is 2097152; a job has 1..2**20 (1048576) ranks: {CORRUPTED}"),
    (lambda d: d["meta"].update(batch_size=2**41),
     "field 'meta.batch_size' is 2199023255552; a batch holds 1..2**40 samples; leave it null where unknown"),
    (lambda d: d["ranks"][0]["iterations"][0].update(step=2**41),
     f"rank 0: iteration 0 (step 2199023255552): field 'step' is 2199023255552; a step number is in 0..2**40: "
     f"{CORRUPTED}"),
    (lambda d: _op(d, 2).update(id=2**31),
     f"rank 0: iteration 0 (step 3): op 2: field 'id' is 2147483648; collective ids are integers in "
     f"0..2147483647: {CORRUPTED}"),
    (lambda d: d.update(schema_version=True),
     "field 'schema_version' is True, which this emu cannot read; supported versions: 1"),
    (lambda d: d["meta"].update(kineto_files=["a", 3]), "field 'kineto_files' must be a list of strings"),
    (lambda d: d["meta"].update(gaps="x"), "field 'gaps' must be a list, got str 'x'"),
    (lambda d: _op(d, 5).update(ids=[0, True]), "op 5: field 'ids' must be a list of integers >= 0, holds True"),
])
def test_implausible_values_name_file_rank_op_field_and_fix(tmp_path: Path, mutate, expected: str) -> None:
    doc = trace_to_dict(small_trace())
    mutate(doc)
    path = write_doc(tmp_path, doc)
    msg = refused(path)
    assert msg.startswith(f"{path}: ") and expected in msg, msg


def test_a_huge_value_is_shown_short(tmp_path: Path) -> None:
    doc = trace_to_dict(small_trace())
    _op(doc, 0)["name"] = ["x" * 10_000]
    msg = refused(write_doc(tmp_path, doc))
    assert msg.endswith("field 'name' must be a string, got list ['" + "x" * 78 + "... (10004 characters)")


def test_gaps_round_trip(tmp_path: Path) -> None:
    trace = small_trace()
    meta = trace.meta.__class__(**{**trace.meta.__dict__, "gaps": ("rank0.json: rank 0: step 3: op 2: no kernel",)})
    gapped = Trace(meta=meta, ranks=trace.ranks)
    assert load_trace(save_trace(gapped, tmp_path / "t.json")) == gapped
    assert "gaps" not in trace_to_dict(trace)["meta"]  # absent when there are none


def test_save_refuses_what_load_would_refuse(tmp_path: Path) -> None:
    trace = small_trace()
    it = trace.ranks[0].iterations[0]
    bad = Iteration(step=it.step, measured_us=it.measured_us, ops=(Compute("forward", -1.0), *it.ops[1:]))
    bad_trace = Trace(meta=trace.meta, ranks=(RankProgram(0, (bad,)), trace.ranks[1]))
    with pytest.raises(TraceError) as err:
        save_trace(bad_trace, tmp_path / "t.json")
    assert str(err.value) == (f"{tmp_path / 't.json'}: rank 0: iteration 0 (step 3): op 0: field 'dur_us' is -1.0; "
                              "a duration must be a finite number of microseconds >= 0")
    assert list(tmp_path.iterdir()) == []


def _old_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = save_trace(small_trace(), tmp_path / "t.json.gz")
    return path, path.read_bytes()


def test_a_full_disk_leaves_the_old_trace_and_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    path, before = _old_file(tmp_path)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(RunFailed) as err:  # an output not written is a failed run: exit 1 (issue 37)
        save_trace(small_trace(world=3), path)
    assert str(err.value) == (f"{path}: cannot write the trace (No space left on device); the file was left as it "
                              "was: free space or pick another path")
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_an_interrupted_save_leaves_the_old_trace_and_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    path, before = _old_file(tmp_path)

    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_trace(small_trace(world=3), path)
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_save_replaces_whole_and_gives_the_umask_mode(tmp_path: Path) -> None:
    path, _ = _old_file(tmp_path)
    save_trace(small_trace(world=3), path)
    assert load_trace(path) == small_trace(world=3)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(tmp_path.iterdir()) == [path]
    assert load_trace(save_trace(small_trace(), tmp_path / "new" / "dir" / "t.json")) == small_trace()
