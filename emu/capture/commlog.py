"""Runs inside each rank process: the group of every collective, which gloo's profiler events lack.

gloo writes no ``record_param_comms``: its launch events (``c10d::allreduce_``) do not say which
process group they ran on, and a job with sub-groups (FSDP's shard groups, tensor and pipeline
parallel groups) cannot be imported without it. PyTorch's flight recorder does say: it keeps,
for every collective a process group issues (the reducer's and the functional collectives' from
C++ included), the group's name and description, the sizes and the wall-clock time it was
issued. The rank turns it on (``TORCH_FR_BUFFER_SIZE``, unless the script set it) before the
script starts. Point-to-point calls are not in gloo's record, and their launch events give the
peer as a rank of a group they do not name: ``torch.distributed``'s ``send``, ``recv``, ``isend``
and ``irecv`` are wrapped to note each call's group, global peer, size and whether it blocked
(``batch_isend_irecv``, which pipeline schedules use, calls them). When the profiler exports
its window, the rank writes ``rank<R>.comms.json`` beside the Kineto file: the collectives and
point-to-point calls issued since the window opened, and every device mesh the script built
(names and ranks), which ``emu.capture.groups`` reads.

Everything here is best effort: a PyTorch without the recorder, or whose private tables moved,
writes the file with what it could read and says why in ``error``, and the import then refuses
what it cannot tell apart instead of guessing.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emu.errors import CaptureError
from emu.files import write_atomic

VERSION = 1
# Collectives the recorder keeps (a ring): far more than a profiled window issues (FSDP issues
# about three per block and step), and about 200 bytes each.
BUFFER = 1 << 16
_meshes: list[dict[str, Any]] = []
_p2p: list[dict[str, Any]] = []
_inside = threading.local()  # a blocking send calls isend: only the outermost call is noted
_P2P_CALLS = {"send": ("send", True), "recv": ("recv", True), "isend": ("send", False), "irecv": ("recv", False)}


def enable() -> None:
    """Before the script runs: turn the flight recorder on and note every device mesh it builds."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(BUFFER))
    try:
        from torch.distributed import device_mesh
    except ImportError:  # a torch without distributed
        return
    cls = getattr(device_mesh, "DeviceMesh", None)
    init = getattr(cls, "__init__", None)
    if cls is None or init is None or getattr(init, "_emu_noted", False):
        return

    def noting(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            names = getattr(self, "mesh_dim_names", None)
            _meshes.append({"names": list(names) if names else None, "ranks": self.mesh.tolist()})
        except Exception:  # a mesh emu cannot read is simply not noted  # noqa: BLE001
            pass

    noting._emu_noted = True  # type: ignore[attr-defined]
    cls.__init__ = noting
    _wrap_p2p()


def _wrap_p2p() -> None:
    """Note every point-to-point call (batch_isend_irecv compares ``op is isend``: the module's
    function and ``torch.distributed``'s must be the same object, which they are here)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, (kind, blocking) in _P2P_CALLS.items():
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_emu_noted", False):
            continue
        wrapper = _noting_p2p(original, kind, blocking, c10d)
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)


def _noting_p2p(original: Callable[..., Any], kind: str, blocking: bool, c10d: Any) -> Callable[..., Any]:
    peer_key, group_key = ("dst", "group_dst") if kind == "send" else ("src", "group_src")

    @functools.wraps(original)
    def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return original(tensor, *args, **kwargs)
        start = time.time_ns()
        _inside.depth = 1
        try:
            return original(tensor, *args, **kwargs)
        finally:
            _inside.depth = 0
            try:
                _p2p.append(_p2p_entry(c10d, kind, blocking, tensor, args, kwargs, peer_key, group_key, start))
            except Exception:  # a call emu cannot read is simply not noted  # noqa: BLE001
                pass

    call._emu_noted = True  # type: ignore[attr-defined]
    return call


def _p2p_entry(c10d: Any, kind: str, blocking: bool, tensor: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               peer_key: str, group_key: str, start: int) -> dict[str, Any]:
    positional = dict(zip((peer_key, "group", "tag", group_key), args, strict=False))
    bound = {**positional, **kwargs}
    group = bound.get("group") or c10d._get_default_group()
    peer = bound.get(peer_key)
    if peer is None and bound.get(group_key) is not None:
        peer = c10d.get_global_rank(group, bound[group_key])
    return {"kind": kind, "blocking": blocking, "group": str(group.group_name), "peer": None if peer is None else int(peer),
            "count": int(tensor.numel()), "start_ns": start, "end_ns": time.time_ns()}


def _groups() -> list[dict[str, Any]]:
    """The process groups this rank belongs to: name, description and ranks."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    out = []
    for pg, name in world.pg_names.items():
        ranks = world.pg_group_ranks.get(pg)
        if ranks is None:
            continue
        out.append({"name": str(name), "desc": str(getattr(pg, "group_desc", "") or ""),
                    "ranks": sorted(int(r) for r in ranks)})
    return out


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    group = raw.get("process_group") or ["", ""]
    return {"group": str(group[0]), "desc": str(group[1]) if len(group) > 1 else "",
            "kind": str(raw.get("profiling_name", "")), "created_ns": int(raw.get("time_created_ns", 0)),
            "p2p": bool(raw.get("is_p2p", False)), "input_sizes": raw.get("input_sizes"),
            "output_sizes": raw.get("output_sizes"), "seq": int(raw.get("collective_seq_id", 0))}


def dump(path: Path, since_ns: int) -> None:
    """Write the record of the collectives issued since ``since_ns`` (wall clock, ns)."""
    doc: dict[str, Any] = {"version": VERSION, "written_ns": time.time_ns(), "since_ns": since_ns,
                           "meshes": list(_meshes), "groups": [], "collectives": [],
                           "p2p": [e for e in _p2p if e["start_ns"] >= since_ns], "error": None}
    try:
        doc["groups"] = _groups()
    except Exception as exc:  # noqa: BLE001
        doc["error"] = f"the process groups could not be read ({type(exc).__name__}: {exc})"
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        record = json.loads(_dump_fr_trace_json(includeCollectives=True))
        entries = [_entry(e) for e in record.get("entries", []) if isinstance(e, dict)]
        doc["collectives"] = [e for e in entries if e["created_ns"] >= since_ns]
    except Exception as exc:  # noqa: BLE001
        doc["error"] = f"the flight recorder could not be read ({type(exc).__name__}: {exc})"
    write_atomic(path, json.dumps(doc), "the collectives' record", CaptureError)
