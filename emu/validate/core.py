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

Nothing is lost to one bad run: every real run (a measurement or a capture) runs in its
own folder and is run once more if it crashes; a case that still fails is recorded as
failed, with the log its error names kept, and validation goes on. With a report path,
the report is rewritten (atomically) after every case, so an interrupted validation
keeps what it finished; ``complete`` says whether it got to the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from emu.capture import CaptureConfig, capture_model, import_kineto
from emu.capture.launcher import RankNetwork, run_ranks
from emu.emulator.links.spec import LinkSpec
from emu.errors import CaptureError, ConfigError, EmuError
from emu.files import make_folder
from emu.lifetime import current
from emu.replay import ReplayConfig, ReplayError, replay
from emu.traces import save_trace
from emu.traces.model import Trace
from emu.traces.noise import MachineLoad, cpu_ticks, profiled_step_us
from emu.validate import netns
from emu.validate.fit import fit_link
from emu.validate.report import (
    CaseFailure,
    CaseKind,
    CaseResult,
    Prediction,
    ValidateReport,
    case_result,
    error_pct,
    save_report,
    summarize,
)
from emu.validate.truth import Setting, Truth, capture_flags, shaped_link

PROBE_SECONDS = 1.0
CAPTURE_WINDOWS = 3  # as `emu capture`'s default: a window whose steps vary past STEP_CV is taken again
A100_TRACE = Path(__file__).parent / "data" / "a100-ddp-nccl-world2-rank0.json.gz"


# the unshaped settings' steps vary most from one to the next, then 1 Gbit/s's (Setting.sample)
DEFAULT_SETTINGS = (
    Setting("unshaped/25MB", None, 25, 4), Setting("1Gbit/25MB", 1e9, 25, 2), Setting("300Mbit/25MB", 300e6, 25),
    Setting("100Mbit/25MB", 100e6, 25), Setting("unshaped/4MB", None, 4, 4), Setting("300Mbit/4MB", 300e6, 4),
)
QUICK_SETTINGS = (Setting("unshaped/25MB", None, 25, 4), Setting("300Mbit/25MB", 300e6, 25))
PROFILED_STEPS = 5  # a validation capture's profiled steps, times its setting's sample


def _link(setting: Setting, trace: Trace) -> LinkSpec:
    if _fitted(setting):
        return fit_link(trace).link()
    return shaped_link(setting.rate_bps)


def _fitted(setting: Setting) -> bool:
    """Whether the setting's link is fitted to its capture (unshaped: what the veth and gloo
    actually deliver), not the tbf's rate."""
    return setting.rate_bps is None


@dataclass(frozen=True)
class Measured:
    """A real run's timed steps: their times, the least share of a core a rank's compute thread
    got while ready to run, and the machine's busy share of its cores (None: not Linux)."""

    step_us: list[float]
    core_share: float | None
    machine_busy: float | None
    ready_us: float | None = None  # per step, the ranks' main threads' time ready (on a core or waiting for one)


def measure(model: str, setting: Setting, steps: int, network: RankNetwork | None, times_out: Path,
            rundir: Path) -> Measured:
    """A real run without the profiler: ``steps`` - 1 timed steps, from optimizer step to
    optimizer step, after 3 untimed steps. The ranks' logs go to rundir."""
    # Through the ranks' entry point with no profiled step: no profiler, and the rank ends the
    # way captured ranks do (emu.capture.inject explains why that matters to gloo).
    argv = [sys.executable, "-m", "emu.capture", "--out", str(rundir), "--warmup", "0", "--steps", "0", "--",
            "-m", "emu.capture.workload", "--model", model, "--steps", str(steps + 3),
            "--bucket-cap-mb", str(setting.bucket_cap_mb), "--times-out", str(times_out), "--skip", "3"]
    run_ranks(argv, 2, rundir, timeout_s=1800, network=network)
    doc = json.loads(times_out.read_text())
    shares, ready = doc.get("core_shares"), doc.get("thread_ready_us")
    return Measured(doc["step_us"], min(shares) if shares else None, doc.get("machine_busy"),
                    statistics.fmean(ready) if ready else None)


