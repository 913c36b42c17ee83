"""emu validate: the link fit, the error arithmetic, one real case end to end, and what a
validation keeps when a real run crashes or the validation is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emu.emulator.links.spec import LinkSpec
from emu.errors import CaptureError
from emu.traces import Coll, CollKind, Dtype, Iteration, RankProgram, Source, Trace, TraceMeta, Wait
from emu.validate import Setting, fit_link, run_validation
from emu.validate.fit import QUANTILE
from emu.validate.netns import available
from emu.validate.report import CaseKind, Prediction, case_result, summarize, trusted_enough
from emu.validate.truth import BOTH_WAYS_DATA, TCP_PAYLOAD, Truth, both_ways_payload_bps
from tests.conftest import as_in_a_terminal, processes_mentioning

# Rank 1 of every rank process (real run or capture) whose command line holds
# EMU_TEST_CRASH_ON aborts as it starts: a real process that really dies of SIGABRT, as
# gloo's abort did. Python imports sitecustomize from PYTHONPATH, which the ranks inherit.
CRASHER = """
import os, sys
argv = " ".join(sys.orig_argv)
if os.environ.get("RANK") == "1" and "emu.capture" in argv and os.environ["EMU_TEST_CRASH_ON"] in argv:
    with open(os.environ["EMU_TEST_CRASHES"], "a") as fh:
        fh.write(argv + "\\n")
    print("crashing on purpose", file=sys.stderr, flush=True)
    os.abort()
