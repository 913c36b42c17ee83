"""``emu validate``: real data-parallel runs against their emulation, case by case.

A setting is a network (a tbf-shaped rate, or unshaped) and a DDP bucket size. For each
setting and model: the real step time is measured without the profiler (its overhead
is not the truth), over enough steps to report a spread; a trace is captured at the
same setting; the prediction replays it at the same world size with the link of that
setting (``same``). Shaped settings are also predicted from the trace captured unshaped
with the same bucket size (``extrapolated``). Runs with root go in two network
namespaces joined by a veth pair (``emu.validate.netns``); without root only the
unshaped loopback cases run. The A100 NCCL trace shipped with the tests is replayed with
a link fitted to its own observed collective times (``calibrated``).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from emu.capture import CaptureConfig, capture_model, import_kineto
from emu.capture.launcher import RankNetwork, run_ranks
from emu.emulator.links import LinkSpec
from emu.replay import ReplayConfig, ReplayError, replay
from emu.traces import save_trace
from emu.traces.model import Trace
from emu.validate import netns
from emu.validate.fit import fit_link

# tbf counts the Ethernet frame without preamble, FCS and gap (1514 bytes for a full TCP
# segment of 1448 bytes of payload); emu counts every byte on the wire (1538 for 1456).
# The link that moves payload at the same rate as a tbf of rate R has this bandwidth:
TBF_TO_WIRE = (1448 / 1514) / (1456 / 1538)
A100_TRACE = Path(__file__).parent / "data" / "a100-ddp-nccl-world2-rank0.json.gz"
VETH_LATENCY_US = 20.0


@dataclass(frozen=True)
class Setting:
    name: str
    rate_bps: float | None  # tbf rate; None: unshaped
    bucket_cap_mb: float


class CaseKind(str, Enum):
    SAME = "same"  # the trace captured at this very setting, replayed with its link
    EXTRAPOLATED = "extrapolated"  # a trace captured unshaped, replayed with this setting's link
    CALIBRATED = "calibrated"  # the trace replayed with a link fitted to its own collectives


@dataclass(frozen=True)
class CaseResult:
    name: str
    kind: CaseKind
    measured_us: float
    spread_us: float  # half the range between the 10th and 90th percentile of the steps
    predicted_us: float
    error_pct: float
    detail: str = ""


@dataclass(frozen=True)
class ValidateReport:
    cases: tuple[CaseResult, ...]
    summary: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        cases = [{**c.__dict__, "kind": c.kind.value} for c in self.cases]
        return {"cases": cases, "summary": self.summary, "notes": list(self.notes)}


DEFAULT_SETTINGS = (
    Setting("unshaped/25MB", None, 25), Setting("1Gbit/25MB", 1e9, 25), Setting("300Mbit/25MB", 300e6, 25),
    Setting("100Mbit/25MB", 100e6, 25), Setting("unshaped/4MB", None, 4), Setting("300Mbit/4MB", 300e6, 4),
)
QUICK_SETTINGS = (Setting("unshaped/25MB", None, 25), Setting("300Mbit/25MB", 300e6, 25))


def _link(setting: Setting, trace: Trace) -> LinkSpec:
    if setting.rate_bps is None:
        return fit_link(trace).link()  # unshaped: what the veth and gloo actually deliver
    return LinkSpec(bandwidth_bps=setting.rate_bps * TBF_TO_WIRE, latency_us=VETH_LATENCY_US)


def measure(model: str, setting: Setting, steps: int, network: RankNetwork | None, workdir: Path,
            part: str = "") -> list[float]:
    """Step times (us) of a real run without the profiler: ``steps`` - 1 of them, from
    optimizer step to optimizer step, after 3 untimed steps."""
    out = workdir / f"times-{model}-{setting.name.replace('/', '-')}{part}.json"
    argv = [sys.executable, "-m", "emu.capture.workload", "--model", model, "--steps", str(steps + 3),
            "--bucket-cap-mb", str(setting.bucket_cap_mb), "--times-out", str(out), "--skip", "3"]
    run_ranks(argv, 2, workdir, timeout_s=1800, network=network)
    return json.loads(out.read_text())["step_us"]


def predict(trace: Trace, link: LinkSpec) -> float:
    """The replay's median iteration, on the synchronized clock (exact by construction)."""
    r = replay(trace, ReplayConfig(workers=trace.meta.world_size, fabric="ring", link=link))
    if not r.emulator.trustworthy:
        raise ReplayError(f"the replay of {trace.meta.model} is not trustworthy: {r.emulator.advice}")
    return r.summary.iteration_us_median


def _spread(times: list[float]) -> float:
    q = statistics.quantiles(times, n=10)
    return (q[-1] - q[0]) / 2