def predict(trace: Trace, link: LinkSpec) -> Prediction:
    """The replay's iterations, on the synchronized clock (exact by construction)."""
    r = replay(trace, ReplayConfig(workers=trace.meta.world_size, fabric="ring", link=link))
    if not r.emulator.trustworthy:
        raise ReplayError(f"the replay of {trace.meta.model} is not trustworthy: {r.emulator.advice}")
    return Prediction.of(r)


def _spread(times: list[float]) -> float:
    q = statistics.quantiles(times, n=10)
    return (q[-1] - q[0]) / 2


T = TypeVar("T")


@dataclass
class _Progress:
    """The cases so far, saved after each one when there is a report path."""

    path: Path | None
    cases: list[CaseResult] = field(default_factory=list)
    failures: list[CaseFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self, complete: bool) -> ValidateReport:
        return ValidateReport(cases=tuple(self.cases), summary=summarize(self.cases, len(self.failures)),
                              notes=tuple(self.notes), failures=tuple(self.failures), complete=complete)

    def save(self, complete: bool = False) -> None:
        if self.path is not None:
            save_report(self.report(complete), self.path)

    def fail(self, name: str, error: str) -> None:
        self.failures.append(CaseFailure(name, error))
        self.save()

    def case(self, name: str, make: Callable[[], CaseResult]) -> None:
        """Add the case ``make`` gives, or record it as failed if emu could not make it."""
        try:
            self.cases.append(make())
        except EmuError as exc:
            self.failures.append(CaseFailure(name, str(exc)))
        self.save()


@dataclass
class _Runs:
    """Every real run in its own folder under ``root``. A successful run's folder goes (its
    outputs are elsewhere); a failed one's stays, since its error names a log in it."""

    root: Path
    progress: _Progress
    failed: bool = False  # some folder was kept

    def run(self, case: str, what: str, slug: str, run: Callable[[Path], T]) -> T:
        """``run(folder)``, once more if it crashed; raises CaptureError if it crashed twice."""
        for attempt in (1, 2):
            folder = make_folder(self.root / f"{slug}-{attempt}", f"{case}'s files")
            try:
                result = run(folder)
            except CaptureError as exc:
                self.failed = True
                if attempt == 2:
                    raise CaptureError(f"{what} failed twice, the second time: {exc}") from None
                # A real run can crash for reasons of its own (the machine, gloo); one more try
                # tells those from a case that cannot run. The first crash stays on record.
                self.progress.notes.append(f"{case}: {what} failed and ran again: {exc}")
                continue
            shutil.rmtree(folder, ignore_errors=True)
            return result
        raise AssertionError("unreachable")