"""
CRASHING = Setting("unshaped/3.5MB", None, 3.5)


@pytest.fixture
def crashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Rank processes of the CRASHING setting abort; returns the file listing each crash."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CRASHER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("EMU_TEST_CRASHES", str(tmp_path / "crashes.txt"))
    monkeypatch.setenv("EMU_TEST_CRASH_ON", "--bucket-cap-mb 3.5")  # CRASHING's runs
    return tmp_path / "crashes.txt"


def step(step_us: float) -> Prediction:
    """A prediction of ``step_us`` a step, all of it compute."""
    return Prediction(step_us, step_us, 0.0)


def trace_with(times: dict[int, float], overlapping: bool = False) -> Trace:
    """One iteration of all_reduces of these element counts and observed times, one after the
    other (each waited for), or all issued at once."""
    ops = []
    for i, (count, observed) in enumerate(times.items()):
        ops.append(Coll(id=i, kind=CollKind.ALL_REDUCE, dtype=Dtype.FLOAT32, count=count, bytes=4 * count,
                        group_size=2, observed_us=observed))
        if not overlapping:
            ops.append(Wait(ids=(i,), blocked_us=observed))
    if overlapping:
        ops.append(Wait(ids=tuple(range(len(times))), blocked_us=max(times.values())))
    meta = TraceMeta(source=Source.SYNTHETIC, world_size=2, backend="gloo", device="cpu", framework="t",
                     dtype="float32", captured_at="x")
    return Trace(meta=meta, ranks=(RankProgram(0, (Iteration(0, 1.0, tuple(ops)),)),))


def captured(unprofiled_us: float, profiled_us: float | None = None) -> Trace:
    """A capture of one step that took ``profiled_us`` (default: as its unprofiled ones) under the
    profiler, and ``unprofiled_us`` a step without it (``meta.noise``)."""
    from emu.traces.model import CaptureNoise

    plain = trace_with({1000: 10.0})
    noise = CaptureNoise(0.01, 0.01, other_cores=0.1, unprofiled_step_us=unprofiled_us, unprofiled_steps=5)
    step = replace(plain.ranks[0].iterations[0], measured_us=profiled_us or unprofiled_us)
    return replace(plain, meta=replace(plain.meta, noise=noise), ranks=(replace(plain.ranks[0], iterations=(step,)),))


def test_alpha_beta_fit_recovers_the_link() -> None:
    bw, lat = 1e9, 30.0  # 1 Gb/s, 30 us per hop; ring of 2: 2 hops, 1 x bytes
    times = {n: 2 * lat + 4 * n * 8 / bw * 1e6 for n in (100_000, 1_000_000, 5_000_000)}
    fit = fit_link(trace_with(times))
    assert fit.method == "alpha-beta"
    assert fit.bandwidth_bps == pytest.approx(bw, rel=1e-6) and fit.latency_us == pytest.approx(lat, rel=1e-6)


def test_flat_times_fall_back_to_the_bandwidth_bound() -> None:
    fit = fit_link(trace_with({1_000_000: 5000.0, 4_000_000: 4000.0}))
    assert fit.method == "bandwidth bound" and fit.latency_us == 0
    assert fit.bandwidth_bps == pytest.approx(4_000_000 * 4 * 8 / 4000e-6)


def test_overlapping_collectives_fit_the_busy_period() -> None:
    # gloo runs two buckets at once: 16 MB and 8 MB sharing a 300 Mb/s link both end late;
    # an alpha-beta fit of these would find a latency of a hundred milliseconds.
    fit = fit_link(trace_with({4_000_000: 717_000.0, 2_000_000: 528_000.0}, overlapping=True))
    assert fit.method == "busy period" and fit.latency_us == 0
    assert fit.bandwidth_bps == pytest.approx(6_000_000 * 4 * 8 / 0.717)


def test_a_fit_does_not_grow_with_the_number_of_steps() -> None:
    """Per iteration the rank that waited least for the other (its time the link's), then the median
    over iterations (``QUANTILE``): 5 steps and 20 give about the same link, where the best over
    iterations (an extreme) came out faster the more steps a capture profiled (docs/FIDELITY.md)."""
    count = 6_000_000  # one 24 MB bucket a step, as the mlp's unshaped 25 MB captures

    def steps(times_us: list[float], overlapping: bool) -> Trace:
        ranks = []
        for rank, waited in ((0, 0.0), (1, 3000.0)):  # rank 1 came first and waited for rank 0
            its = []
            for i, t in enumerate(times_us):
                one = trace_with({count: t + waited} if not overlapping else {count // 2: t + waited, count // 4: 1.0},
                                 overlapping).ranks[0].iterations[0]
                its.append(replace(one, step=i))
            ranks.append(RankProgram(rank, tuple(its)))
        return replace(trace_with({1: 1.0}), ranks=tuple(ranks))

    rng = np.random.default_rng(7)
    times = list(20_000.0 * (1 + 0.15 * rng.random(20)))  # 20 to 23 ms, the link's own spread
    for overlapping in (False, True):
        five, twenty = fit_link(steps(times[:5], overlapping)), fit_link(steps(times, overlapping))
        assert five.method == twenty.method == ("busy period" if overlapping else "bandwidth bound")
        bits = 8 * 4 * (count if not overlapping else count // 2 + count // 4)
        for fit, n in ((five, 5), (twenty, 20)):
            assert fit.bandwidth_bps == pytest.approx(float(np.quantile(bits / (np.array(times[:n]) * 1e-6), QUANTILE)))
        assert twenty.bandwidth_bps == pytest.approx(five.bandwidth_bps, rel=0.05)


def test_implausible_latency_falls_back_to_the_bandwidth_bound() -> None:
    fit = fit_link(trace_with({4_000_000: 717_000.0, 2_000_000: 528_000.0}))
    assert fit.method == "bandwidth bound"


def test_error_arithmetic() -> None:
    def truth(measured: float, setting: str = "s") -> Truth:
        return Truth(Setting(setting, 300e6, 25), measured, 1.0, None)

    cases = [case_result("a", CaseKind.SAME, truth(100.0), step(103.0)),
             case_result("b", CaseKind.SAME, truth(200.0), step(190.0)),
             case_result("c", CaseKind.EXTRAPOLATED, truth(100.0), step(120.0))]
    assert [c.error_pct for c in cases] == pytest.approx([3.0, -5.0, 20.0])
    s = summarize(cases)
    assert s["same_mean_abs_error_pct"] == pytest.approx(4.0) and s["same_max_abs_error_pct"] == pytest.approx(5.0)
    assert s["extrapolated_max_abs_error_pct"] == pytest.approx(20.0)
    assert s["mean_abs_error_pct"] == pytest.approx(28 / 3) and s["max_abs_error_pct"] == pytest.approx(20.0)
    assert s["trusted"] == 1.0 and s["trusted_cases"] == 3


def test_cases_are_trusted_by_criteria_fixed_in_advance() -> None:
    """A link that delivered under 95% of its payload rate, or a capture on a busy machine, flags a
    case; a validation is trusted with two thirds of its cases trusted and one of every setting."""
    from emu.traces.model import CaptureNoise

    slow = Truth(Setting("300Mbit/25MB", 300e6, 25), 100.0, 1.0, 0.90 * 300e6 * TCP_PAYLOAD)
    fine = Truth(Setting("300Mbit/25MB", 300e6, 25), 100.0, 1.0, 0.99 * 300e6 * TCP_PAYLOAD)
    assert slow.flags(None) == ("the shaped link delivered 90% of its payload rate in the probes beside the real "
                                "runs (under 95%)",)
    assert fine.flags(None) == ()
    plain = trace_with({1000: 10.0})  # its one step set to the truth's 100 us (1 us: a trace at another speed)
    plain = replace(plain, ranks=(replace(plain.ranks[0], iterations=(replace(plain.ranks[0].iterations[0],
                                                                               measured_us=100.0),)),))
    busy = replace(plain, meta=replace(plain.meta, noise=CaptureNoise(0.01, 0.01, other_cores=1.0)))
    assert fine.flags(busy) == ("its capture's machine was busy: other processes kept 1.0 cores busy",)
    good = [case_result(n, CaseKind.SAME, fine, step(101.0)) for n in "ab"]
    assert trusted_enough([*good, case_result("c", CaseKind.SAME, slow, step(101.0), flags=slow.flags(None))])
    assert not trusted_enough([good[0], *(case_result(n, CaseKind.SAME, slow, step(101.0), flags=("x",)) for n in "bc")])
    other = Truth(Setting("unshaped/25MB", None, 25), 100.0, 1.0, None)
    assert not trusted_enough([*good, *good, case_result("d", CaseKind.SAME, other, step(101.0), flags=("x",))])
    # the two-way probe's slower direction gives a link of its own; it flags under 95% of the payload rate
    # less the other direction's acknowledgements (what emu's link gives a direction), not above it
    assert replace(fine, both_ways_bps=0.96 * both_ways_payload_bps(300e6)).flags(None) == ()
    both = replace(fine, both_ways_bps=0.90 * 300e6 * TCP_PAYLOAD)
    assert both.flags(None) == (
        "the shaped link delivered 92% of its payload rate both ways at once in the probes beside the real runs "
        "(under 95% of the 281 Mb/s emu's link gives a direction beside the other's acknowledgements: the machine, "
        "not the link, set the pace of the ranks' all_reduces)",)
    assert case_result("e", CaseKind.SAME, both, step(101.0)).link_both_ways_bps == both.both_ways_bps
    one, two = both.delivered_link(), both.delivered_link(both_ways=True)
    # the one-way probe's rate less the other direction's acknowledgements; the two-way one has them in it
    assert two.bandwidth_bps == pytest.approx(one.bandwidth_bps * 0.90 / 0.99 / BOTH_WAYS_DATA)
    assert fine.delivered_link(both_ways=True) is None
    # TCP retransmitting (packets lost or reordered on the machine), a busy machine beside the real runs
    lossy = replace(fine, retransmitted=2.5e-3, other_cores=0.7, core_share=0.6, machine_busy=0.97)
    assert lossy.flags(None) == (
        "TCP retransmitted 0.250% of its segments in the setting's namespaces (0.01% or more: packets lost or "
        "reordered on this machine)",
        "a rank's compute got 60% of a core while ready to run in the real runs (under 80%: the ranks and their "
        "networking had too few cores)",
        "the machine's cores were 97% busy during the real runs' timed steps (95% or more: the two hosts' ranks "
        "and networking had no core to spare, so the cores, not the link, set their pace)",
        "the real runs' machine was busy: other processes and the kernel kept 0.7 cores busy")
    assert replace(fine, retransmitted=2e-5, other_cores=0.2, core_share=0.86, machine_busy=0.94).flags(None) == ()
    case = case_result("e", CaseKind.SAME, lossy, step(101.0), flags=lossy.flags(None))
    assert (case.real_other_cores, case.tcp_retransmitted_share) == (0.7, 2.5e-3)
    assert (case.real_core_share, case.real_machine_busy) == (0.6, 0.97)


def test_a_same_configuration_case_is_also_judged_against_its_own_capture() -> None:
    """A ``same`` case's prediction against the median profiled step of the trace it replays (no
    real run in it); an extrapolated case replays another setting's capture and has none."""
    from emu.traces.noise import profiled_step_us
    from emu.validate.core import _replayed

    trace = trace_with({1_000_000: 5000.0, 4_000_000: 20000.0})
    trace = replace(trace, ranks=(replace(trace.ranks[0], iterations=(replace(trace.ranks[0].iterations[0],
                                                                               measured_us=30000.0),)),))
    truth = Truth(Setting("300Mbit/25MB", 300e6, 25), 40000.0, 1.0, None)
    same = _replayed("s", CaseKind.SAME, truth, trace, trace)
    assert profiled_step_us(trace) == 30000.0
    assert same.error_vs_capture_pct == pytest.approx(100 * (same.predicted_us / 30000.0 - 1))
    assert same.error_pct == pytest.approx(100 * (same.predicted_us / 40000.0 - 1))
    assert _replayed("e", CaseKind.EXTRAPOLATED, truth, trace, trace).error_vs_capture_pct is None
    s = summarize([same])
    assert s["same_vs_capture_mean_abs_error_pct"] == pytest.approx(abs(same.error_vs_capture_pct))


