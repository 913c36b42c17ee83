"""Speedup, efficiency and plots of a sweep's rows: the right reference, and edge cases that must
not crash (ideal links, only estimates, only failures, one point)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.study.plots import write_plots
from emu.study.sweep import Row, Status, with_derived


def row(fabric: str, workers: int, ms: float | None, *, peers: str = "p", design: str | None = None,
        status: Status = Status.REPLAYED, bandwidth_bps: float | None = 10e9) -> Row:
    us = None if ms is None else ms * 1000
    return Row(trace="mlp", design=design, fabric=fabric, workers=workers, bandwidth_bps=bandwidth_bps,
               latency_us=5.0, loss=0.0, stragglers="", status=status, iteration_us_median=us,
               iteration_us_p99=us, compute_us=None if us is None else us / 2, comm_us=None,
               exposed_comm_us=None if us is None else us / 2, predicted_us=None, predict_error=None,
               verification_ok=status == Status.REPLAYED, trustworthy=True, peers=peers,
               slug=f"{fabric}-{workers}-{peers}")


def test_speedup_pairs_rows_of_the_same_configuration_only() -> None:
    # two designs (other jitter: other peers), each with ina and ring
    rows = with_derived([row("ina", 8, 50, peers="calm", design="calm"), row("ring", 8, 60, peers="calm", design="calm"),
                   row("ina", 8, 70, peers="noisy", design="noisy"), row("ring", 8, 140, peers="noisy", design="noisy")])
    assert [r.speedup for r in rows] == pytest.approx([60 / 50, 1.0, 140 / 70, 1.0])
    assert {r.speedup_over for r in rows} == {"ring"}


def test_efficiency_is_against_the_grids_fewest_workers_or_nothing() -> None:
    rows = with_derived([row("ina", 8, None, status=Status.FAILED), row("ina", 64, 50), row("ina", 512, 100)])
    assert [r.scaling_efficiency for r in rows] == [None, None, None]
    rows = with_derived([row("ina", 8, 40), row("ina", 64, 50), row("ring", 8, 40), row("ring", 1024, 80,
                                                                                    status=Status.ESTIMATE)])
    assert [r.scaling_efficiency for r in rows] == pytest.approx([1.0, 0.8, 1.0, 0.5])
    assert rows[3].speedup_estimated is True and rows[0].speedup_estimated is False


def test_unverified_replay_is_not_compared() -> None:
    bad = row("ina", 8, 10)
    bad = Row(**{**bad.__dict__, "verification_ok": False})
    rows = with_derived([bad, row("ring", 8, 20)])
    assert rows[0].speedup is None and rows[0].scaling_efficiency is None


@pytest.mark.parametrize("rows, files", [
    ([row("ina", 8, 50, bandwidth_bps=None), row("ring", 8, 60, bandwidth_bps=None)],
     {"iteration", "speedup", "efficiency", "breakdown"}),
    ([row("ring", 1024, 80, status=Status.ESTIMATE), row("ring", 2048, 90, status=Status.ESTIMATE)],
     {"iteration", "efficiency", "breakdown"}),  # one fabric: no speedup to draw
    ([row("ina", 8, None, status=Status.FAILED)], set()),
    ([row("ina", 8, 50)], {"iteration", "efficiency", "breakdown"}),
])
def test_plots_of_edge_cases(tmp_path: Path, rows: list[Row], files: set[str], recwarn) -> None:
    written = write_plots(tmp_path, with_derived(rows))
    assert {p.name.removeprefix("mlp-").removesuffix(".png") for p in written} == files
    for p in written:
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert not [w for w in recwarn if "No artists" in str(w.message)]


def test_an_older_runs_plots_do_not_stay_beside_new_tables(tmp_path: Path) -> None:
    """A rerun with other rows rewrites plots/ whole: a plot of the earlier run's rows that this
    run does not draw is removed, not left beside the new results (issue 37's full-disk audit)."""
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "cnn-iteration.png").write_bytes(b"\x89PNG old")
    (tmp_path / "plots" / "my-notes.png").write_bytes(b"\x89PNG the user's")  # not a name emu gives: kept
    written = write_plots(tmp_path, with_derived([row("ina", 8, 50)]))
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted([p.name for p in written] + ["my-notes.png"])
