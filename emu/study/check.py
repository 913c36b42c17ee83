"""Current replay reports against a baseline: the library side of ``emu check``.

This module owns the tolerance's syntax, the pairing of two sets of reports by point
(``emu.study.reports.point_key``), each point's verdict, and the JUnit XML and Markdown
renderings of a comparison (strings; the caller writes them). The rules (docs/ci.md): a point's
``summary.iteration_us_median`` slower than the baseline's by more than the tolerance is a
regression; a current report that is incomplete, failed its verification or is not trustworthy
fails, as does a point present on one side only. Reports that cannot be read or paired are a
``ConfigError`` (exit 2); the caller turns a comparison that is not ``ok`` into ``CheckFailed``.
"""

from __future__ import annotations

import enum
import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from emu.errors import ConfigError
from emu.study.reports import (
    PERIOD_VERSION,
    LoadedReport,
    format_bandwidth,
    key_config,
    load_reports,
    point_key,
    point_label,
)

DEFAULT_TOLERANCE = 0.05
MAX_TOLERANCE = 10.0  # 1000%: beyond it a check checks nothing, so a larger value is a typo


class Verdict(str, enum.Enum):
    OK = "ok"
    FASTER = "faster"  # faster than the baseline beyond the tolerance
    REGRESSION = "REGRESSION"
    FAILED = "FAILED"  # the current report cannot be trusted (or the baseline has no time to compare)
    MISSING = "MISSING in current"
    NEW = "NEW"  # in current, without a baseline

    @property
    def failed(self) -> bool:
        return self not in (Verdict.OK, Verdict.FASTER)


@dataclass(frozen=True)
class PointResult:
    key: str  # point_key (of the trace alone under --ignore-config)
    label: str  # point_label of the current report (the baseline's when missing), unique in the comparison
    baseline_us: float | None  # summary.iteration_us_median; None where there is none
    current_us: float | None
    change: float | None  # (current - baseline) / baseline: 0.05 is 5% slower
    verdict: Verdict
    detail: str  # why it failed, or what differs; "" when there is nothing to add
    baseline_path: str | None
    current_path: str | None

    @property
    def verdict_text(self) -> str:
        if not self.detail:
            return self.verdict.value
        return f"{self.verdict.value}: {self.detail}" if self.verdict == Verdict.FAILED \
            else f"{self.verdict.value} ({self.detail})"


@dataclass(frozen=True)
class Comparison:
    tolerance: float  # a fraction: 0.05 is 5%
    ignore_config: bool
    points: tuple[PointResult, ...]  # failures first, then by |change| descending
    # points on one side only whose trace the other side has under another configuration
    unpaired_by_config: int = 0
    one_per_trace: bool = True  # each side holds one report per trace: --ignore-config could pair them

    @property
    def failures(self) -> tuple[PointResult, ...]:
        return tuple(p for p in self.points if p.verdict.failed)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """One line: how many points failed and how, or that all passed."""
        counts = {v: sum(1 for p in self.points if p.verdict == v) for v in Verdict}
        tol = f"tolerance {format_tolerance(self.tolerance)}"
        if self.ok:
            faster = f", {counts[Verdict.FASTER]} faster" if counts[Verdict.FASTER] else ""
            return f"{len(self.points)} point(s) ok{faster} ({tol})"
        kinds = ", ".join(f"{n} {_PLURAL[v] if n > 1 else v.value.lower()}"
                          for v, n in counts.items() if v.failed and n)
        hint = ""
        if self.unpaired_by_config:
            hint = (f"; {self.unpaired_by_config} of them have their trace on the other side under another "
                    "configuration" + (": --ignore-config pairs by trace alone" if self.one_per_trace else ""))
        return f"{len(self.failures)} of {len(self.points)} point(s) failed: {kinds} ({tol}){hint}"

    def to_dict(self) -> dict[str, Any]:
        points = [{**asdict(p), "verdict": p.verdict.value} for p in self.points]
        return {"ok": self.ok, "summary": self.summary(), "tolerance": self.tolerance,
                "ignore_config": self.ignore_config, "unpaired_by_config": self.unpaired_by_config, "points": points}


