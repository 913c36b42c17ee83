"""emu's P4 program on a real BMv2 behind the bridge: the numbers of the software switch.

Marked ``p4`` (``make test-p4``): each replay compiles the program, creates veth ports and starts
simple_switch_grpc. Skipped, saying why, without root, the p4lang tools or finsy.
"""

from __future__ import annotations

import os
import shutil

import pytest

from emu.p4 import bmv2
from emu.replay import ReplayConfig, replay
from emu.traces import load_trace, sample_path

missing = [t for t in bmv2.TOOLS if shutil.which(t) is None]
try:
    import finsy  # noqa: F401
except ImportError:
    missing.append("finsy")
pytestmark = [pytest.mark.p4, pytest.mark.skipif(
    bool(missing) or os.geteuid() != 0,
    reason=(f"BMv2 replays need {', '.join(missing)} ({bmv2.INSTALL_HINT})" if missing
            else "BMv2 replays need root for the switch's veth ports"))]


def _alike(a, b) -> None:
    assert [it.emulated_us for it in a.iterations] == [it.emulated_us for it in b.iterations]
    assert [it.comm_us for it in a.iterations] == [it.comm_us for it in b.iterations]
    assert a.summary.bytes_sent == b.summary.bytes_sent
    assert (a.fabric.packets, a.fabric.results, a.fabric.duplicates) == (b.fabric.packets, b.fabric.results,
                                                                         b.fabric.duplicates)
    assert a.emulator.windows == b.emulator.windows
    assert a.verification.elements_checked == b.verification.elements_checked


@pytest.mark.parametrize("workers", [2, 8])
def test_mlp_on_bmv2_gives_inas_numbers(workers: int, no_children) -> None:
    mlp = load_trace(sample_path("mlp"))
    got = {f: replay(mlp, ReplayConfig(workers=workers, fabric=f, iters=2, payload_scale=1024)) for f in ("bmv2", "ina")}
    b, i = got["bmv2"], got["ina"]
    assert b.verification.ok and i.verification.ok and b.verification.mismatches == 0
    assert b.emulator.clock == "sync"
    _alike(b, i)
    assert b.fabric.bridge is not None and b.fabric.bridge.differs == 0
    assert b.fabric.bridge.frames >= b.fabric.packets
    tag = f"{os.getpid():06x}"[-6:]  # the switch's ports are named for the process that started it
    assert not list(bmv2.Path("/sys/class/net").glob(f"emu{tag}*")), "veth ports were left behind"