def test_a_truth_that_moved_or_a_capture_at_another_speed_is_flagged() -> None:
    """The real runs before and after the capture 4% or more apart, or the capture's own steps
    without the profiler 5% or more from the real runs' (its own setting's, for an extrapolated
    case), flag a case; closer, they do not."""
    fine = Truth(Setting("300Mbit/25MB", 300e6, 25), 100e3, 1.0, None, halves_us=(99e3, 102e3))
    assert fine.flags(None) == ()
    moved = replace(fine, halves_us=(96e3, 104e3))
    assert moved.flags(None) == ("the real runs before and after the capture took 96.0 and 104.0 ms a step (8% apart, "
                                 "4% or more: the machine's speed moved between them, so the truth is not one number)",)
    for halves in ((100e3, 104.5e3), (104.5e3, 100e3)):  # the slower over the faster, whichever came first
        assert "(4% apart, 4% or more" in replace(fine, halves_us=halves).flags(None)[0]
    assert fine.flags(captured(104e3)) == ()
    assert fine.flags(captured(94e3, 96e3)) == (
        "its capture's own steps without the profiler took 94.0 ms against the real runs' 100.0 ms at 300Mbit/25MB "
        "(-6%; 5% or more: the machine ran the workload at another speed while capturing, and the trace froze it)",)
    # an extrapolated case: the capture is the unshaped setting's, judged against that setting's truth
    unshaped = Truth(Setting("unshaped/25MB", None, 25), 50e3, 1.0, None, halves_us=(50e3, 50e3))
    assert fine.flags(captured(50.5e3), unshaped) == ()
    assert "at unshaped/25MB (+20%" in fine.flags(captured(60e3, 51e3), unshaped)[0]
    # ... whose own real runs moved: nothing to judge the capture against, though it agrees with their median
    # (cnn 300Mbit/25MB from unshaped/25MB trusted at -11.3%, the unshaped halves 9% apart, 2026-12-06 15:46)
    assert fine.flags(captured(50.5e3), replace(unshaped, halves_us=(48e3, 52.5e3))) == (
        "its capture's setting's real runs (unshaped/25MB) were 9% apart before and after it (4% or more): no one "
        "number to check the capture's speed against",)


