"""The control messages: typed records, round-tripped through JSON, and everything else refused."""

from __future__ import annotations

import math

import pytest

from emu.emulator.protocol.transport import FrameError
from emu.replay.control.messages import (
    MAX_CONTROL,
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
                                 SwitchResult({}, 0)])
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