def run_validation(models: tuple[str, ...] = ("mlp", "cnn"), settings: tuple[Setting, ...] = DEFAULT_SETTINGS,
                   steps: int = 20, a100_trace: Path | None = A100_TRACE, calibrate: bool = False,
                   keep: Path | None = None, report_path: Path | None = None,
                   on_status: Callable[[str], None] | None = None, runs_too: bool = True) -> ValidateReport:
    """Run every case; ``calibrate`` adds, per capture, a replay with the link fitted to the
    capture's own observed collective times; ``runs_too`` adds, per setting, ``emu run`` of the
    same workload with both ranks real; ``keep`` is a folder that gets every captured
    trace and every real run's step times (otherwise they go with a temporary folder, kept
    only if a run failed, for its logs); ``report_path`` gets the report after every case."""
    def status(text: str) -> None:
        if on_status is not None:
            on_status(text)

    if keep is not None:
        make_folder(keep, "--keep's traces and step times", ConfigError)
    progress = _Progress(report_path)
    progress.save()  # an unwritable path fails now, not after the first case
    why_not = netns.available()
    if why_not:
        progress.notes.append(f"{why_not}: only the unshaped loopback cases ran")
        settings = tuple(s for s in settings if s.rate_bps is None)
    if keep is not None:
        work = keep
    else:
        work = Path(tempfile.mkdtemp(prefix="emu-validate-"))
        record = current()
        if record is not None:  # `emu clean` removes it if this run is killed outright
            record.add_folder(str(work))
    runs = _Runs(work / "runs", progress)
    try:
        for model in models:
            traces: dict[str, Trace] = {}
            truths: dict[str, Truth] = {}  # each setting's real runs, by its name
            for setting in settings:
                name, n = f"{model} {setting.name}", steps * setting.sample
                try:
                    truth, trace = _trusted_runs(name, model, setting, n, runs, work, status, not why_not, progress)
                except EmuError as exc:
                    progress.fail(name, str(exc))
                    continue
                traces[setting.name], truths[setting.name] = trace, truth
                if keep is not None:
                    save_trace(trace, keep / f"{_slug(model, setting)}.json.gz")
                status(f"{model} at {setting.name}: replay")
                progress.case(name, partial(_replayed, name, CaseKind.SAME, truth, trace, trace))
                if runs_too:
                    status(f"{model} at {setting.name}: emu run")
                    label = f"{name} (emu run)"
                    after = partial(_real_after, model, setting, n, runs, work, not why_not, status)
                    # as many steps as the real runs: its live compute varies as theirs does (three emu runs of
                    # mlp unshaped/4MB at 20 steps, back to back: compute 24.5, 27.0, 26.5 ms a step); about
                    # 0.4 s of wall time a step unshaped, 1 to 3 s on the slow links (2026-12-05)
                    progress.case(label, partial(_emu_run, label, model, n, truth, trace, after,
                                                 progress.notes.append))
                if calibrate and setting.rate_bps is not None:
                    progress.case(f"{name} (fitted link)", partial(_calibrated, f"{name} (fitted link)", truth,
                                                                   trace))
                base = next((s for s in settings if s.rate_bps is None
                             and s.bucket_cap_mb == setting.bucket_cap_mb and s.name in traces), None)
                if setting.rate_bps is not None and base is not None:
                    label = f"{name} from {base.name}"
                    progress.case(label, partial(_replayed, label, CaseKind.EXTRAPOLATED, truth, traces[base.name],
                                                 trace, truths[base.name]))
        if a100_trace is not None and a100_trace.exists():
            status("A100 NCCL trace: replays with links fitted to the other steps")
            progress.case("a100-nccl world 2 (link fitted to the other steps)", partial(_a100, a100_trace))
    finally:
        if runs.failed:
            progress.notes.append(f"the logs of the runs that failed are kept in {runs.root}")
            progress.save()
        elif keep is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(runs.root, ignore_errors=True)
    progress.save(complete=True)
    return progress.report(complete=True)


def _slug(model: str, setting: Setting) -> str:
    return f"{model}-{setting.name.replace('/', '-')}"


RERUNS = 2  # a setting whose truth is flagged runs again at most this many times


