"""Summaries: step, compute, communication and overlap computed from the program."""

from __future__ import annotations

from emu.traces import iteration_comm_us, summarize
from tests.traces.test_io import small_trace


def test_comm_is_union_of_issue_to_completion() -> None:
    it = small_trace().ranks[0].iterations[0]
    # coll 0 issued at 150 for 40 us -> [150, 190]; coll 1 issued at 180 for 60 -> [180, 240]
    assert iteration_comm_us(it) == 90.0
    assert it.compute_us + it.blocked_us == it.measured_us


def test_summary_numbers() -> None:
    s = summarize(small_trace())
    assert s.iterations == 1 and s.ranks_in_file == (0, 1) and s.world_size == 2
    assert s.step_us_median == 215.0 and s.compute_us_median == 190.0
    assert s.comm_us_median == 90.0 and s.exposed_comm_us_median == 25.0
    assert abs(s.overlap_pct - 100 * (1 - 25 / 90)) < 1e-9
    (row,) = s.collectives
    assert (row.kind, row.per_iteration, row.bytes_per_iteration, row.elements_per_iteration) == \
        ("all_reduce", 2, 120, 30)