def run_validation(models: tuple[str, ...] = ("mlp", "cnn"), settings: tuple[Setting, ...] = DEFAULT_SETTINGS,
                   steps: int = 20, a100_trace: Path | None = A100_TRACE, calibrate: bool = False,
                   keep: Path | None = None,
                   on_status: Callable[[str], None] | None = None) -> ValidateReport:
    """Run every case; ``calibrate`` adds, per capture, a replay with the link fitted to the
    capture's own observed collective times; ``keep`` is a folder that gets every captured
    trace and every real run's step times (otherwise they go with a temporary folder)."""
    def status(text: str) -> None:
        if on_status is not None:
            on_status(text)

    why_not = netns.available()
    notes = []
    if why_not:
        notes.append(f"{why_not}: only the unshaped loopback cases ran")
        settings = tuple(s for s in settings if s.rate_bps is None)
    cases: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="emu-validate-") as tmp:
        work = Path(tmp)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            work = keep
        for model in models:
            traces: dict[str, Trace] = {}
            for setting in settings:
                status(f"{model} at {setting.name}: real run, first half")
                with netns.TwoHosts(setting.rate_bps) if not why_not else contextlib.nullcontext() as hosts:
                    network = hosts.network if hosts else None
                    # Real runs before and after the capture, pooled: this machine drifts
                    # (shared cores), and a drift between truth and capture is not the error
                    # of the emulator.
                    times = measure(model, setting, (steps + 1) // 2, network, work, "a")
                    status(f"{model} at {setting.name}: capture")
                    trace = capture_model(model, CaptureConfig(profile_steps=5, warmup=3, network=network),
                                          bucket_cap_mb=setting.bucket_cap_mb)
                    status(f"{model} at {setting.name}: real run, second half")
                    times += measure(model, setting, steps // 2 + 1, network, work, "b")
                traces[setting.name] = trace
                if keep is not None:
                    save_trace(trace, keep / f"{model}-{setting.name.replace('/', '-')}.json.gz")
                measured = statistics.median(times)
                status(f"{model} at {setting.name}: replay")
                predicted = predict(trace, _link(setting, trace))
                cases.append(_case(f"{model} {setting.name}", CaseKind.SAME, measured, _spread(times), predicted))
                if calibrate and setting.rate_bps is not None:
                    fit = fit_link(trace)
                    cases.append(_case(f"{model} {setting.name} (fitted link)", CaseKind.CALIBRATED,
                                       measured, _spread(times), predict(trace, fit.link()),
                                       f"fit {fit.bandwidth_bps / 1e9:.3f} Gb/s ({fit.method})"))
                base = next((s for s in settings if s.rate_bps is None
                             and s.bucket_cap_mb == setting.bucket_cap_mb and s.name in traces), None)
                if setting.rate_bps is not None and base is not None:
                    predicted = predict(traces[base.name], _link(setting, trace))
                    cases.append(_case(f"{model} {setting.name} from {base.name}", CaseKind.EXTRAPOLATED, measured,
                                       _spread(times), predicted))
    if a100_trace is not None and a100_trace.exists():
        status("A100 NCCL trace: calibrated replay")
        trace = import_kineto([a100_trace])
        fit = fit_link(trace)
        measured = statistics.median(it.measured_us for r in trace.ranks for it in r.iterations)
        steps_us = [it.measured_us for r in trace.ranks for it in r.iterations]
        predicted = predict(trace, fit.link())
        cases.append(_case("a100-nccl world 2 (fitted link)", CaseKind.CALIBRATED, measured,
                           (max(steps_us) - min(steps_us)) / 2, predicted,
                           f"fit {fit.bandwidth_bps / 1e9:.1f} Gb/s, {fit.latency_us:.1f} us per hop"))
    return ValidateReport(cases=tuple(cases), summary=_summary(cases), notes=tuple(notes))


def _case(name: str, kind: CaseKind, measured: float, spread: float, predicted: float, detail: str = "") -> CaseResult:
    return CaseResult(name=name, kind=kind, measured_us=measured, spread_us=spread, predicted_us=predicted,
                      error_pct=100.0 * (predicted - measured) / measured, detail=detail)


def _summary(cases: list[CaseResult]) -> dict[str, float]:
    def stats(rows: list[CaseResult]) -> tuple[float, float]:
        errs = [abs(c.error_pct) for c in rows]
        return (statistics.fmean(errs), max(errs)) if errs else (0.0, 0.0)

    out = dict(zip(("mean_abs_error_pct", "max_abs_error_pct"), stats(cases), strict=True))
    for kind in CaseKind:
        mean, worst = stats([c for c in cases if c.kind == kind])
        out[f"{kind.value}_mean_abs_error_pct"] = mean
        out[f"{kind.value}_max_abs_error_pct"] = worst
    return out
