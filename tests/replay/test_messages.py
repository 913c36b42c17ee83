"""The control messages: typed records, round-tripped through JSON, and everything else refused."""

from __future__ import annotations

import math

import pytest

from emu.emulator.protocol.transport import FrameError
from emu.replay.control.messages import (
    MAX_CONTROL,
    Ended,
    Failed,
    HostResult,
    Progress,
    Ready,
    Start,
    Stop,
    SwitchResult,
    WorkerRecord,
    decode,
    encode,
)

RESULT = HostResult(host=1, workers={"3": WorkerRecord([[0.0, 10.5, 4.0, 1.0, 6.5]], [["compute", "fwd", 0.0, 4.0]])},
                    bytes_sent=1e9, lost=2, packets_lost=7, retransmissions=2, fallbacks={"broadcast": 1},
                    reordered=0, reorder_error_us=0.0, events=12, real_bytes=4096, verify_elements=64,
                    verify_mismatches=0, lag={"bins": [[3, 1]], "n": 1, "max_us": 2.5})


@pytest.mark.parametrize("msg", [Ready(0), Ready("switch"), Start(12.5), Stop(), Progress(2, 5),
                                 Failed("switch", "FrameError: x"), RESULT, SwitchResult({"packets": 4}, 3, 17),
                                 SwitchResult({}, 0), Ended(211)])
def test_round_trip(msg) -> None:
    assert decode(encode(msg)) == msg


def test_infinity_survives() -> None:
    assert math.isinf(decode(encode(Start(math.inf))).wall0)


@pytest.mark.parametrize("data, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "known type"),
    (b'{"type": "reboot"}', "known type"),
    (b'{"type": "progress", "host": 1}', "no iterations"),
    (b'{"type": "progress", "host": 1, "iterations": "5"}', "wrong type"),
    (b'{"type": "progress", "host": true, "iterations": 5}', "wrong type"),
    (b'{"type": "stop", "extra": 1}', "unknown fields"),
    (b'{"type": "switch", "stats": {"a": "b"}, "segments": 1}', "wrong type"),
    (b"[" * 100_000, "not JSON"),
])
def test_refused(data: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        decode(data)


def test_bounded() -> None:
    with pytest.raises(FrameError, match="at most"):
        decode(b" " * (MAX_CONTROL + 1))


def test_window_messages_carry_each_pools_lagging_member() -> None:
    """A window report names, per slot pool, what its members started; the clock's window message
    gives back, per pool, the earliest one of its results can leave the switch (``Lagging``)."""
    from emu.emulator.protocol.window import Departures, Done, Go, Lagging

    lag = (Lagging(4.0, 1500.0, math.inf), Lagging(-1.0, -math.inf, 2.0))
    done = Done(7, 12.5, False, Departures(3.0, 4.0, ((5.0, math.inf), (6.0, 7.0)), lag))
    assert Done.parse(done.frames()) == done
    kept = Done(7, 12.5, True, sent_us=9.25, kept_segments=3)  # segments a host delivered itself
    assert Done.parse(kept.frames()) == kept
    go = Go(8, 20.0, False, (1500.0, -math.inf))
    assert Go.parse(go.frames()) == go
    with pytest.raises(FrameError, match="bad departures"):
        Done.parse([*done.frames()[:2], done.frames()[2][:-8]])
    with pytest.raises(FrameError, match="pool wakes"):
        Go.parse([*go.frames()[:2], b"\0" * 12])


def test_a_pools_results_wait_for_its_lagging_member() -> None:
    """Over hosts the least last-started collective wins and its members' next resumption sets the
    pool's quiet time, unless a collective all have started is still open, or a member at that
    least is inside a collective (-inf); a host that saw two orders (-inf everywhere) spoils it."""
    from emu.emulator.protocol.window import Lagging

    ahead, behind = Lagging(5.0, -math.inf, 5.0), Lagging(4.0, 900.0, math.inf)
    assert Lagging.least([ahead, behind]).quiet_us() == 900.0  # number 5 waits for the member at 4
    assert Lagging.least([ahead, behind, Lagging(4.0, 700.0, math.inf)]).quiet_us() == 700.0
    assert Lagging.least([ahead, Lagging(4.0, 900.0, 4.0)]).quiet_us() == -math.inf  # number 4 still open
    assert Lagging.least([ahead, Lagging(4.0, -math.inf, math.inf)]).quiet_us() == -math.inf  # inside another
    assert Lagging.least([behind, Lagging(-math.inf, -math.inf, -math.inf)]).quiet_us() == -math.inf
    assert Lagging.least([Lagging(), behind]) == behind  # a host without the pool's members says nothing
