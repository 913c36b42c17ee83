"""The orchestrator ends a socketed replay on the synchronized clock only once the switch's clock has
ended (``Ended``), not when the last worker host reports: a parameter server's host can still have
a window to run, and a host stopped before the switch sent it that window's bound failed the run
("host process h2 left the run", 1 in about 300 runs of a loaded machine, 2026-12-05; every run
when the switch was made to pause between its sends of a window's bound)."""

from __future__ import annotations

import pytest
import zmq

from emu.replay import ReplayConfig
from emu.replay.control.messages import Ended, HostResult, connect_control, encode
from emu.replay.control.processes import ReplayError, _Run


def _result(host: int) -> HostResult:
    return HostResult(host=host, workers={}, bytes_sent=0.0, lost=0, packets_lost=0, retransmissions=0,
                      fallbacks={}, reordered=0, reorder_error_us=0.0, events=0, real_bytes=0, verify_elements=0,
                      verify_mismatches=0, lag={})


def test_a_run_ends_when_the_switch_clock_does(tmp_path) -> None:
    ctx = zmq.Context()
    try:
        ctrl = ctx.socket(zmq.ROUTER)
        ctrl.setsockopt(zmq.LINGER, 0)
        address = f"ipc://{tmp_path}/control"
        ctrl.bind(address)
        host, switch = (connect_control(ctx, address, None, who) for who in (b"h0", b"switch"))
        run = _Run(ctrl, [], ReplayConfig(workers=2, fabric="ps"), 2)
        host.send(encode(_result(0)))
        # every worker host reported; the switch's clock runs on: collect keeps waiting
        run.config = ReplayConfig(workers=2, fabric="ps", timeout_s=1.0)
        with pytest.raises(ReplayError, match="did not finish within --timeout"):
            run.collect(1, 0, [], None)
        switch.send(encode(Ended(211)))
        run.config = ReplayConfig(workers=2, fabric="ps", timeout_s=30.0)
        assert [r.host for r in run.collect(1, 0, [], None)] == [0]
        # the wall clock's switch never ends: the workers' results end the run
        wall = _Run(ctrl, [], ReplayConfig(workers=2, fabric="ps", clock="wall", timeout_s=30.0), 2)
        host.send(encode(_result(0)))
        assert [r.host for r in wall.collect(1, 0, [], None)] == [0]
        for sock in (host, switch, ctrl):
            sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)
