"""Reading Kineto (torch.profiler) trace files into typed events.

Only complete events (``"ph": "X"``) matter for conversion; they are kept sorted
by start time together with what ``distributedInfo`` says of the job. Bad input
(a missing file, not JSON, not a Kineto trace, not from a distributed job) is a
KinetoError naming the file and what would fix it.

Every value the conversion reads is checked here, once: times are finite and
plausible, ids hashable, arguments objects, shapes lists of sizes. A value that
fails is refused with the file, the rank, the step and the event named, so the
conversion after this module never meets a type it did not expect (and never
turns a corrupted value into a plausible-looking one).
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from emu.capture.groups import CommsRecord, GroupInfo, comms_path, read_comms
from emu.errors import KinetoError
from emu.traces.jsonfile import read_json

# Kineto traces of real jobs reach hundreds of MB; more than this is a wrong file.
MAX_KINETO_BYTES = 4 << 30
_SUFFIXES = (".json", ".json.gz")
# what emu capture writes beside each rank's Kineto file (--keep-kineto): not Kineto traces
_SIDECARS = (".comms.json", ".meta.json")
# Plausibility: a day for one event (longer is a profiler bug or a unit mix-up), about
# three centuries of timestamps in microseconds, 2**20 ranks, 13-digit step numbers.
MAX_EVENT_US = 86_400e6
MAX_TS_US = 1e16
MAX_WORLD = 2**20
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_STEP_CATS = ("user_annotation", "cpu_op", "")
_MAX_STEP_DIGITS = 13
# Events whose first Input Dims entry the conversion reads as one tensor's shape
# (emu.capture.program: the parameter shapes of DDP's buckets).
_ONE_SHAPE_FIRST = ("torch.distributed.ddp.reducer::copy_bucket_to_grad",)


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
class KinetoTrace:
    """One rank's Kineto file: the job it belongs to and its events by start time."""

    path: str
    rank: int
    world_size: int
    backend: str
    groups: tuple[GroupInfo, ...]  # the process groups this rank belongs to (distributedInfo)
    device: str
    events: tuple[Event, ...]
    base_time_ns: int | None = None  # wall-clock epoch of the ts clock, where recorded
    comms: CommsRecord | None = None  # emu's record of each collective's group (emu.capture.groups)

    @property
    def job_key(self) -> tuple[Any, ...]:
        """What every rank file of one job shares (each lists only the groups it belongs to)."""
        return (self.world_size, self.backend)

    def group_table(self) -> dict[str, GroupInfo]:
        """The rank's groups by name: distributedInfo's, and the record's where the trace lacks one."""
        table = {g.name: g for g in self.groups}
        if self.comms is not None:
            for g in self.comms.groups:
                table.setdefault(g.name, g)
        return table

    @cached_property
    def _steps(self) -> tuple[list[float], list[tuple[float, int]]]:
        spans = sorted((e.ts_us, e.end_us, int(m.group(1))) for e in self.events
                       if e.cat in _STEP_CATS and (m := _STEP.match(e.name)))
        return [a for a, _, _ in spans], [(b, n) for _, b, n in spans]

    def step_at(self, ts_us: float) -> int | None:
        """The ProfilerStep number whose span holds ``ts_us``, if any."""
        starts, rest = self._steps
        i = bisect.bisect_right(starts, ts_us) - 1
        return rest[i][1] if i >= 0 and ts_us < rest[i][0] else None

    def where(self, ev: Event) -> str:
        """The file, rank, step and event, for a message that must let a user find it."""
        step = self.step_at(ev.ts_us)
        at = f"step {step}" if step is not None else "outside the profiled steps"
        return f"{self.path}: rank {self.rank}: {at}: event {ev.name!r} at ts {ev.ts_us:.3f}"


