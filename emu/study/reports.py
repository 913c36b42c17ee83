"""Replay reports as the studies read them back: versions, checks, points.

This module owns the one table of report versions (each loader brings a report written by an
older emu up to the current shape, or refuses it with the fix), the checks of the fields that
comparisons read (docs/design.md, "Command line and report contract"), finding reports in a
folder, and a report's *point*: the key that pairs it with the same experiment in another run
(``point_key``) and a short label for people (``point_label``). Bad input is a ``ConfigError``
(exit 2) naming the file, the field and the fix; nothing here prints or exits.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emu.emulator.links import spec as links
from emu.errors import ConfigError, EmuError

# Configuration keys that do not change a replay's results: the wall clock's dilation (the
# synchronized clock ignores it, and a trustworthy wall-clock run does not depend on it), how
# many host processes carried the workers, the design file's label (its values are the other
# keys), and a wire size derived from `elements`. Every other key is part of the point.
KEY_EXCLUDED = frozenset({"tdf", "processes", "design", "packet_wire_bytes"})
KEY_CHARS = 16  # hex digits of the sha256 kept: 64 bits, no collision among any real set of reports

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_FIX = "re-run emu replay --report to write it again"
_RERUN_V1 = "re-run emu replay with this emu to record trace.sha256"


@dataclass(frozen=True)
class LoadedReport:
    """A report file read, checked and brought to the current version's shape."""

    path: Path
    doc: dict[str, Any]
    version: int  # report_version as written in the file