def test_a_capture_whose_profiled_steps_ran_at_another_speed_is_flagged() -> None:
    """A capture's profiled steps (what the replay follows) 5% or more either way from its own
    steps without the profiler flag its cases, whatever the real runs took; closer, they do not.
    Its cases in three validations in a row (docs/FIDELITY.md): mlp unshaped/25MB trusted at +11.7%
    with its profiled steps 8% over its unprofiled ones."""
    fine = Truth(Setting("unshaped/25MB", None, 25), 55e3, 1.0, None, halves_us=(55e3, 55e3))
    plain = trace_with({1000: 10.0})
    plain = replace(plain, ranks=(replace(plain.ranks[0], iterations=(replace(plain.ranks[0].iterations[0],
                                                                               measured_us=56e3),)),))
    assert fine.flags(captured(55e3, 57.5e3)) == ()  # +4.5%
    assert fine.flags(captured(53e3, 57.2e3)) == (  # +4% from the truth, +8% from its own unprofiled steps
        "its capture's profiled steps took 57.2 ms against its own 53.0 ms without the profiler (+8%; 5% or more "
        "either way: the profiler's cost or the machine's drift over the capture is in the trace's compute)",)
    assert "(-6%; 5% or more either way: the machine's drift over" in fine.flags(captured(55e3, 51.7e3))[-1]
    # an import or an older trace timed no unprofiled steps: only its profiled ones are judged
    assert fine.flags(plain) == ()


