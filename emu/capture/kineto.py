"""Reading Kineto (torch.profiler) trace files into typed events.

Only complete events (``"ph": "X"``) matter for conversion; they are kept sorted
by start time together with what ``distributedInfo`` says of the job. Bad input
(a missing file, not JSON, not a Kineto trace, not from a distributed job) is a
KinetoError naming the file and what would fix it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emu.errors import KinetoError
from emu.traces.jsonfile import read_json

# Kineto traces of real jobs reach hundreds of MB; more than this is a wrong file.
MAX_KINETO_BYTES = 4 << 30
_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class Event:
    """One complete event of a Kineto trace; times in microseconds."""

    name: str
    cat: str
    ts_us: float
    dur_us: float
    pid: int | str
    tid: int | str
    args: Mapping[str, Any]

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class KinetoTrace:
    """One rank's Kineto file: the job it belongs to and its events by start time."""

    path: str
    rank: int
    world_size: int
    backend: str
    groups: tuple[ProcessGroup, ...]
    device: str
    events: tuple[Event, ...]
    base_time_ns: int | None = None  # wall-clock epoch of the ts clock, where recorded

    @property
    def job_key(self) -> tuple[Any, ...]:
        """What every rank file of one job shares."""
        return (self.world_size, self.backend, tuple((g.name, g.ranks) for g in self.groups))


def expand_paths(items: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, directories replaced by the Kineto files inside them."""
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
            if not found:
                raise KinetoError(f"{path}: the directory holds no .json or .json.gz files; "
                                  "give the Kineto trace files of the ranks")
            paths.extend(found)
        elif not path.exists():
            raise KinetoError(f"{path}: no such file or directory")
        else:
            paths.append(path)
    return paths


def _groups(info: Mapping[str, Any]) -> tuple[ProcessGroup, ...]:
    groups = []
    for pg in info.get("pg_config") or ():
        if isinstance(pg, Mapping) and isinstance(pg.get("ranks"), list):
            groups.append(ProcessGroup(name=str(pg.get("pg_name", "")),
                                       ranks=tuple(int(r) for r in pg["ranks"])))
    return tuple(groups)


def _device(doc: Mapping[str, Any], events: Iterable[Event]) -> str:
    if any(e.cat == "kernel" for e in events):
        props = doc.get("deviceProperties") or []
        if props and isinstance(props[0], Mapping) and props[0].get("name"):
            return str(props[0]["name"])
        return "gpu"
    return "cpu"


def read_kineto(path: str | os.PathLike[str]) -> KinetoTrace:
    """Read one rank's Kineto trace file."""
    path = Path(path)
    doc = read_json(path, max_bytes=MAX_KINETO_BYTES, error=KinetoError,
                    expected="the .json or .json.gz that torch.profiler's export_chrome_trace wrote")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        hint = (" (it is an emu trace already: use it directly)"
                if isinstance(doc, dict) and doc.get("schema") == "emu-trace" else "")
        raise KinetoError(f"{path}: not a Kineto trace: field 'traceEvents' is missing{hint}; "
                          "give the JSON that torch.profiler's export_chrome_trace wrote")
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int) \
            or not isinstance(info.get("world_size"), int):
        raise KinetoError(f"{path}: field 'distributedInfo' (rank, world_size) is missing: the "
                          "trace was not recorded in a torch.distributed job, or by a PyTorch "
                          "older than 1.13; record it after init_process_group")
    events = []
    for raw in doc["traceEvents"]:
        if not isinstance(raw, dict) or raw.get("ph") != "X":
            continue
        try:
            events.append(Event(name=str(raw["name"]), cat=str(raw.get("cat", "")),
                                ts_us=float(raw["ts"]), dur_us=float(raw.get("dur", 0.0)),
                                pid=raw.get("pid", 0), tid=raw.get("tid", 0),
                                args=raw.get("args") or {}))
        except (KeyError, TypeError, ValueError):
            raise KinetoError(f"{path}: an event lacks a valid 'name' or 'ts': {str(raw)[:120]}") from None
    events.sort(key=lambda e: e.ts_us)
    return KinetoTrace(path=str(path), rank=info["rank"], world_size=info["world_size"],
                       backend=str(info.get("backend", "unknown")), groups=_groups(info),
                       device=_device(doc, events), events=tuple(events),
                       base_time_ns=base if isinstance(base := doc.get("baseTimeNanoseconds"), int) else None)