def _from_v1(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 1 lacks ``trace.sha256``: hash the trace file the report names, if it is still there.

    It also lacks ``config.stragglers`` and ``config.design``; both stay absent, which pairs like
    the null a version 2 report writes when there are none.
    """
    trace = _dict(doc, "trace", path)
    if "sha256" in trace:  # no emu wrote it at version 1, but a hand-made fill is kept (and checked)
        return doc
    named = trace.get("path")
    found = _trace_file(named, path) if isinstance(named, str) and named else None
    if found is None:
        raise ConfigError(f"{path}: trace.sha256: missing (report_version 1) and the trace file "
                          f"{named!r} is not there to hash; {_RERUN_V1}")
    try:
        digest = _hash_trace_file(str(found), *_stamp(found))
    except (EmuError, OSError) as exc:
        raise ConfigError(f"{path}: trace.sha256: missing (report_version 1) and hashing trace.path "
                          f"{found} failed ({exc}); {_RERUN_V1}") from None
    return {**doc, "trace": {**trace, "sha256": digest}}


def _from_v2(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 2 lacks ``verification.elements_distinct``, ``fabric.packets_lost_modelled`` and
    ``jobs[].compression``: they stay absent (nothing in the file says what they were)."""
    return doc


def _from_v3(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 4 added ``compression.data`` (its default, generated, is what version 3 did)."""
    return doc


def _from_v4(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 5 counts ``sparsity.sent_fraction`` from the bytes that crossed the links and adds
    ``sparsity.sent_bytes``, ``header_bytes`` and ``dense_bytes``; a version 4 report's fraction,
    from the hashes, stays as it is and the new fields stay absent."""
    return doc


def _from_v5(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Version 6 gives an iteration as its period and adds its span (``iterations[].span_us``); a
    version 5 report's iterations are spans, and nothing in it gives their periods: read as they
    are, and compared only with reports of their meaning (``PERIOD_VERSION``, emu check)."""
    return doc


def _from_v6(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """The current version."""
    return doc


# report_version -> the loader that returns the report in the current version's shape (CHANGELOG.md
# lists what each version added). A new version adds a row and moves the older loaders forward.
LOADERS: dict[int, Callable[[dict[str, Any], Path], dict[str, Any]]] = {1: _from_v1, 2: _from_v2, 3: _from_v3,
                                                                      4: _from_v4, 5: _from_v5, 6: _from_v6}
# the first version whose iteration (and the summary's times) is a period, last end to last end:
# earlier ones give spans, earliest start to last end (emu check compares one meaning with itself)
PERIOD_VERSION = 6
CURRENT_VERSION = max(LOADERS)


def _trace_file(named: str, report: Path) -> Path | None:
    # A relative trace.path was relative to where replay ran; next to the report is the other guess.
    for candidate in (Path(named), report.parent / named):
        if candidate.is_file():
            return candidate
    return None


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _hash_trace_file(path: str, mtime_ns: int, size: int) -> str:
    # A folder of version 1 reports names the same few traces many times; each is hashed once
    # (keyed by its stamp, so that a rewritten trace is hashed again).
    from emu.traces.io import trace_sha256

    return trace_sha256(path)


def read_report(path: str | os.PathLike[str]) -> LoadedReport | None:
    """The report in the JSON file at ``path``; None when it is JSON but no report (no
    ``report_version``: a sweep's results.json, a Chrome trace). A file that is not JSON at all is
    an error: it may be a report cut short, and skipping it would hide a point."""
    from emu.traces.jsonfile import MAX_JSON_DEPTH, json_depth_exceeds

    path = Path(path)
    try:
        data = path.read_bytes()
        if json_depth_exceeds(data):  # as inspect's guard: Python's parser would recurse past its limit
            raise ConfigError(f"{path}: nests arrays and objects more than {MAX_JSON_DEPTH} deep, which no report "
                              f"does; the file is corrupted: {_FIX}, or move it out of the folder")
        doc = json.loads(data)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc}); check the path and its permissions") \
            from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"{path}: not valid JSON ({exc}); {_FIX}, or move it out of the folder") from None
    if not isinstance(doc, dict) or "report_version" not in doc:
        return None
    version = doc["report_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(f"{path}: report_version: expected an integer, found {_show(version)}; {_FIX}")
    loader = LOADERS.get(version)
    if loader is None:
        newer = " (written by a newer emu: upgrade this one)" if version > CURRENT_VERSION else ""
        raise ConfigError(f"{path}: report_version {version} is not supported{newer}; this emu reads "
                          f"report_version {', '.join(map(str, sorted(LOADERS)))}; re-run emu replay with this emu")
    doc = loader(doc, path)
    _check(doc, path)
    return LoadedReport(path=path, doc=doc, version=version)


def load_report(path: str | os.PathLike[str]) -> LoadedReport:
    """The report at ``path``, which must be one."""
    report = read_report(path)
    if report is None:
        raise ConfigError(f"{path}: not a replay report (no report_version); give a file written by "
                          "emu replay --report, or a folder of them")
    return report


def report_files(folder: str | os.PathLike[str]) -> tuple[Path, ...]:
    """Every ``*.json`` under ``folder`` (recursively, sorted), except under hidden folders (.git)."""
    folder = Path(folder)
    return tuple(sorted(p for p in folder.rglob("*.json")
                        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)))


def load_reports(path: str | os.PathLike[str], option: str = "") -> tuple[LoadedReport, ...]:
    """The report at ``path``, or every report in the folder ``path`` (``report_files``; JSON files
    without ``report_version`` are skipped). ``option`` names the argument in messages."""
    path = Path(path)
    where = f"{option} {path}" if option else str(path)
    if path.is_file():
        return (load_report(path),)
    if not path.is_dir():
        raise ConfigError(f"{where}: no such file or folder; give a report or a folder of reports")
    found = tuple(r for r in map(read_report, report_files(path)) if r is not None)
    if not found:
        raise ConfigError(f"{where}: no replay reports (JSON files with report_version) in this folder; "
                          "write some with emu replay --report")
    return found


def _check(doc: dict[str, Any], path: Path) -> None:
    """The fields a comparison reads, with their kinds; anything else may be absent or extra."""
    _dict(doc, "config", path)
    trace = _dict(doc, "trace", path)
    sha = trace.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ConfigError(f"{path}: trace.sha256: expected 64 hex digits, found {_show(sha)}; {_FIX}")
    summary = doc.get("summary")
    if summary is not None:
        if not isinstance(summary, dict):
            raise ConfigError(f"{path}: summary: expected an object or null, found {_show(summary)}; {_FIX}")
        median = summary.get("iteration_us_median")
        if not _number(median) or median < 0:
            raise ConfigError(f"{path}: summary.iteration_us_median: expected a number of microseconds >= 0, "
                              f"found {_show(median)}; {_FIX}")
    for section, key in (("verification", "ok"), ("emulator", "trustworthy")):
        value = _dict(doc, section, path).get(key)
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {section}.{key}: expected true or false, found {_show(value)}; {_FIX}")
    if not isinstance(doc.get("complete", True), bool):
        raise ConfigError(f"{path}: complete: expected true or false, found {_show(doc['complete'])}; {_FIX}")


def _dict(doc: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected an object, found {_show(value)}; {_FIX}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any) -> str:
    text = "nothing" if value is None else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def key_config(doc: dict[str, Any]) -> dict[str, Any]:
    """The configuration that identifies a point: every ``config`` key but ``KEY_EXCLUDED``, without
    those whose value is null or an empty list or object (an option's "none": an option added later
    with such a default still pairs with reports written before it), integral floats as integers
    (5.0 and 5 are one latency)."""
    config = doc.get("config")
    if not isinstance(config, dict):
        raise ConfigError("report: config: expected an object; load reports with load_report")
    return {k: _canonical(v) for k, v in config.items()
            if k not in KEY_EXCLUDED and v is not None and v != [] and v != {}}


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def point_key(doc: dict[str, Any], ignore_config: bool = False) -> str:
    """16 hex digits naming a report's point: the sha256 of the canonical JSON (sorted keys, compact)
    of the trace's content hash and ``key_config``; with ``ignore_config``, of the trace hash alone."""
    trace = doc.get("trace")
    sha = trace.get("sha256") if isinstance(trace, dict) else None
    if not isinstance(sha, str):
        raise ConfigError("report: trace.sha256: missing; load reports with load_report (it fills in a version 1 "
                          f"report's), or {_RERUN_V1}")
    material: dict[str, Any] = {"trace": sha.lower()}
    if not ignore_config:
        material["config"] = key_config(doc)
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def point_label(doc: dict[str, Any]) -> str:
    """A short name for people: model (or the trace file's stem), fabric, workers, bandwidth,
    latency and loss (when not 0), e.g. ``mlp ina x8 25Gbps 5us``."""
    trace = doc.get("trace") if isinstance(doc.get("trace"), dict) else {}
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    name = trace.get("model")
    if not name and isinstance(trace.get("path"), str):
        name = Path(trace["path"]).name.split(".")[0]
    parts = [str(name or "trace"), str(config.get("fabric", "?")), f"x{config.get('workers', '?')}"]
    if "bandwidth_bps" in config:
        parts.append(format_bandwidth(config["bandwidth_bps"]))
    if _number(config.get("latency_us")):
        parts.append(f"{config['latency_us']:g}us")
    if _number(config.get("loss")) and config["loss"] > 0:
        parts.append(f"loss {config['loss']:g}")
    return " ".join(parts)


def format_bandwidth(bps: Any) -> str:
    """``25Gbps``; ``ideal`` for null (an infinitely fast link) or anything not a number."""
    return links.format_bandwidth(bps if _number(bps) else None)