def test_a_capture_whose_profiled_steps_ran_at_another_speed_than_the_truth_is_flagged() -> None:
    """The steps the replay follows 5% or more from the real runs' median flag a case, though the
    capture's unprofiled steps and its profiled ones are each within 5% of the next: the two limits
    together left up to 10% open (mlp unshaped/25MB's profiled steps 5.5% over the truth, trusted at
    +6.4%, 2026-12-06)."""
    fine = Truth(Setting("unshaped/25MB", None, 25), 64e3, 1.0, None, halves_us=(64e3, 64e3))
    assert fine.flags(captured(66e3, 67.5e3)) == (
        "its capture's profiled steps, which the replay follows, took 67.5 ms against the real runs' 64.0 ms at "
        "unshaped/25MB (+5%; 5% or more: the trace holds another speed than the truth's)",)
    assert fine.flags(captured(64e3, 61e3)) == ()  # -4.7%
    assert len(fine.flags(captured(64e3, 60.5e3))) == 2  # -5.5% from the truth and from its unprofiled steps


def test_an_emu_run_case_is_flagged_where_the_machine_moved_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run right after emu run 4% or more from the real runs flags its case, and emu run
    runs again (at most twice) while it does; the case keeps that run's median step."""
    from types import SimpleNamespace

    import emu.run.session
    from emu.validate import core

    truth = Truth(Setting("unshaped/25MB", None, 25), 90e3, 1.0, None, halves_us=(89e3, 91e3))
    assert truth.run_flags(93e3) == ()
    assert truth.run_flags(60e3) == ("a real run right after emu run took 60.0 ms a step against the real runs' 90.0 "
                                     "ms (50% apart, 4% or more: the machine's speed moved after the real runs, while "
                                     "emu run's ranks computed)",)
    runs = []

    def run_job(argv, config, cores):
        runs.append(argv)
        report = SimpleNamespace(verification=SimpleNamespace(ok=True), emulator=SimpleNamespace(trustworthy=True),
                                 summary=SimpleNamespace(iteration_us_median=62e3),
                                 iterations=[SimpleNamespace(compute_us=40e3, exposed_comm_us=22e3, emulated_us=62e3)])
        return SimpleNamespace(report=report, checked=SimpleNamespace(mismatches=0),
                               trace=SimpleNamespace(ranks=[SimpleNamespace(iterations=[1, 2, 3])]))

    monkeypatch.setattr(emu.run.session, "run_job", run_job)
    monkeypatch.setattr(core, "_link", lambda setting, trace: LinkSpec(bandwidth_bps=10e9))
    notes: list[str] = []
    afters = iter([60e3, 91e3])
    case = core._emu_run("mlp unshaped/25MB (emu run)", "mlp", 3, truth, None, lambda: next(afters), notes.append)
    assert len(runs) == 2 and case.flags == () and case.real_after_us == 91e3 and case.kind == "run"
    assert notes == ["mlp unshaped/25MB (emu run): emu run ran again (a real run right after emu run took 60.0 ms "
                     "a step against the real runs' 90.0 ms (50% apart, 4% or more: the machine's speed moved after "
                     "the real runs, while emu run's ranks computed))"]
    runs.clear()
    case = core._emu_run("x", "mlp", 3, truth, None, lambda: 60e3, notes.append)
    assert len(runs) == 3 and case.flags and case.real_after_us == 60e3  # still moved: the case says so
    runs.clear()
    moved_before = replace(truth, halves_us=(80e3, 100e3))  # its truth flagged already: no run again helps
    case = core._emu_run("x", "mlp", 3, moved_before, None, lambda: 60e3, notes.append)
    assert len(runs) == 1 and len(case.flags) == 2

    runs.clear()  # unshaped, the link is fitted to the capture: its flags are the case's, and no run again helps
    case = core._emu_run("x", "mlp", 3, truth, captured(92e3, 95e3), lambda: 60e3, notes.append)
    assert len(runs) == 1 and len(case.flags) == 2
    assert case.flags[1].startswith("its link is fitted to a capture that may not be the setting's: its capture's "
                                    "profiled steps, which the replay follows, took 95.0 ms")
    shaped = replace(truth, setting=Setting("300Mbit/25MB", 300e6, 25))  # its link is the tbf's, not the capture's
    assert core._emu_run("x", "mlp", 3, shaped, captured(92e3, 95e3), lambda: 91e3, notes.append).flags == ()

    def failed() -> float:
        raise CaptureError("the real run crashed twice")

    case = core._emu_run("x", "mlp", 3, truth, None, failed, notes.append)  # emu run's result stands, flagged
    assert case.predicted_us == 62e3 and case.real_after_us is None
    assert (case.predicted_compute_us, case.predicted_exposed_comm_us) == (40e3, 22e3)
    assert case.flags == ("the real run after emu run failed (the real run crashed twice): its speed then is not known",)