def _trusted_runs(name: str, model: str, setting: Setting, steps: int, runs: _Runs, work: Path,
                  status: Callable[[str], None], namespaces: bool, progress: _Progress) -> tuple[Truth, Trace]:
    """A setting's real runs and capture, run again (at most ``RERUNS`` times) while their truth
    is flagged (``Truth.flags``); the last is kept, and the notes say why each ran again."""
    for attempt in range(RERUNS + 1):
        real = _real_runs(model, setting, steps, runs, work, status, namespaces)
        truth = Truth(setting, statistics.median(real.step_us), _spread(real.step_us), real.delivered_bps,
                       real.other_cores, real.retransmitted, real.core_share, real.machine_busy, real.halves_us,
                       real.both_ways_bps, real.ready_us)
        flags = truth.flags(real.trace)
        if not flags or attempt == RERUNS:
            return truth, real.trace
        progress.notes.append(f"{name}: its real runs and capture ran again ({'; '.join(flags)})")
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _RealRuns:
    """What a setting's real runs and capture gave, and how the machine and link were meanwhile."""

    step_us: list[float]
    halves_us: tuple[float, float]  # the median step of the run before the capture, and after it
    trace: Trace
    delivered_bps: float | None  # the lower probe's payload rate; None: unshaped, or no namespaces
    other_cores: float | None  # the busier real run's ``MachineLoad.other_cores``; None: no /proc/stat
    retransmitted: float | None  # TCP's retransmitted share of its segments; None: no namespaces
    core_share: float | None  # the least share of a core a rank got while ready (``measure``)
    machine_busy: float | None  # the busier real run's busy share of the machine's cores (``measure``)
    both_ways_bps: float | None = None  # the lower two-way probe's slower direction; None as ``delivered_bps``
    ready_us: float | None = None  # the runs' ``Measured.ready_us``, weighted by their steps