def expand_paths(items: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, directories replaced by the Kineto files inside them."""
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES)
                           and not p.name.endswith(_SIDECARS))
            if not found:
                raise KinetoError(f"{path}: the directory holds no .json or .json.gz files; "
                                  "give the Kineto trace files of the ranks")
            paths.extend(found)
        elif not path.exists():
            raise KinetoError(f"{path}: no such file or directory")
        else:
            paths.append(path)
    return paths


def _fail(path: Path, fld: str, problem: str) -> KinetoError:
    return KinetoError(f"{path}: field {fld!r} {problem}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _groups(path: Path, info: Mapping[str, Any], world: int) -> tuple[GroupInfo, ...]:
    groups = []
    pgs = info.get("pg_config")
    pgs = [] if pgs is None else pgs  # older PyTorch records no groups
    if not isinstance(pgs, list):
        raise _fail(path, "distributedInfo.pg_config", "must be a list of process groups")
    for pg in pgs:
        if isinstance(pg, Mapping) and isinstance(pg.get("ranks"), list):
            ranks = pg["ranks"]
            if not all(_is_int(r) and 0 <= r < world for r in ranks):
                raise _fail(path, "distributedInfo.pg_config", f"lists ranks {_short(ranks)} of group "
                            f"{_short(pg.get('pg_name'))}; ranks are integers below the world size {world}")
            groups.append(GroupInfo(name=str(pg.get("pg_name", "")), desc=str(pg.get("pg_desc", "") or ""),
                                    ranks=tuple(ranks)))
    return tuple(groups)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _device(doc: Mapping[str, Any], events: Iterable[Event]) -> str:
    if any(e.cat == "kernel" for e in events):
        props = doc.get("deviceProperties")
        if isinstance(props, list) and props and isinstance(props[0], Mapping) and props[0].get("name"):
            return str(props[0]["name"])
        return "gpu"
    return "cpu"


def _dims_ok(dims: Any) -> bool:
    """Input Dims: per argument a shape, a list of shapes (tensor lists) or [] (not a tensor)."""
    if not isinstance(dims, list):
        return False
    for arg in dims:
        if not isinstance(arg, list):
            return False
        for d in arg:
            if isinstance(d, list):
                if not all(_is_int(x) and x >= 0 for x in d):
                    return False
            elif not (_is_int(d) and d >= 0):
                return False
    return True


def _bad_event(path: Path, raw: dict[str, Any], rank: int, problem: str) -> KinetoError:
    return KinetoError(f"{path}: rank {rank}: event {_short(raw.get('name'), 60)} at ts "
                       f"{_short(raw.get('ts'), 30)}: {problem}")


def _event(path: Path, raw: dict[str, Any], rank: int) -> Event:
    """One complete event, every field the conversion reads checked (the message is built
    only on failure: a real trace has a million events)."""
    name, ts, dur = raw.get("name"), raw.get("ts"), raw.get("dur", 0.0)
    if not isinstance(name, str):
        raise _bad_event(path, raw, rank, "field 'name' must be a string; the file is corrupted")
    for key, value, low, high in (("ts", ts, -MAX_TS_US, MAX_TS_US), ("dur", dur, 0.0, MAX_EVENT_US)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise _bad_event(path, raw, rank, f"field {key!r} is {_short(value, 30)}, not a time in "
                             f"microseconds in {low:.0f}..{high:.0f}; the file is corrupted, or a profiler "
                             "bug wrote an unfinished event; re-record the trace")
    pid, tid, args = raw.get("pid", 0), raw.get("tid", 0), raw.get("args") or {}
    if not (isinstance(pid, (int, str)) and isinstance(tid, (int, str))):
        raise _bad_event(path, raw, rank, f"fields 'pid' and 'tid' must be integers or strings, got "
                         f"{_short(pid, 30)} and {_short(tid, 30)}; the file is corrupted")
    if not isinstance(args, dict):
        raise _bad_event(path, raw, rank, f"field 'args' must be an object, got {_short(args, 60)}; the "
                         "file is corrupted")
    if "Input Dims" in args:
        dims = args["Input Dims"]
        if not _dims_ok(dims) or (name in _ONE_SHAPE_FIRST and dims and not all(_is_int(d) for d in dims[0])):
            raise _bad_event(path, raw, rank, f"field 'args.Input Dims' is {_short(dims, 60)}, not a list of "
                             "shapes (lists of sizes >= 0) as this event records them; the file is corrupted")
    if name.startswith("ProfilerStep#"):
        m = _STEP.match(name)
        if m and len(m.group(1)) > _MAX_STEP_DIGITS:
            raise _bad_event(path, raw, rank, f"the step number has {len(m.group(1))} digits; no job runs "
                             "that many steps; the file is corrupted")
    return Event(name=name, cat=str(raw.get("cat", "")), ts_us=float(ts), dur_us=float(dur),
                 pid=pid, tid=tid, args=args)


def _job(path: Path, doc: Mapping[str, Any]) -> tuple[int, int, str]:
    """(rank, world size, backend) from distributedInfo."""
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or not _is_int(info.get("rank")) or not _is_int(info.get("world_size")):
        raise KinetoError(f"{path}: field 'distributedInfo' (rank, world_size) is missing: the "
                          "trace was not recorded in a torch.distributed job, or by a PyTorch "
                          "older than 1.13; record it after init_process_group")
    rank, world = info["rank"], info["world_size"]
    if not 1 <= world <= MAX_WORLD or not 0 <= rank < world:
        raise _fail(path, "distributedInfo", f"says rank {_short(rank, 30)} of world size "
                    f"{_short(world, 30)}: a rank is in 0..world_size-1 and a job has 1..2**20 ranks; "
                    "the file is corrupted")
    return rank, world, str(info.get("backend", "unknown"))


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
    rank, world, backend = _job(path, doc)
    groups = _groups(path, doc["distributedInfo"], world)
    events = [_event(path, raw, rank) for raw in doc["traceEvents"]
              if isinstance(raw, dict) and raw.get("ph") == "X"]
    events.sort(key=lambda e: e.ts_us)
    base = doc.get("baseTimeNanoseconds")
    if base is not None and not (_is_int(base) and 0 <= base < 2**63):
        raise _fail(path, "baseTimeNanoseconds", f"is {_short(base, 40)}, not a time in ns since the "
                    "epoch (an integer in 0..2**63); the file is corrupted")
    return KinetoTrace(path=str(path), rank=rank, world_size=world, backend=backend, groups=groups,
                       device=_device(doc, events), events=tuple(events), base_time_ns=base,
                       comms=read_comms(comms_path(path)))
