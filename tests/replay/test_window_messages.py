"""The synchronized clock's messages between the switch and the hosts: a host's last batch of
segments carries its window report, and the switch's last batch of a window's segments for a host
carries the next window's Go; real zmq sockets, the switch's own coordinator."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from emu.emulator.protocol.transport import GO, SEG, FrameError, Segment, SegmentBatch
from emu.emulator.protocol.window import Departures, Done, Go
from emu.replay.switch.daemon import SwitchSetup, _Coordinator


def _batch(dst: int) -> SegmentBatch:
    (batch,) = SegmentBatch.of([Segment(0, "float32", 1 - dst, dst, 3, 0, 64.0, 5.0, 6.0, np.arange(4.0))])
    return batch


def _recv(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(2000), "nothing came within 2 s"
    return sock.recv_multipart()


@pytest.fixture
def wired():
    """A coordinator of two hosts (worker 0 on host 0, worker 1 on host 1) and a socket for each."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://switch")
    hosts = []
    for i in range(2):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"h{i}".encode())
        s.connect("inproc://switch")
        hosts.append(s)
    setup = SwitchSetup(address="", control_addr="", workers=2, slots=1, elements=4, fabric="ring",
                        worker_hosts=((0, 1), (1, 2)), endpoint_host=(0, 1), sync=True, lookahead_us=1.0)
    coord = _Coordinator(setup, ctx.socket(zmq.PAIR), router, None, [b"h0", b"h1"], [0])
    try:
        yield coord, hosts
    finally:
        ctx.destroy(linger=0)


def _settle(coord: _Coordinator, reports: int) -> None:
    for _ in range(200):
        coord._drain()
        if len(coord.reports) == reports:
            return
        zmq.select([coord.router], [], [], 0.01)
    raise AssertionError(f"{len(coord.reports)} reports, not {reports}")


def test_a_report_rides_on_the_last_batch_and_a_go_on_the_forwarded_one(wired) -> None:
    coord, (h0, h1) = wired
    coord.clock.window = 1
    h0.send_multipart([*_batch(1).frames(), *Done(1, 7.0, False, Departures(), 5.0).frames()], copy=True)
    h1.send_multipart(Done(1, 9.0, False).frames())
    _settle(coord, 2)
    assert coord.forwarded[0] == 1 and coord.clock.seg_min == 5.0  # the report's segment, counted
    assert [len(h) for h in coord.held] == [0, 1]  # held for host 1 until the window's Go
    coord._next_window()
    alone, with_segments = _recv(h0), _recv(h1)
    assert alone[0] == GO and Go.parse(alone).window == 2
    assert with_segments[0] == SEG and with_segments[4] == GO and len(with_segments) == 7
    (seg,) = SegmentBatch.parse(with_segments[:4]).segments()
    assert (seg.src, seg.dst, seg.values.tolist()) == (0, 1, [0.0, 1.0, 2.0, 3.0])
    assert Go.parse(with_segments[4:]) == Go.parse(alone)
    assert coord.held == [[], []]


def test_a_batch_trailed_by_anything_but_a_report_is_refused(wired) -> None:
    coord, (h0, _) = wired
    h0.send_multipart([*_batch(1).frames(), *Go(1, 2.0, False).frames()], copy=True)
    with pytest.raises(FrameError, match="not a report"):
        _settle(coord, 1)
