"""A replay in one process: the switch's data plane and every host's endpoints in the orchestrator,
the synchronized clock's windows as calls instead of messages (docs/design-notes.md).

The same objects run as in the socketed layout (``emu.replay.host.runtime.Host`` or ``JobsHost`` for
each host of the plan, the switch's pools, ``emu.replay.switch.daemon.Windows``), in the same
order: in window ``k`` the held contributions before its bound are applied in stamp order and
their results handed to their hosts, then each host advances to the bound and hands over what its
uplinks delivered, contributions to the switch and segments to their destinations' hosts. A host's
traffic in a window cannot reach another host before the next (the lookahead), so handing it over
at once or after a socket changes nothing: reports are identical to the socketed layouts'
(tests/replay/test_clock.py). What no process crosses, ``emulator.real_bytes`` counts as 0.

It runs where nothing needs a process of its own: one machine, the synchronized clock, a switch
in emu (no external one).
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from emu import lifetime
from emu.emulator.protocol.rows import one_value
from emu.emulator.protocol.transport import Segment, SegmentRows
from emu.errors import RunFailed
from emu.replay.config.options import Clock
from emu.replay.control.messages import HostResult, SwitchResult
from emu.replay.control.plan import Measured, RunPlan
from emu.replay.host.jobs import JobsHost
from emu.replay.host.runtime import Host
from emu.replay.report.model import ReplayReport
from emu.replay.switch.daemon import Windows, _Pools, aggregate

PROGRESS_EVERY_S = 0.2
TIMEOUT_CHECK_EVERY = 64  # windows between looks at the wall clock


def fits_in_process(plan: RunPlan) -> bool:
    """Whether ``plan`` can run in one process: the synchronized clock (a switch outside emu, BMv2,
    takes part in it through its bridge, in this process)."""
    return plan.config.resolved_clock == Clock.SYNC


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


class _InProcess:
    """The plan's hosts and switch as objects of this process, driven window by window."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.hosts: list[Host | JobsHost] = [JobsHost(s) if s.parts else Host(s) for s in plan.at("", "")[0]]
        self.switch_setup = plan.at("", "")[1]
        net = plan.config.network
        self.pools = _Pools(self.switch_setup) if net.sums_in_switch_process else None
        self.route = self.pools or _Pools(self.switch_setup, aggregates=False)
        self.clock = Windows(self.switch_setup)
        self.forwarded = 0
        self.workers = [h for h in self.hosts if h.setup.role == "workers"]
        # hosts that hand their segments over one at a time keep them as objects between hosts: rows
        # (the wire's form) would be built and taken apart again within the window
        self.objects = all(isinstance(h, Host) and not h.p2p.batched for h in self.hosts)

    def run(self, on_progress: Callable[[float], None] | None) -> None:
        for h in self.hosts:
            h.begin()
        deadline = time.monotonic() + self.plan.config.timeout_s
        shown = time.monotonic()
        while True:
            hosts = self.hosts
            step = self.clock.bound([h.next_us() for h in hosts], [h.finished() for h in hosts],
                                    [h.departures() for h in hosts])
            if step is None:
                return
            bound, inclusive = step
            self._window(bound, inclusive)
            if self.clock.window % TIMEOUT_CHECK_EVERY == 0:
                now = time.monotonic()
                if now > deadline:
                    raise RunFailed(f"the replay did not finish within --timeout {self.plan.config.timeout_s:.0f} "
                                    "s; raise it, replay fewer iterations, or use a larger --payload-scale")
                if on_progress is not None and now - shown > PROGRESS_EVERY_S:
                    shown = now
                    on_progress(self.progress())

    def _window(self, bound: float, inclusive: bool) -> None:
        batch = self.clock.due(bound, inclusive)
        if batch is not None:
            assert self.pools is not None
            for h, part in aggregate(self.pools, batch):
                self.hosts[h].receive_results(part)
        for host in self.hosts:
            host.advance(bound, inclusive, quiet_us=self.clock.quiet_us)
            if self.objects:
                assert isinstance(host, Host)
                out, segs = host.take_segments()
            else:
                out, segs = host.take_outgoing()
            if out is not None and len(out.headers):
                self.clock.pending.append(out)
            if not len(segs):
                continue
            # each host its part (as the switch process forwards them)
            if isinstance(segs, SegmentRows):
                self.clock.seg_min = min(self.clock.seg_min, float(segs.t.min()))
                dest = self.route.hosts_of(segs.job, segs.dst)
                if one_value(dest):
                    self.hosts[int(dest[0])].receive_rows(segs)
                else:
                    for h in np.unique(dest).tolist():
                        self.hosts[h].receive_rows(segs.take(np.flatnonzero(dest == h)))
            else:
                self._forward(segs)
            self.forwarded += len(segs)

    def _forward(self, segs: list[Segment]) -> None:
        """Segments, each to its destination's host, in the order the rows of ``take_outgoing``
        hand them over, each with values of its own (as a segment off the wire has)."""
        self.clock.seg_min = min(self.clock.seg_min, min(s.first_us for s in segs))
        route, hosts = self.route, self.hosts
        for s in segs:
            h = hosts[route.host_of(s.job, s.dst)]
            assert isinstance(h, Host)
            h.receive_segment(Segment(s.job, s.dtype, s.src, s.dst, s.seq, s.segment, s.emu_bytes, s.first_us,
                                      s.last_us, np.array(s.values, np.float64)))

    def progress(self) -> float:
        done = sum(min(fw.s.it for fw in h.workers.values()) * len(h.workers) if isinstance(h, Host)
                   else 0 for h in self.workers)
        return min(1.0, done / max(1, self.plan.total))

    def measured(self, wall_s: float, cpu_s: float) -> Measured:
        results: list[HostResult] = []
        for h in self.hosts:
            got = h.metrics()
            results += got if isinstance(got, list) else [got]
        results = [_no_sockets(r) for r in results]
        stats = self.pools.stats() if self.pools else {}
        pipe = self.clock.pipeline
        switch = SwitchResult(stats, self.forwarded, self.clock.window, pipe.busy_us if pipe else 0.0)
        return Measured(results, switch, wall_s, cpu_s, 1)