_PLURAL = {Verdict.REGRESSION: "regressions", Verdict.FAILED: "failed", Verdict.MISSING: "missing in current",
           Verdict.NEW: "new"}


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` (a fraction), ``0`` or ``0%``; a bare number above 1 is refused as
    ambiguous (``5`` would be 500%), as are negative values and more than 1000%."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise ConfigError(f"--tolerance {text!r}: give a percentage (5%) or a fraction (0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"--tolerance {text!r}: give a percentage from 0% to 1000%")
    if not percent and value > 1:
        raise ConfigError(f"--tolerance {text!r}: a bare number is a fraction (0.05 is 5%); "
                          f"write {value:g}% for {value:g} percent")
    value = value / 100 if percent else value
    if value > MAX_TOLERANCE:
        raise ConfigError(f"--tolerance {text!r}: at most 1000%; a check that lets that much through checks nothing")
    return value


def compare(current: Sequence[LoadedReport], baseline: Sequence[LoadedReport], tolerance: float = DEFAULT_TOLERANCE,
            ignore_config: bool = False) -> Comparison:
    """Pair the reports by point and judge each point (module docstring)."""
    _same_meaning(current, baseline)
    cur = _index(current, "CURRENT", ignore_config)
    base = _index(baseline, "--baseline", ignore_config)
    # each side by trace alone, to say why a point is unpaired (built once: a sweep has thousands)
    alone = cur.keys() ^ base.keys()
    cur_traces, base_traces = (_by_trace(cur), _by_trace(base)) if alone else ({}, {})
    # --ignore-config can pair these sides only if each holds one report per trace (not a sweep's folder)
    one_per_trace = len(cur_traces) == len(cur) and len(base_traces) == len(base) if alone else True
    points = []
    for key in sorted(cur.keys() | base.keys()):
        c, b = cur.get(key), base.get(key)
        if c is not None and b is not None:
            points.append(_judge(key, c, b, tolerance, ignore_config))
        elif b is not None:
            points.append(_alone(key, b, Verdict.MISSING, cur_traces, one_per_trace))
        elif c is not None:
            points.append(_alone(key, c, Verdict.NEW, base_traces, one_per_trace))
    unpaired = sum(1 for p in points if p.verdict in (Verdict.MISSING, Verdict.NEW) and p.detail)
    return Comparison(tolerance=tolerance, ignore_config=ignore_config, points=_ordered(_unique_labels(points)),
                      unpaired_by_config=unpaired, one_per_trace=one_per_trace)


def _same_meaning(current: Sequence[LoadedReport], baseline: Sequence[LoadedReport]) -> None:
    """Refuse to compare iterations of two meanings: before report version 6 an iteration was its
    span (earliest start to last end), since then its period (last end to last end), shorter where
    the workers end apart (by 25% for the cnn on ps at 8 workers: docs/FIDELITY.md)."""
    sides = (("CURRENT", current), ("--baseline", baseline))
    if len({r.version >= PERIOD_VERSION for _, reports in sides for r in reports}) < 2:
        return
    side, old = next((side, r) for side, reports in sides for r in reports if r.version < PERIOD_VERSION)
    raise ConfigError(f"{old.path}: report_version {old.version} measures an iteration as its span (earliest "
                      f"start to last end), report_version {PERIOD_VERSION} and later as its period (last end to "
                      f"last end): their times are not comparable; write the {side} reports again with this emu "
                      "(emu replay --report)")


def check(current: str | os.PathLike[str], baseline: str | os.PathLike[str], tolerance: float = DEFAULT_TOLERANCE,
          ignore_config: bool = False) -> Comparison:
    """``compare`` the reports at two paths (each a report or a folder of reports)."""
    return compare(load_reports(current, "CURRENT"), load_reports(baseline, "--baseline"), tolerance, ignore_config)


def _index(reports: Sequence[LoadedReport], side: str, ignore_config: bool) -> dict[str, LoadedReport]:
    index: dict[str, LoadedReport] = {}
    for report in reports:
        key = point_key(report.doc, ignore_config)
        other = index.get(key)
        if other is not None:
            why = ("--ignore-config pairs by trace alone, and both replay the same trace; compare without "
                   "--ignore-config or keep one report per trace" if ignore_config else
                   "both are the same trace and configuration; keep one of them")
            raise ConfigError(f"{side}: {other.path} and {report.path} are the same point ({key}): {why}")
        index[key] = report
    return index


def _by_trace(side: dict[str, LoadedReport]) -> dict[str, LoadedReport]:
    index: dict[str, LoadedReport] = {}
    for report in side.values():
        index.setdefault(point_key(report.doc, ignore_config=True), report)
    return index


def _median(report: LoadedReport) -> float | None:
    summary = report.doc.get("summary")
    return None if summary is None else float(summary["iteration_us_median"])


def _problems(report: LoadedReport) -> list[str]:
    """Why a current report cannot be trusted, if it cannot."""
    doc, found = report.doc, []
    if not doc.get("complete", True):
        found.append(f"incomplete ({doc.get('reason') or 'no reason given'})")
    elif doc.get("summary") is None:
        found.append("no summary (no iteration finished by every worker)")
    if not doc["verification"]["ok"]:
        found.append(f"verification failed ({doc['verification'].get('mismatches', '?')} mismatched elements)")
    if not doc["emulator"]["trustworthy"]:
        found.append("not trustworthy (emulator.advice says why)")
    return found


def _judge(key: str, cur: LoadedReport, base: LoadedReport, tolerance: float, ignore_config: bool) -> PointResult:
    cur_us, base_us = _median(cur), _median(base)
    change = None if cur_us is None or base_us is None or base_us == 0 else (cur_us - base_us) / base_us
    problems = _problems(cur)
    if base_us is None:
        problems.append("the baseline has no summary to compare with")
    if problems:
        verdict = Verdict.FAILED
    elif cur_us > base_us * (1 + tolerance):  # type: ignore[operator]  (both set: no problems)
        verdict = Verdict.REGRESSION
    elif cur_us < base_us * (1 - tolerance):  # type: ignore[operator]
        verdict = Verdict.FASTER
    else:
        verdict = Verdict.OK
    if ignore_config:
        problems.extend(_differences(base, cur))
    return PointResult(key=key, label=point_label(cur.doc), baseline_us=base_us, current_us=cur_us, change=change,
                       verdict=verdict, detail="; ".join(problems), baseline_path=str(base.path),
                       current_path=str(cur.path))


def _alone(key: str, report: LoadedReport, verdict: Verdict, other_side: dict[str, LoadedReport],
           hint: bool) -> PointResult:
    # The usual cause: the same trace under another configuration (a changed design); say what differs.
    other = other_side.get(point_key(report.doc, ignore_config=True))
    detail = ""
    if other is not None:
        old, new = (report, other) if verdict == Verdict.MISSING else (other, report)
        side = "current" if verdict == Verdict.MISSING else "the baseline"
        detail = f"{side} has this trace with {', '.join(_differences(old, new))}" + (
            "; --ignore-config pairs by trace" if hint else "")
    us = _median(report)
    where = str(report.path)
    return PointResult(key=key, label=point_label(report.doc), baseline_us=us if verdict == Verdict.MISSING else None,
                       current_us=us if verdict == Verdict.NEW else None, change=None, verdict=verdict,
                       detail=detail, baseline_path=where if verdict == Verdict.MISSING else None,
                       current_path=where if verdict == Verdict.NEW else None)


def _differences(base: LoadedReport, cur: LoadedReport, most: int = 3) -> list[str]:
    old, new = key_config(base.doc), key_config(cur.doc)
    names = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    shown = [f"{_name(k)} {_value(k, old.get(k))} -> {_value(k, new.get(k))}" for k in names[:most]]
    return shown + ([f"{len(names) - most} more"] if len(names) > most else [])


def _name(key: str) -> str:
    return key.removesuffix("_bps").removesuffix("_us")


def _value(key: str, v: Any) -> str:
    if v is None:
        return "none"
    if key.endswith("_bps"):
        return format_bandwidth(v)
    text = f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    return text + "us" if key.endswith("_us") else text


def _unique_labels(points: list[PointResult]) -> list[PointResult]:
    # Points that differ only in what a label leaves out (seed, slots, ...) get their key appended,
    # so that JUnit test names and table rows stay distinct.
    seen: dict[str, int] = {}
    for p in points:
        seen[p.label] = seen.get(p.label, 0) + 1
    return [p if seen[p.label] == 1 else _with_label(p, f"{p.label} [{p.key[:8]}]") for p in points]


def _with_label(p: PointResult, label: str) -> PointResult:
    return PointResult(**{**asdict(p), "verdict": p.verdict, "label": label})


def _ordered(points: list[PointResult]) -> tuple[PointResult, ...]:
    return tuple(sorted(points, key=lambda p: (not p.verdict.failed, p.change is not None,
                                               -abs(p.change or 0.0), p.label)))


def format_ms(us: float | None) -> str:
    """Milliseconds to the microsecond (a 1 us regression must show)."""
    return "-" if us is None else f"{us / 1000:.3f}"


def format_change(change: float | None) -> str:
    if change is None:
        return "-"
    pct = change * 100
    return f"{pct:+.2g}%" if 0 < abs(pct) < 0.01 else f"{pct:+.2f}%"


def format_tolerance(tolerance: float) -> str:
    return f"{tolerance * 100:g}%"


def render_junit(comparison: Comparison) -> str:
    """JUnit XML: one testsuite "emu check", one testcase per point (its time: the current
    iteration's emulated seconds), a failure element with the numbers for each failing point."""
    n, failed = str(len(comparison.points)), str(len(comparison.failures))
    total_s = sum((p.current_us or 0.0) for p in comparison.points) / 1e6
    root = ET.Element("testsuites", name="emu check", tests=n, failures=failed, errors="0", time=f"{total_s:.6f}")
    suite = ET.SubElement(root, "testsuite", name="emu check", tests=n, failures=failed, errors="0", skipped="0",
                          time=f"{total_s:.6f}")
    props = ET.SubElement(suite, "properties")
    for name, value in (("tolerance", format_tolerance(comparison.tolerance)),
                        ("ignore_config", str(comparison.ignore_config).lower())):
        ET.SubElement(props, "property", name=name, value=value)
    for p in comparison.points:
        case = ET.SubElement(suite, "testcase", classname="emu.check", name=_xml(p.label),
                             time=f"{(p.current_us or 0.0) / 1e6:.6f}")
        cprops = ET.SubElement(case, "properties")
        for name, value in (("key", p.key), ("baseline_us", p.baseline_us), ("current_us", p.current_us),
                            ("change", p.change), ("verdict", p.verdict.value),
                            ("baseline_path", p.baseline_path), ("current_path", p.current_path)):
            if value is not None:
                ET.SubElement(cprops, "property", name=name, value=_xml(str(value)))
        if p.verdict.failed:
            failure = ET.SubElement(case, "failure", type=p.verdict.name,
                                    message=_xml(_numbers(p, comparison.tolerance)))
            failure.text = _xml("\n".join(x for x in (p.detail, f"baseline: {p.baseline_path or '-'}",
                                                       f"current: {p.current_path or '-'}") if x))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _xml(text: str) -> str:
    # ElementTree escapes markup but writes control characters that XML 1.0 forbids (a model name
    # or a path could hold one), and a CI's parser would then reject the whole file.
    return _NOT_XML.sub("?", text)


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _numbers(p: PointResult, tolerance: float) -> str:
    return (f"{p.verdict_text}: baseline {format_ms(p.baseline_us)} ms, current {format_ms(p.current_us)} ms, "
            f"change {format_change(p.change)} (tolerance {format_tolerance(tolerance)})")


def render_markdown(comparison: Comparison) -> str:
    """A GitHub-flavoured summary: the verdict in one line, then the table of every point."""
    mark = "passed" if comparison.ok else "failed"
    lines = [f"**emu check {mark}**: {_cell(comparison.summary())}", "",
             "| point | baseline (ms) | current (ms) | change | verdict |",
             "| :--- | ---: | ---: | ---: | :--- |"]
    for p in comparison.points:
        verdict = _cell(p.verdict_text)
        if p.verdict.failed:  # the word in bold, the reason plain
            verdict = f"**{p.verdict.value}**{verdict[len(p.verdict.value):]}"
        lines.append(f"| {_cell(p.label)} | {format_ms(p.baseline_us)} | {format_ms(p.current_us)} | "
                     f"{format_change(p.change)} | {verdict} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
