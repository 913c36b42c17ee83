"""A host process's loop: the clock that tells its endpoints (``emu.replay.host.runtime``) how far to go.

Synchronized clock (the default): the switch process is the coordinator of a
conservative parallel discrete-event simulation (docs/physics.md, "The clock").
It sends each host, on the data socket and after that window's results, ``Go(bound)``;
the host handles everything before the bound, sends what its uplinks delivered,
then ``Done(next event time, departures)`` (when its uplinks can next send:
``emu.emulator.protocol.window.Departures``). pyzmq keeps the order of the messages on one
socket, so a host has every message of a window when its ``Go`` arrives, and the
switch has every contribution of a window when the last ``Done`` arrives. Nothing
sleeps: a window jumps to the next event however far ahead it is.

Wall clock (``--clock wall``): events are due when the wall clock reaches their
emulated time times the dilation (absolute deadlines, never relative sleeps);
how late each was handled is the lag the report gives.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import zmq

from emu import lifetime
from emu.emulator.protocol.transport import AGG, GO, HELLO, RESULTS, SEG, SEG_FRAMES, AggBatch, FrameError, SegmentBatch
from emu.emulator.protocol.window import GO_FRAMES, Done, Go
from emu.replay.config.options import Clock
from emu.replay.control.messages import (
    Progress,
    Ready,
    Start,
    Stop,
    connect_control,
    decode,
    encode,
    failure,
    quick_reconnect,
)
from emu.replay.host.jobs import JobsHost
from emu.replay.host.runtime import Host, HostSetup
from emu.replay.machines import sealed
from emu.replay.machines.sealed import Rejected

PROGRESS_S = 0.2
POLL_MS = 100


def host_main(setup: HostSetup) -> None:
    """Entry of a forked host process; it returns when the orchestrator says stop."""
    ctx = zmq.Context()
    me = f"h{setup.index}".encode()
    ctrl = connect_control(ctx, setup.control_addr, setup.key, me)
    data = sealed.make(ctx, zmq.DEALER, setup.key, "data", me)
    data.setsockopt(zmq.LINGER, 2000)
    data.setsockopt(zmq.SNDHWM, 0)
    data.setsockopt(zmq.RCVHWM, 0)
    quick_reconnect(data)
    data.connect(setup.switch_addr)
    data.send(HELLO)
    try:
        host: Host | JobsHost = JobsHost(setup) if setup.parts else Host(setup)
        ctrl.send(encode(Ready(setup.index)))
        if setup.config.resolved_clock == Clock.SYNC:
            _Loop(host, ctrl, data).serve_sync()
        else:
            _Loop(host, ctrl, data).serve_wall()
    except Exception as exc:  # reported to the orchestrator, which stops everything
        try:
            if not lifetime.orphaned():  # nobody to read it
                ctrl.send(encode(failure(setup.index, exc)))
            ctrl.close(linger=1000)  # the report must leave before the process does
        except zmq.ZMQError:
            pass
        raise
    finally:  # every socket closed at once (a term with one still open would wait forever)
        ctx.destroy(linger=0)


class _Loop:
    def __init__(self, host: Host | JobsHost, ctrl: zmq.Socket, data: zmq.Socket) -> None:
        self.host, self.ctrl, self.data = host, ctrl, data
        # a host of workers (not of parameter-server shards) reports when they are done; asked once
        # (a JobsHost builds its ``workers`` afresh at each call: every job's, a window's cost)
        self.runs_workers = bool(host.workers)
        self.poller = zmq.Poller()
        self.poller.register(ctrl, zmq.POLLIN)
        self.poller.register(data, zmq.POLLIN)
        self.started = self.reported = self.stopped = False
        self.last_progress = 0.0
        self.wall0 = 0.0

    def _control(self) -> None:
        try:
            msg = decode(self.ctrl.recv())
        except Rejected:
            return
        if isinstance(msg, Start):
            self.wall0 = msg.wall0
            self.started = True
            self.host.begin()
        elif isinstance(msg, Stop):
            if not self.reported:
                self._report()
            self.stopped = True

    def _report(self) -> None:
        results = self.host.metrics()
        dropped = sealed.rejected(self.ctrl, self.data)
        for i, result in enumerate(results if isinstance(results, list) else [results]):
            self.ctrl.send(encode(replace(result, rejected=dropped if i == 0 else 0)))

    def _send_out(self, keep_own: bool = False, report: Callable[[float, int], list] | None = None) -> None:
        """Send what the uplinks delivered: the contributions, and the segments to the switch, which
        forwards each to its destination's host. ``keep_own`` (the synchronized clock): a segment
        for an endpoint of this host is delivered here at once instead, as the switch would have
        before the next window (the lookahead; the in-process layout does the same), and the
        window's report counts it (``Done``). ``report`` (the synchronized clock): the window's
        report's frames from the earliest segment sent (at the switch) and how many were kept, made
        once those are delivered here and sent in the message of the last batch of segments (or
        alone): a message less a window for the switch to take."""
        batch, segs = self.host.take_outgoing()
        sent = 0
        if batch is not None:
            frames = batch.frames(AGG)
            sent += sum(memoryview(f).nbytes for f in frames)
            self.data.send_multipart(frames, copy=False)
        first = float(segs.t.min()) if len(segs) else math.inf
        kept = 0
        if keep_own and len(segs):
            own = self.host.holds(segs.job, segs.dst)
            kept = int(own.sum())
            if kept:
                self.host.receive_rows(segs.take(np.flatnonzero(own)) if kept < len(segs) else segs)
                segs = segs.take(np.flatnonzero(~own))
        parts = segs.batches() if len(segs) else []
        for i, part in enumerate(parts):
            frames = part.frames()
            sent += sum(memoryview(f).nbytes for f in frames)
            if report is not None and i == len(parts) - 1:
                frames, report = [*frames, *report(first, kept)], None
            self.data.send_multipart(frames, copy=False)
        if report is not None:
            self.data.send_multipart(report(first, kept))
        self.host.counters.real_bytes += sent

    def _tick(self) -> None:
        host = self.host
        wall = time.monotonic()
        if wall - self.last_progress > PROGRESS_S and self.runs_workers:
            self.last_progress = wall
            done_its = min(fw.s.it for fw in host.workers.values())
            with contextlib.suppress(zmq.Again):  # progress is for the eye: never wait to send it
                self.ctrl.send(encode(Progress(host.setup.index, done_its)), zmq.NOBLOCK)
        if self.runs_workers and not self.reported and host.done():
            self._report()
            self.reported = True

    def _data(self, on_go) -> None:
        while True:
            try:
                frames = self.data.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = frames[0]
            self.host.counters.real_bytes += sum(len(f) for f in frames)
            if kind == RESULTS:
                self.host.receive_results(AggBatch.parse(frames))
            elif kind == SEG:  # on the synchronized clock, the switch's last batch of a window carries its Go
                go = len(frames) == SEG_FRAMES + GO_FRAMES
                self.host.receive_rows(SegmentBatch.parse(frames[:SEG_FRAMES] if go else frames).rows())
                if go:
                    if bytes(frames[SEG_FRAMES]) != GO or on_go is None:
                        raise FrameError(f"segments with a trailing message that is not a window's Go at host "
                                         f"{self.host.setup.index}")
                    on_go(Go.parse(frames[SEG_FRAMES:]))
            elif kind == GO and on_go is not None:
                on_go(Go.parse(frames))
            else:
                raise FrameError(f"unknown message kind {kind[:8]!r} at host {self.host.setup.index}")

    # -- the synchronized clock ---------------------------------------------------------
    def serve_sync(self) -> None:
        while not self.stopped:
            events = self.poller.poll(POLL_MS)
            if not events:
                lifetime.leave_if_orphaned(f"host {self.host.setup.index}")
            for sock, _ in events:
                if sock is self.ctrl:
                    started = self.started
                    self._control()
                    if self.started and not started:  # window 0: where this host's first event is
                        self._report_window0()
                else:
                    self._data(self._window)
            if self.started:
                self._tick()

    def _report_window0(self) -> None:
        self.data.send_multipart(Done(0, self.host.next_us(), self.host.finished(), self.host.departures()).frames())

    def _window(self, go: Go) -> None:
        host = self.host
        host.advance(go.bound_us, go.inclusive, quiet_us=go.quiet_us)
        self._send_out(keep_own=True, report=lambda first, kept: Done(
            go.window, host.next_us(), host.finished(), host.departures(), first, kept).frames())

    # -- the wall clock -----------------------------------------------------------------
    def now_us(self) -> float:
        return (time.monotonic() - self.wall0) * 1e6 / self.host.cfg.dilation

    def serve_wall(self) -> None:
        self.host.measure_lag = True
        dilation = self.host.cfg.dilation
        while not self.stopped:
            timeout_ms = POLL_MS
            if self.started:
                nxt = self.host.next_us()
                if nxt < math.inf:
                    timeout_ms = int(min(POLL_MS, max(0.0, (nxt - self.now_us()) * dilation / 1000)))
            events = self.poller.poll(timeout_ms)
            if not events and timeout_ms == POLL_MS:  # idle a whole poll: not every event's
                lifetime.leave_if_orphaned(f"host {self.host.setup.index}")
            for sock, _ in events:
                if sock is self.ctrl:
                    self._control()
                else:
                    self._data(None)
            if not self.started or self.stopped:
                continue
            now = self.now_us()
            self.host.advance(now, inclusive=True, now=now)
            self._send_out()
            self._tick()


__all__ = ["host_main"]