def test_an_emu_run_case_is_flagged_where_its_ranks_computed_at_another_speed_than_the_real_ones() -> None:
    """emu run's live compute 5% or more off the real ranks' time ready a step flags its case (the
    same work ran at another speed on the CPU than in the real runs): either way where the link is
    unshaped, only slower where it is shaped (the kernel's networking is in the ready time there)."""
    truth = Truth(Setting("unshaped/25MB", None, 25), 68.5e3, 1.0, None, halves_us=(68e3, 69e3), ready_us=60.3e3)
    assert truth.run_flags(67.5e3, 62.0e3) == ()  # 3% slower
    assert truth.run_flags(67.5e3, 58.0e3) == ()  # 4% faster
    assert truth.run_flags(67.5e3) == ()  # no live compute known
    assert truth.run_flags(67.5e3, 67.2e3) == (
        "emu run's ranks computed 67.2 ms a step on their CPU clock against the real ranks' 60.3 ms on a core or "
        "waiting for one (11% slower; 5% or more: the same work ran slower on the CPU during emu run than in the "
        "real runs, the machine and not the network)",)
    assert truth.run_flags(67.5e3, 54.0e3) == (
        "emu run's ranks computed 54.0 ms a step on their CPU clock against the real ranks' 60.3 ms on a core or "
        "waiting for one (12% faster; 5% or more: the same work ran faster on the CPU during emu run than in the "
        "real runs, the machine and not the network)",)
    shaped = replace(truth, setting=Setting("300Mbit/25MB", 300e6, 25))
    assert shaped.run_flags(67.5e3, 50.0e3) == ()  # faster than the ready time: its networking is in it
    assert len(shaped.run_flags(67.5e3, 67.2e3)) == 1
    assert replace(truth, ready_us=None).run_flags(67.5e3, 67.2e3) == ()  # an older truth: nothing to judge


@pytest.mark.skipif(available() is not None, reason=f"no network namespaces here: {available()}")
def test_two_hosts_deliver_their_rate_in_order() -> None:
    """The shaped veth pair delivers its rate to a real TCP transfer, each end's receive steered to
    one CPU of its own, and counts TCP's segments in its namespaces (none retransmitted)."""
    from emu.validate.netns import TwoHosts

    with TwoHosts(100e6) as hosts:
        masks = [subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{ns}/queues/rx-0/rps_cpus"],
                                capture_output=True, text=True, check=True).stdout.strip().lstrip("0,")
                 for ns in hosts.names]
        delivered = hosts.probe(4 << 20)
        sent, retransmitted = hosts.tcp_segments()
        both = hosts.probe_both_ways(4 << 20)  # each end sends the other 4 MB at once on one connection
        after, _ = hosts.tcp_segments()
    assert masks == (["1", "2"] if (os.cpu_count() or 1) > 1 else ["1", "1"])
    assert 0.95 * 100e6 * TCP_PAYLOAD < delivered < 1.1 * 100e6 * TCP_PAYLOAD
    assert sent > (4 << 20) / 1448 and retransmitted <= sent * 1e-4
    # a rate, not its accuracy: beside another test on this machine's two cores the two-way probe
    # got 74% (alone: 98 to 99%, docs/FIDELITY.md) and TCP retransmitted one of its segments
    assert 0.5 * 100e6 * TCP_PAYLOAD < both < 1.1 * 100e6 * TCP_PAYLOAD
    assert after - sent > 2 * (4 << 20) / 1448  # both directions' segments


@pytest.mark.slow
def test_a100_case_predicts_each_step_from_the_others(no_children) -> None:
    """No step is predicted with a link fitted to its own collectives (leave one out)."""
    report = run_validation(models=(), settings=())
    (case,) = report.cases
    assert case.kind == "held out" and 219_000 < case.measured_us < 225_000
    assert "each predicted with a link fitted to the others" in case.detail
    assert abs(case.error_pct) < 2.0


