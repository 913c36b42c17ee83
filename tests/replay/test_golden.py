"""The golden set (tests/golden.py): every emulated number of fixed replays and predictions is what
it was when the case was recorded. The fast cases run in `make test`, all of them in `make test-all`."""

from __future__ import annotations

import json

import pytest

from tests import golden


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=() if c.fast else pytest.mark.slow)
                                  for c in golden.CASES])
def test_golden_case_is_unchanged(case: golden.Case) -> None:
    diffs = golden.check(case)
    assert not diffs, f"{case.name}: {len(diffs)} emulated numbers changed:\n" + "\n".join(diffs[:30])


def test_the_comparer_tolerates_added_fields_and_catches_changed_ones() -> None:
    recorded = {"summary": {"iteration_us_median": 100.0, "bytes_sent": 8.0}, "jobs": None, "ok": True}
    grown = {"summary": {"iteration_us_median": 100.0, "bytes_sent": 8.0, "new": 1}, "jobs": None, "ok": True}
    assert golden.differences(recorded, grown) == []
    assert golden.differences(recorded, {**grown, "ok": False}) == [".ok: False where the golden has True"]
    moved = {**grown, "summary": {"iteration_us_median": 100.0 * (1 + 1e-6), "bytes_sent": 8.0}}
    assert golden.differences(recorded, moved) != []
    assert golden.differences(recorded, {"summary": {}, "jobs": None, "ok": True}) == [
        ".summary.iteration_us_median: missing", ".summary.bytes_sent: missing"]


def test_volatile_fields_are_stripped_at_any_depth() -> None:
    report = {"emulator": {"wall_s": 3.0, "clock": "sync"}, "jobs": [{"emulator": {"wall_s": 1.0, "windows": 9}}]}
    assert golden.strip(report) == {"emulator": {"clock": "sync"}, "jobs": [{"emulator": {}}]}


@pytest.mark.parametrize("name", ["ring", pytest.param("jobs-ring", marks=pytest.mark.slow),
                                  pytest.param("ina", marks=pytest.mark.slow),
                                  pytest.param("mesh-tp-ina", marks=pytest.mark.slow),
                                  pytest.param("sparse-ina", marks=pytest.mark.slow)])
def test_one_process_gives_the_golden_reports(name: str) -> None:
    """--processes 0 (the switch and every host in the orchestrator's process) replays the golden
    cases to the same numbers as the socketed layouts."""
    case = golden.BY_NAME[name]
    args = list(case.args)
    args[args.index("--processes") + 1] = "0"
    recorded = golden.strip(json.loads(golden.path_of(case).read_text()))
    assert golden.differences(recorded, golden.strip(golden.run(golden.Case(name, tuple(args))))) == []