def _real_runs(model: str, setting: Setting, steps: int, runs: _Runs, work: Path, status: Callable[[str], None],
               namespaces: bool) -> _RealRuns:
    """The real step times of a setting (two runs), its capture, in its network (two
    namespaces; loopback where they cannot be made), what the shaped link delivered in probe
    transfers before the first run and after the last, the load beside the real runs and TCP's
    retransmissions in the namespaces."""
    name, slug = f"{model} {setting.name}", _slug(model, setting)
    with netns.TwoHosts(setting.rate_bps) if namespaces else contextlib.nullcontext() as hosts:
        net = hosts.network if hosts else None

        def probe() -> tuple[float, float] | None:  # one way, then both ways at once
            if hosts is None or setting.rate_bps is None:
                return None
            status(f"{model} at {setting.name}: probe transfers")
            nbytes = int(min(64 << 20, setting.rate_bps / 8 * PROBE_SECONDS))
            return hosts.probe(nbytes), hosts.probe_both_ways(nbytes)

        before = probe()

        def real(part: str, n: int) -> tuple[Measured, MachineLoad | None]:
            return runs.run(name, f"real run {part}", f"{slug}-real-{part}", lambda d: _watched(
                lambda: measure(model, setting, n, net, work / f"times-{slug}{part}.json", d)))

        # Real runs before and after the capture, pooled: this machine drifts (shared cores),
        # and a drift between truth and capture is not the error of the emulator.
        status(f"{model} at {setting.name}: real run, first half")
        run_a, load_a = real("a", (steps + 1) // 2)
        status(f"{model} at {setting.name}: capture")
        trace = runs.run(name, "capture", f"{slug}-capture", lambda d: capture_model(
            model, CaptureConfig(profile_steps=PROFILED_STEPS * setting.sample, warmup=3, network=net, keep_kineto=d,
                                 windows=CAPTURE_WINDOWS),
            bucket_cap_mb=setting.bucket_cap_mb))
        status(f"{model} at {setting.name}: real run, second half")
        run_b, load_b = real("b", steps // 2 + 1)
        after = probe()
        sent, retransmitted = hosts.tcp_segments() if hosts else (0, 0)
    loads = [x.other_cores for x in (load_a, load_b) if x is not None]
    shares = [x.core_share for x in (run_a, run_b) if x.core_share is not None]
    busy = [x.machine_busy for x in (run_a, run_b) if x.machine_busy is not None]
    ready = [(x.ready_us, len(x.step_us)) for x in (run_a, run_b) if x.ready_us is not None]
    return _RealRuns(step_us=run_a.step_us + run_b.step_us, trace=trace,
                     halves_us=(statistics.median(run_a.step_us), statistics.median(run_b.step_us)),
                     delivered_bps=None if before is None or after is None else min(before[0], after[0]),
                     both_ways_bps=None if before is None or after is None else min(before[1], after[1]),
                     other_cores=max(loads) if loads else None,
                     retransmitted=retransmitted / sent if hosts and sent else None,
                     core_share=min(shares) if shares else None, machine_busy=max(busy) if busy else None,
                     ready_us=sum(r * n for r, n in ready) / sum(n for _, n in ready) if ready else None)


def _watched(run: Callable[[], T]) -> tuple[T, MachineLoad | None]:
    """``run()``, and the machine while it ran: the ranks are this process's children that ended
    in it (``os.times``), everything else busy is other processes' or the kernel's."""
    m0, t0, w0 = cpu_ticks(), os.times(), time.monotonic()
    out = run()
    m1, t1, w1 = cpu_ticks(), os.times(), time.monotonic()
    if m0 is None or m1 is None:
        return out, None
    ranks = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
    busy, steal, total = (b - a for a, b in zip(m0, m1, strict=True))
    return out, MachineLoad(busy_s=busy, steal_s=steal, total_s=total, ranks_cpu_s=ranks, wall_s=w1 - w0)


def _replayed(name: str, kind: CaseKind, truth: Truth, trace: Trace, linked: Trace,
              captured: Truth | None = None) -> CaseResult:
    """``trace`` replayed with the link of the truth's setting (fitted to ``linked`` where unshaped),
    and with the link at the rate it delivered."""
    case = case_result(name, kind, truth, predict(trace, _link(truth.setting, linked)),
                       flags=truth.flags(trace, captured))
    if kind == CaseKind.SAME:
        case = replace(case, error_vs_capture_pct=error_pct(case.predicted_us, profiled_step_us(trace)))
    link = truth.delivered_link()
    if link is not None:
        case = replace(case, error_vs_delivered_pct=error_pct(predict(trace, link).step_us, truth.measured_us))
    link = truth.delivered_link(both_ways=True)
    if link is not None:
        case = replace(case, error_vs_both_ways_pct=error_pct(predict(trace, link).step_us, truth.measured_us))
    return case


def _calibrated(name: str, truth: Truth, trace: Trace) -> CaseResult:
    fit = fit_link(trace)
    case = case_result(name, CaseKind.CALIBRATED, truth, predict(trace, fit.link()),
                       f"fit {fit.bandwidth_bps / 1e9:.3f} Gb/s ({fit.method})", flags=truth.flags(trace))
    return replace(case, error_vs_capture_pct=error_pct(case.predicted_us, profiled_step_us(trace)))


def _a100(path: Path) -> CaseResult:
    """Each step of the A100 trace predicted with a link fitted to its other steps (leave one
    out), so that no step is predicted from its own collective times."""
    trace = import_kineto([path])
    n = trace.iterations
    if n < 2:
        raise ConfigError(f"{path}: {n} step; a held-out fit needs two")
    measured, predicted, fits = [], [], []
    for i in range(n):
        rest = _steps(trace, [j for j in range(n) if j != i])
        fit = fit_link(rest)
        fits.append(fit)
        predicted.append(predict(_steps(trace, [i]), fit.link()))
        measured.append(statistics.median(r.iterations[i].measured_us for r in trace.ranks))
    truth = Truth(Setting("a100", None, 0), statistics.median(measured), (max(measured) - min(measured)) / 2, None)
    median = Prediction(statistics.median(p.step_us for p in predicted),
                        statistics.median(p.compute_us for p in predicted),
                        statistics.median(p.exposed_comm_us for p in predicted))
    return case_result("a100-nccl world 2 (link fitted to the other steps)", CaseKind.HELD_OUT, truth, median,
                       f"{n} steps, each predicted with a link fitted to the others: "
                       f"{min(f.bandwidth_bps for f in fits) / 1e9:.1f} to "
                       f"{max(f.bandwidth_bps for f in fits) / 1e9:.1f} Gb/s")


def _steps(trace: Trace, keep: list[int]) -> Trace:
    """The trace with only the iterations ``keep`` of every rank."""
    return replace(trace, ranks=tuple(replace(r, iterations=tuple(r.iterations[i] for i in keep))
                                      for r in trace.ranks))


def _emu_run(name: str, model: str, steps: int, truth: Truth, trace: Trace, after: Callable[[], float],
             note: Callable[[str], None]) -> CaseResult:
    """``emu run --workers 2 --real 2`` of the workload the real runs ran: both ranks real, their
    compute measured live with no profiler, the network emulated with the setting's link (as the
    ``same`` case's replay has it); the prediction is the median emulated step. ``after()``: a real
    run right after it (its median step), which tells whether the machine kept the real runs'
    speed; emu run and it run again (at most ``RERUNS`` times) while it did not."""
    from emu.run.session import RunConfig, run_job

    setting = truth.setting
    argv = ["python", "-m", "emu.capture.workload", "--model", model, "--steps", str(steps + 3),
            "--bucket-cap-mb", str(setting.bucket_cap_mb)]
    config = RunConfig(replay=ReplayConfig(workers=2, fabric="ring", link=_link(setting, trace)), real=2, warmup=3)
    # unshaped, the link is fitted to the capture: what makes the capture not the setting's makes
    # the link not its either, and no run of emu run again changes it
    fitted = () if not _fitted(setting) else tuple(
        f"its link is fitted to a capture that may not be the setting's: {f}" for f in capture_flags(trace, truth))
    held = truth.flags(None)  # the truth's own flags: no run of emu run again changes them
    for attempt in range(RERUNS + 1):
        result = run_job(argv, config, cores=max(2, os.cpu_count() or 1))
        if not result.report.verification.ok or not result.report.emulator.trustworthy:
            raise ReplayError(f"emu run of {model} at {setting.name}: verification or trust failed")
        if result.checked.mismatches:  # the real ranks' own check of the results they were given
            raise ReplayError(f"emu run of {model} at {setting.name}: {result.checked.mismatches} of the real "
                              "ranks' results did not match what the ranks contributed")
        predicted = Prediction.of(result.report)
        try:
            after_us: float | None = after()
        except EmuError as exc:  # emu run's result stands; the case says what it could not check
            after_us, flags = None, (*held, *fitted, f"the real run after emu run failed ({exc}): its "
                                     "speed then is not known")
            break
        flags = truth.run_flags(after_us, predicted.compute_us)
        moved = flags[len(held):]  # what another emu run can change
        flags += fitted
        if not moved or held or fitted or attempt == RERUNS:  # a truth or link flagged stays so
            break
        note(f"{name}: emu run ran again ({'; '.join(moved)})")
    case = case_result(name, CaseKind.RUN, truth, predicted,
                 f"{len(result.trace.ranks[0].iterations)} steps, compute on the thread CPU clock", flags=flags)
    return replace(case, real_after_us=after_us)


def _real_after(model: str, setting: Setting, steps: int, runs: _Runs, work: Path, namespaces: bool,
                status: Callable[[str], None]) -> float:
    """The median step of a real run of the setting (``_real_runs``' second half's length), in
    its network, right after an emu run of it (``Truth.run_flags``)."""
    name, slug = f"{model} {setting.name}", _slug(model, setting)
    status(f"{model} at {setting.name}: real run after emu run")
    with netns.TwoHosts(setting.rate_bps) if namespaces else contextlib.nullcontext() as hosts:
        net = hosts.network if hosts else None
        got = runs.run(name, "real run after emu run", f"{slug}-real-after", lambda d: measure(
            model, setting, steps // 2 + 1, net, work / f"times-{slug}after.json", d))
    return statistics.median(got.step_us)