@pytest.mark.slow  # a real validation case: two real runs, a capture, replays (about 30 s)
def test_one_realcase_result(no_children) -> None:
    setting = Setting("300Mbit/25MB", 300e6, 25) if available() is None else Setting("unshaped/25MB", None, 25)
    report = run_validation(models=("mlp",), settings=(setting,), steps=3, a100_trace=None)
    same, run = report.cases
    assert (same.kind, run.kind) == ("same", "run") and run.name == f"mlp {setting.name} (emu run)"
    assert same.measured_us == run.measured_us > 0
    # three timed steps on a shared machine: a loose bound (FIDELITY.md has the full runs' figures);
    # at 300 Mbit/s the link dominates and both must come close
    bound = 15 if available() is None else 35
    assert abs(same.error_pct) < bound and abs(run.error_pct) < bound, report.cases
    # where the steps went: the real ranks' threads were ready for part of the step, blocked the
    # rest; each prediction's compute and exposed communication are parts of its step
    assert 0 < same.real_ready_us == run.real_ready_us < same.measured_us
    for case in (same, run):
        assert 0 < case.predicted_compute_us < case.predicted_us and 0 <= case.predicted_exposed_comm_us
        assert case.predicted_compute_us + case.predicted_exposed_comm_us <= 1.01 * case.predicted_us
    if available() is None:
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "emu-v" not in netns  # every namespace it made, it removed


