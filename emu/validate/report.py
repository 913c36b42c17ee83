"""What ``emu validate`` reports: each case's result, the summary over them, and whether enough
of them are trusted (docs/FIDELITY.md). ``emu.validate.core`` runs the cases; this module holds
their records and arithmetic."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from emu.files import write_atomic
from emu.replay import ReplayReport
from emu.validate.truth import Truth

# a validation fails when fewer than this share of its cases, or no case of some setting, are trusted
TRUSTED_SHARE = 2 / 3


class CaseKind(str, Enum):
    SAME = "same"  # the trace captured at this very setting, replayed with its link
    EXTRAPOLATED = "extrapolated"  # a trace captured unshaped, replayed with this setting's link
    CALIBRATED = "calibrated"  # the trace replayed with a link fitted to its own collectives
    HELD_OUT = "held out"  # each step predicted with a link fitted to the trace's other steps
    RUN = "run"  # emu run of the same script, both ranks real, the network emulated with this setting's link


@dataclass(frozen=True)
class CaseResult:
    name: str
    kind: CaseKind
    measured_us: float
    spread_us: float  # half the range between the 10th and 90th percentile of the steps
    predicted_us: float
    error_pct: float
    detail: str = ""
    # what the shaped link delivered in probe transfers beside the real runs (payload bits a second,
    # the lower of a probe before them and one after; None: unshaped, or no namespaces)
    link_delivered_bps: float | None = None
    # the prediction replayed with the link at that delivered rate, against the real runs (None:
    # not measured, or an emu run case, whose live run is not repeated)
    error_vs_delivered_pct: float | None = None
    # the same with both hosts sending at once on one connection, as the ranks' all_reduces do (the
    # slower direction's payload rate, the lower of the two probes), and the prediction at that rate
    link_both_ways_bps: float | None = None
    error_vs_both_ways_pct: float | None = None
    # the prediction against the median profiled step of the very capture it replays (``same`` and
    # ``calibrated``; None for the other kinds): the replay's own error, without the machine's drift
    # between the capture and the real runs and without the profiler's overhead, which it includes
    error_vs_capture_pct: float | None = None
    # why the case's ground truth may not be what its setting says (docs/FIDELITY.md, "Trusted
    # cases"); empty: trusted
    flags: tuple[str, ...] = ()
    setting: str = ""  # the setting whose real runs are the case's truth (Setting.name)
    # cores other processes and the kernel kept busy beside the real runs (the busier run's; None:
    # no /proc/stat), and TCP's retransmitted share of its segments in the setting's namespaces
    # (None: loopback, no namespaces)
    real_other_cores: float | None = None
    tcp_retransmitted_share: float | None = None
    # the least share of a core a rank's compute got while ready to run in the real runs, and the
    # busier run's busy share of the machine's cores over its timed steps (None: not measured)
    real_core_share: float | None = None
    real_machine_busy: float | None = None
    # an emu run case: the median step of a real run of its setting right after emu run (the
    # machine's speed then; ``Truth.run_flags``); None for the other kinds
    real_after_us: float | None = None
    # where the step went (docs/FIDELITY.md, "Compute and communication, apart"): per step, the real
    # ranks' main threads' time on a core or ready for one (their compute as the thread saw it, the
    # mean over ranks and the setting's real runs; the rest of the step they were blocked, waiting for
    # their collectives), and the prediction's compute and communication not hidden behind it (the
    # critical worker's, medians over iterations); None: not measured
    real_ready_us: float | None = None
    predicted_compute_us: float | None = None
    predicted_exposed_comm_us: float | None = None


@dataclass(frozen=True)
class CaseFailure:
    """A case without a result: what failed, after one more try of a crashed real run, and
    where its log is (the error names it; the folder is kept)."""

    name: str
    error: str


@dataclass(frozen=True)
class ValidateReport:
    cases: tuple[CaseResult, ...]
    summary: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)
    failures: tuple[CaseFailure, ...] = field(default_factory=tuple)
    complete: bool = True  # False while running, and in the report of an interrupted validation

    def to_dict(self) -> dict:
        cases = [{**asdict(c), "kind": c.kind.value} for c in self.cases]
        return {"complete": self.complete, "cases": cases, "failed": [asdict(f) for f in self.failures],
                "summary": self.summary, "notes": list(self.notes)}


def save_report(report: ValidateReport, path: Path) -> None:
    """Write the report as JSON, whole or not at all (``emu.files.write_atomic``)."""
    write_atomic(path, json.dumps(report.to_dict(), indent=2) + "\n", "the validation report")


@dataclass(frozen=True)
class Prediction:
    """A replay's median iteration (a period, as the real runs' step), and the medians over
    iterations of its critical worker's compute and of the rest of the period (its communication
    not hidden behind compute, as the real ranks' blocked time is the rest of their step)."""

    step_us: float
    compute_us: float
    exposed_comm_us: float

    @classmethod
    def of(cls, report: ReplayReport) -> Prediction:
        its = report.iterations
        return cls(report.summary.iteration_us_median, statistics.median(i.compute_us for i in its),
                   statistics.median(i.emulated_us - i.compute_us for i in its))


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def case_result(name: str, kind: CaseKind, truth: Truth, predicted: Prediction, detail: str = "",
                flags: tuple[str, ...] = ()) -> CaseResult:
    """A case's result: ``predicted`` against the truth, with what the truth measured beside it."""
    return CaseResult(name=name, kind=kind, measured_us=truth.measured_us, spread_us=truth.spread_us,
                      predicted_us=predicted.step_us, error_pct=error_pct(predicted.step_us, truth.measured_us),
                      detail=detail, real_ready_us=truth.ready_us, predicted_compute_us=predicted.compute_us,
                      predicted_exposed_comm_us=predicted.exposed_comm_us,
                      link_delivered_bps=truth.delivered_bps, link_both_ways_bps=truth.both_ways_bps,
                      flags=flags, setting=truth.setting.name,
                      real_other_cores=truth.other_cores, tcp_retransmitted_share=truth.retransmitted,
                      real_core_share=truth.core_share, real_machine_busy=truth.machine_busy)


