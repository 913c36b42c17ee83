"""The synchronized clock's window messages between the switch and the hosts (docs/design-notes.md):
``Go`` (switch to host: handle every event before the bound), ``Done`` (host to switch: the window is
handled, when the next event is, and when its uplinks can next send: ``Departures``, ``Lagging``),
each checked against its layout before it is read, as every frame of ``emu.emulator.protocol.transport``."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from emu.emulator.protocol.transport import DONE, GO, FrameError, check_frames, frame_bytes

GO_FRAMES, DONE_FRAMES = 3, 3  # a Go's frames and a Done's, their kinds included


_WINDOW = struct.Struct("<QdB")  # window number, time (us), flag


def _window(frames: list, count: int = 2) -> tuple[int, float, int]:
    """The fields of a Go or Done message, checked against its layout."""
    check_frames(frames, count)
    if frame_bytes(frames[1]) != _WINDOW.size:
        raise FrameError("bad window message")
    return _WINDOW.unpack(frames[1])


def _floats(frame: object, what: str) -> list[float]:
    """A frame of little-endian float64s, at most one per slot pool a message may name."""
    n = frame_bytes(frame)
    if n % 8 != 0 or n > 8 * MAX_POOLS:
        raise FrameError(f"bad {what}")
    return np.frombuffer(frame, "<f8").tolist()  # type: ignore[call-overload]


@dataclass(frozen=True)
class Go:
    """Window ``window`` of the synchronized clock: handle events before ``bound_us`` (at or
    before it when ``inclusive``: zero lookahead, where a window is one round at one time);
    ``quiet_us``: per slot pool, the earliest one of its results can leave the switch where that
    is set by a member that has not started its next collective (``Departures.quiet_us``)."""

    window: int
    bound_us: float
    inclusive: bool
    quiet_us: tuple[float, ...] = ()

    def frames(self) -> list[bytes]:  # GO_FRAMES
        return [GO, _WINDOW.pack(self.window, self.bound_us, self.inclusive),
                np.asarray(self.quiet_us, "<f8").tobytes()]

    @classmethod
    def parse(cls, frames: list) -> Go:
        window, bound, inclusive = _window(frames, GO_FRAMES)
        return cls(window, bound, bool(inclusive), tuple(_floats(frames[2], "pool wakes in a window message")))


@dataclass(frozen=True)
class Departures:
    """When a host's uplinks (FIFOs) can next start to send what it has not sent, for the clock's
    bound (``emu.replay.switch.daemon.Windows``): ``local_us``, the earliest from what the host
    holds (per link, the later of its free time and the next event that can make it send);
    ``free_us``, the least free time of all links (what a segment can wake); per slot pool of
    the switch (its number in the headers' job field), ``waiting``: (the least free time of the
    links whose workers wait for one of its results, which only they can receive; the earliest
    of its results the host holds for its stamp); and ``lagging`` (``Lagging``). -inf: unknown."""

    free_us: float = -math.inf
    local_us: float = -math.inf
    waiting: tuple[tuple[float, float], ...] = ()
    lagging: tuple[Lagging, ...] = ()

    @classmethod
    def least(cls, all_: list[Departures]) -> Departures:
        """Every field's least, pool by pool (several jobs in one host, or every host at the switch)."""
        if not all_:
            return cls(math.inf, math.inf)
        if len(all_) == 1 and len(all_[0].lagging) == len(all_[0].waiting):  # one host's (in one process)
            return all_[0]
        pools = max(len(d.waiting) for d in all_)
        pad = [(*d.waiting, *[(math.inf, math.inf)] * (pools - len(d.waiting))) for d in all_]
        lag = [(*d.lagging, *[Lagging()] * (pools - len(d.lagging))) for d in all_]
        return cls(min(d.free_us for d in all_), min(d.local_us for d in all_),
                   tuple((min(p[g][0] for p in pad), min(p[g][1] for p in pad)) for g in range(pools)),
                   tuple(Lagging.least([x[g] for x in lag]) for g in range(pools)))

    def quiet_us(self) -> tuple[float, ...]:
        """Per pool, the earliest one of its results can leave the switch, where a member that has
        not started its next collective sets it (``Lagging.quiet_us``); -inf elsewhere."""
        return tuple(x.quiet_us() for x in self.lagging)

    def frame(self) -> bytes:
        lag = self.lagging or (Lagging(-math.inf, -math.inf, -math.inf),) * len(self.waiting)
        assert len(lag) == len(self.waiting)
        return np.asarray([self.free_us, self.local_us,
                           *(x for w, g in zip(self.waiting, lag, strict=True) for x in (*w, *g.fields()))],
                          "<f8").tobytes()

    @classmethod
    def parse(cls, frame: object) -> Departures:
        n = frame_bytes(frame)
        if n % 8 != 0 or (n // 8 - 2) % 5 != 0 or not 16 <= n <= 16 + 40 * MAX_POOLS:
            raise FrameError("bad departures in a window report")
        v = np.frombuffer(frame, "<f8").tolist()  # type: ignore[call-overload]
        return cls(v[0], v[1], tuple((v[i], v[i + 1]) for i in range(2, len(v), 5)),
                   tuple(Lagging(*v[i + 2:i + 5]) for i in range(2, len(v), 5)))


@dataclass(frozen=True)
class Lagging:
    """What a slot pool's members have started, for the earliest one of its results can leave
    the switch (the leaves' horizons, ``emu.replay.host.runtime.Host.leaf_horizon``). A result
    needs every member's contribution to its chunk, and the members of a pool start its
    collectives in one order (a communicator's rule; a host that sees two orders says nothing is
    known): while a member has not started the pool's next collective and every collective all
    have started is finished by all, none can come before such a member starts one. Numbering
    the pool's collectives from 0 in that order, over the members held (the least over hosts,
    ``least``): ``last_started``, the least of each member's last started one (-1: none);
    ``next_us``, the earliest a member at that least can start another (its program's next
    resumption; -inf where it is inside a collective of any kind, whose end can come from
    outside); ``first_open``, the least one a member started and has not finished (inf: none)."""

    last_started: float = math.inf
    next_us: float = math.inf
    first_open: float = math.inf

    def fields(self) -> tuple[float, float, float]:
        return self.last_started, self.next_us, self.first_open

    @classmethod
    def least(cls, all_: list[Lagging]) -> Lagging:
        last = min(x.last_started for x in all_)
        return cls(last, min((x.next_us for x in all_ if x.last_started == last), default=math.inf),
                   min(x.first_open for x in all_))

    def quiet_us(self) -> float:
        """The earliest a result can leave the switch where a lagging member sets it: its next
        resumption, where every collective started by all is finished (``first_open`` past
        ``last_started``); -inf where results may come at any time."""
        return self.next_us if self.first_open > self.last_started else -math.inf


MAX_POOLS = 1 << 16  # slot pools a window report may name (jobs and sub-groups)
_DONE = struct.Struct("<QdBdQ")  # window number, next event (us), flag, earliest segment sent (us), segments kept


@dataclass(frozen=True)
class Done:
    """A host handled window ``window``; its earliest remaining event is at ``next_us`` (inf: none);
    ``finished``: every worker it runs has run its whole program; ``departures``: when its
    uplinks can next send; ``sent_us``: the earliest of the segments it sent in the window (at the
    switch: ``SegmentRows.t``), those for its own endpoints included; ``kept_segments``: how many
    of them it delivered itself instead of through the switch (``emu.replay.host.loop``)."""

    window: int
    next_us: float
    finished: bool
    departures: Departures = Departures()
    sent_us: float = math.inf
    kept_segments: int = 0

    def frames(self) -> list[bytes]:  # DONE_FRAMES
        return [DONE, _DONE.pack(self.window, self.next_us, self.finished, self.sent_us, self.kept_segments),
                self.departures.frame()]

    @classmethod
    def parse(cls, frames: list) -> Done:
        check_frames(frames, DONE_FRAMES)
        if frame_bytes(frames[1]) != _DONE.size:
            raise FrameError("bad window report")
        window, next_us, finished, sent_us, kept = _DONE.unpack(frames[1])
        return cls(window, next_us, bool(finished), Departures.parse(frames[2]), sent_us, kept)