def test_crashed_run_is_retried_once_then_recorded(crashes: Path, tmp_path: Path, no_children) -> None:
    report_file = tmp_path / "report.json"
    report = run_validation(models=("mlp",), settings=(CRASHING,), steps=3, a100_trace=None, keep=tmp_path / "keep",
                            report_path=report_file)
    assert len(crashes.read_text().splitlines()) == 2  # the first real run, and its one retry
    assert report.cases == () and len(report.failures) == 1
    (failure,) = report.failures
    assert failure.name == "mlp unshaped/3.5MB"
    assert failure.error.startswith("real run a failed twice") and "rank 1 was killed by SIGABRT: crashing on purpose" in failure.error
    log = Path(failure.error.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.parent.parent == tmp_path / "keep" / "runs"
    assert "crashing on purpose" in log.read_text()  # the log the message names is still there
    assert any("failed and ran again" in n for n in report.notes)
    saved = json.loads(report_file.read_text())
    assert saved["complete"] is True and saved["cases"] == []
    assert saved["failed"] == [{"name": failure.name, "error": failure.error}]
    assert saved["summary"]["failed_cases"] == 1
    assert processes_mentioning(str(log.parent)) == []


@pytest.mark.slow
def test_validation_with_a_failed_case_exits_1(crashes: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMU_TEST_CRASH_ON", "--model mlp")  # every mlp case; the A100 case has no run
    proc = subprocess.run([sys.executable, "-m", "emu", "validate", "--quick", "--steps", "3", "--keep",
                           str(tmp_path / "keep")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("emu: error: 2 of 3 cases failed (mlp unshaped/25MB, mlp 300Mbit")
    assert proc.stdout.count("│ failed ") == 2 and "a100-nccl" in proc.stdout
    assert "failed: mlp unshaped/25MB: real run a failed twice" in proc.stdout
    saved = json.loads((tmp_path / "keep" / "report.json").read_text())  # --keep's default report
    assert saved["complete"] is True and len(saved["cases"]) == 1 and len(saved["failed"]) == 2


@pytest.mark.slow
def test_other_cases_complete_after_a_failed_one(crashes: Path, tmp_path: Path, no_children) -> None:
    good = Setting("unshaped/25MB", None, 25)
    report = run_validation(models=("mlp",), settings=(CRASHING, good), steps=3, a100_trace=None,
                            keep=tmp_path / "keep", report_path=tmp_path / "report.json", runs_too=False)
    assert [f.name for f in report.failures] == ["mlp unshaped/3.5MB"]
    assert [c.name for c in report.cases] == ["mlp unshaped/25MB"] and report.cases[0].predicted_us > 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["complete"] is True and len(saved["cases"]) == 1 and len(saved["failed"]) == 1


@pytest.mark.slow
def test_interrupted_validation_keeps_finished_cases(no_leftovers: Path) -> None:
    report = no_leftovers / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "emu", "validate", "--quick", "--steps", "3", "--report",
                             str(report), "--keep", str(no_leftovers / "keep")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "NO_COLOR": "1"}, preexec_fn=as_in_a_terminal)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if report.exists() and json.loads(report.read_text())["cases"]:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1].decode()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    lines = err.decode().splitlines()
    assert lines[-1] == "emu: interrupted" and "Traceback" not in err.decode()
    saved = json.loads(report.read_text())
    assert saved["complete"] is False and [c["name"] for c in saved["cases"]] == ["mlp unshaped/25MB"]
    if available() is None:
        assert "emu-v" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_flagged_setting_runs_again_at_most_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from emu.validate import core

    setting = Setting("300Mbit/25MB", 300e6, 25)
    rates = iter([0.5, 0.6, 0.99, 0.99])  # shares of the payload rate the probes saw, run after run
    calls = []

    def real_runs(*args, **kwargs):
        calls.append(1)
        return core._RealRuns([100.0, 101.0, 99.0], (100.0, 100.5), trace_with({1000: 10.0}),
                              next(rates) * 300e6 * TCP_PAYLOAD, 0.1, 0.0, 0.98, 0.5)

    monkeypatch.setattr(core, "_real_runs", real_runs)
    progress = core._Progress(None)
    truth, _ = core._trusted_runs("mlp 300Mbit/25MB", "mlp", setting, 3, None, tmp_path, lambda _: None, True, progress)
    assert len(calls) == 3 and truth.flags(None) == () and len(progress.notes) == 2
    assert "ran again (the shaped link delivered 50% of its payload rate" in progress.notes[0]
    rates = iter([0.5, 0.5, 0.5])
    truth, _ = core._trusted_runs("x", "mlp", setting, 3, None, tmp_path, lambda _: None, True, core._Progress(None))
    assert truth.flags(None)  # the last kept, still flagged: the case says so


def test_a_setting_sample_multiplies_the_steps_of_its_real_runs_and_emu_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Setting.sample`` times the steps: the real runs (their capture's profiled steps follow the
    sample inside ``_real_runs``), ``emu run`` and the real run after it; a setting of sample 1 keeps
    the steps asked for."""
    from emu.validate import core

    asked: list[tuple[str, str, int]] = []

    def trusted_runs(name, model, setting, steps, *args):
        asked.append(("real", setting.name, steps))
        return Truth(setting, 100.0, 1.0, None), trace_with({1000: 10.0})

    def emu_run(name, model, steps, truth, trace, after, note):
        asked.append(("emu run", truth.setting.name, steps))
        asked.append(("real after", truth.setting.name, after.args[2]))  # _real_after(model, setting, steps, ...)
        return case_result(name, CaseKind.RUN, truth, step(100.0))

    monkeypatch.setattr(core, "_trusted_runs", trusted_runs)
    monkeypatch.setattr(core, "_emu_run", emu_run)
    monkeypatch.setattr(core, "_replayed", lambda name, kind, truth, *a: case_result(name, kind, truth, step(100.0)))
    monkeypatch.setattr(core.netns, "available", lambda: None)
    settings = (Setting("unshaped/4MB", None, 4, sample=4), Setting("300Mbit/4MB", 300e6, 4))
    report = core.run_validation(models=("mlp",), settings=settings, steps=5, a100_trace=None)
    assert asked == [("real", "unshaped/4MB", 20), ("emu run", "unshaped/4MB", 20), ("real after", "unshaped/4MB", 20),
                     ("real", "300Mbit/4MB", 5), ("emu run", "300Mbit/4MB", 5), ("real after", "300Mbit/4MB", 5)]
    assert len(report.cases) == 5  # same and run at each, and 300Mbit/4MB from unshaped/4MB


def test_a_shaped_link_moves_data_as_the_tbf_does_both_ways() -> None:
    """Both ranks send at once: each direction's tbf carries its 1,514-byte frames of 1,448 bytes of
    payload and, every two of the other direction's, a 66-byte acknowledgement. emu's link, counting
    the wire's 1,538 bytes for 1,456 of payload and nothing else, takes as long for the same data."""
    from emu.validate.truth import shaped_link

    rate, payload = 300e6, 25 * 1448 * 2000
    frames = payload / 1448
    tbf_s = (frames * 1514 + frames / 2 * 66) * 8 / rate
    link = shaped_link(rate)
    assert payload / 1456 * 1538 * 8 / link.bandwidth_bps == pytest.approx(tbf_s)
    assert link.latency_us == 20.0