def summarize(cases: list[CaseResult], failed: int = 0) -> dict[str, float]:
    def stats(rows: list[CaseResult]) -> tuple[float, float]:
        errs = [abs(c.error_pct) for c in rows]
        return (statistics.fmean(errs), max(errs)) if errs else (0.0, 0.0)

    out = dict(zip(("mean_abs_error_pct", "max_abs_error_pct"), stats(cases), strict=True))
    trusted = [c for c in cases if not c.flags]
    for kind in CaseKind:
        mean, worst = stats([c for c in cases if c.kind == kind])
        out[f"{kind.value}_mean_abs_error_pct"] = mean
        out[f"{kind.value}_max_abs_error_pct"] = worst
        mean, worst = stats([c for c in trusted if c.kind == kind])
        out[f"{kind.value}_trusted_mean_abs_error_pct"] = mean
        out[f"{kind.value}_trusted_max_abs_error_pct"] = worst
    for kind in (CaseKind.SAME, CaseKind.CALIBRATED):  # every case's, flagged or not: no truth run in it
        errs = [abs(c.error_vs_capture_pct) for c in cases if c.kind == kind and c.error_vs_capture_pct is not None]
        out[f"{kind.value}_vs_capture_mean_abs_error_pct"] = statistics.fmean(errs) if errs else 0.0
        out[f"{kind.value}_vs_capture_max_abs_error_pct"] = max(errs, default=0.0)
    out["failed_cases"] = failed
    out["trusted_cases"] = len(trusted)
    out["flagged_cases"] = len(cases) - len(trusted)
    out["trusted"] = float(trusted_enough(cases))
    return out


def trusted_enough(cases: list[CaseResult] | tuple[CaseResult, ...]) -> bool:
    """At least ``TRUSTED_SHARE`` of the cases trusted, and a trusted case of every setting
    (docs/FIDELITY.md, "Trusted cases")."""
    if not cases:
        return True
    trusted = [c for c in cases if not c.flags]
    settings = {c.setting for c in cases}
    return len(trusted) >= TRUSTED_SHARE * len(cases) and settings <= {c.setting for c in trusted}
