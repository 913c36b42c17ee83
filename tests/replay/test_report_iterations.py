"""An iteration's period and span as the report builds them from the workers' records."""

from __future__ import annotations

import pytest

from emu.replay.report.build import _iterations


def test_period_runs_from_last_end_to_last_end() -> None:
    """Worker 1 ends the first iteration 20 us after worker 0 and so starts the second 20 us later:
    the second iteration's span (earliest start to last end) holds those 20 us, its period (last
    end to last end) does not, and the periods add up to the run; the first iteration's period is
    its span. Records: [start, end, compute, blocked, comm]."""
    records = {0: [[0.0, 100.0, 60.0, 40.0, 40.0], [100.0, 190.0, 60.0, 30.0, 30.0]],
               1: [[0.0, 120.0, 60.0, 60.0, 60.0], [120.0, 205.0, 60.0, 25.0, 25.0]]}
    first, second = _iterations(records, workers=2, iters=2)
    assert (first.emulated_us, first.span_us, first.critical_worker) == (120.0, 120.0, 1)
    assert (second.emulated_us, second.span_us, second.critical_worker) == (85.0, 105.0, 1)
    assert second.start_offset_us == 20.0
    assert second.span_us == pytest.approx(second.compute_us + second.exposed_comm_us + second.start_offset_us)
    assert first.emulated_us + second.emulated_us == 205.0  # the run: first start to last end


def test_an_iteration_not_every_worker_finished_is_left_out() -> None:
    records = {0: [[0.0, 100.0, 60.0, 40.0, 40.0], [100.0, 190.0, 60.0, 30.0, 30.0]],
               1: [[0.0, 120.0, 60.0, 60.0, 60.0]]}
    (only,) = _iterations(records, workers=2, iters=2)
    assert only.emulated_us == only.span_us == 120.0
    assert _iterations({0: records[0]}, workers=2, iters=2) == []  # a worker without records: none