def _no_sockets(result: HostResult) -> HostResult:
    return replace(result, real_bytes=0)


def execute_in_process(plan: RunPlan, on_progress: Callable[[float], None] | None
                       ) -> tuple[ReplayReport, float, list[HostResult]]:
    """Run ``plan`` in this process (module docstring); as ``emu.replay.control.processes.execute``,
    the report (partial, on the exception, after a failure or an interrupt), the run's seconds and
    the hosts' results."""
    with contextlib.ExitStack() as stack:
        if plan.external:  # a switch outside emu (BMv2) runs for the replay's lifetime
            sw = plan.at("", "")[1]
            stack.enter_context(plan.config.network.external_switch(sw.workers, sw.slots))
        return _execute(plan, on_progress, stack)


def _execute(plan: RunPlan, on_progress: Callable[[float], None] | None,
             stack: contextlib.ExitStack) -> tuple[ReplayReport, float, list[HostResult]]:
    wall0, cpu0 = time.monotonic(), _cpu_s()
    run = _InProcess(plan)
    if run.pools is not None:
        stack.callback(run.pools.close)
    try:
        run.run(on_progress)
    except (RunFailed, KeyboardInterrupt, lifetime.Terminated) as exc:
        reason = {KeyboardInterrupt: "interrupted", lifetime.Terminated: "terminated"}.get(type(exc), str(exc))
        with contextlib.suppress(Exception):  # a partial report must never hide the failure
            report = plan.reporter.build(run.measured(time.monotonic() - wall0, _cpu_s() - cpu0))
            exc.partial_report = replace(report, complete=False, reason=reason)  # type: ignore[attr-defined]
        raise
    run_s = time.monotonic() - wall0
    measured = run.measured(run_s, _cpu_s() - cpu0)
    report = plan.reporter.build(measured)
    report = replace(report, emulator=replace(report.emulator, run_s=run_s, rejected_messages=0, machines=1))
    if on_progress is not None:
        on_progress(1.0)
    return report, run_s, measured.hosts
