"""The replay's processes: start the switch and the host processes, drive them, stop them all.

Processes are forked (cheap: a few MB each, no re-import) and talk over pyzmq on ipc://
sockets in a private temporary folder. Whatever happens (success, a failing process, a timeout,
Ctrl-C), every child is stopped: asked first, then terminated, then killed, and the folder
removed. What the processes run is the caller's plan (``emu.replay.orchestrator`` for one job,
``emu.replay.jobs`` for several).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq

from emu import lifetime
from emu.errors import RunFailed
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.children import start_processes, stop_processes
from emu.replay.control.inprocess import execute_in_process, fits_in_process
from emu.replay.control.messages import (
    Abort,
    Alive,
    Ended,
    Failed,
    HostResult,
    Message,
    Progress,
    Ready,
    Start,
    Stop,
    SwitchResult,
    decode,
    encode,
)
from emu.replay.control.plan import Measured, RunPlan
from emu.replay.host.loop import host_main
from emu.replay.host.runtime import HostSetup
from emu.replay.machines import cluster as machines
from emu.replay.machines import remote, sealed
from emu.replay.machines.sealed import Rejected
from emu.replay.report.model import ReplayReport
from emu.replay.switch.daemon import SwitchSetup, switch_main

START_DELAY_S = 0.05
READY_TIMEOUT_S = 60.0


class ReplayError(RunFailed):
    """A replay could not complete (a process failed, or the time ran out)."""



def execute(plan: RunPlan, on_progress: Callable[[float], None] | None) -> tuple[ReplayReport, float, list[HostResult]]:
    """Start the switch and the hosts ``plan`` lays out, run them to the end, stop them all.

    ``plan.reporter`` builds the report from what they measured (a partial one, marked so, after a
    failure or an interrupt, attached to the exception). Returns the report, the seconds the run
    itself took, and the hosts' results.

    Spread over several machines (``emu.replay.machines.cluster.spread``), machine 0 does all this
    with TCP endpoints and sealed messages, starting only its share of the hosts, and the others
    host theirs (``emu.replay.machines.remote``)."""
    cluster = machines.current()
    if cluster is not None and cluster.world == 1:
        cluster = None
    if cluster is not None:
        remote.check_spreadable(plan.config)
        if cluster.rank != 0:
            return remote.serve_share(cluster, plan)
    elif plan.config.one_process and fits_in_process(plan):
        return execute_in_process(plan, on_progress)
    return _Execution(plan, cluster).run(on_progress)


def _private_folder() -> str:
    """A folder for the run's sockets, only its user can enter (recorded for ``emu clean``)."""
    workdir = tempfile.mkdtemp(prefix="emu-replay-")
    if len(workdir) + len("/control") > getattr(zmq, "IPC_PATH_MAX_LEN", 107):
        # a deep $TMPDIR makes socket paths longer than the kernel allows: a short folder instead
        shutil.rmtree(workdir, ignore_errors=True)
        workdir = tempfile.mkdtemp(prefix="emu-replay-", dir="/tmp")
    record = lifetime.current()
    if record is not None:
        record.add_folder(workdir)
    return workdir


def _cpu_s() -> float:
    """CPU seconds of this process and its children so far."""
    kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime


class _Execution:
    """One run of a plan's processes on machine 0 (or alone), and everything it must undo."""

    def __init__(self, plan: RunPlan, cluster: Any) -> None:
        self.plan, self.cluster = plan, cluster
        self.run_no = -1
        if cluster is not None:
            self.run_no = cluster.runs
            cluster.runs += 1
        self.key = cluster.key if cluster is not None else None
        self.published = False
        self.workdir = _private_folder()
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.ctx: zmq.Context | None = None
        self.stack = contextlib.ExitStack()
        self.driver: _Run | None = None
        self.results_due = 0

    def run(self, on_progress: Callable[[float], None] | None) -> tuple[ReplayReport, float, list[HostResult]]:
        cpu0, wall_start = _cpu_s(), time.monotonic()
        try:  # the plan too: whatever it raises, the folder goes
            setups, sw, local = self._endpoints()
            # a host sends one result per job it holds (jobs sharing the fabric), else one
            worker_results = sum(max(1, len(s.parts)) for s in setups if s.role == "workers")
            ps_results = sum(max(1, len(s.parts)) for s in setups if s.role == "ps")
            self.results_due = worker_results + ps_results
            run = self._start(setups, sw, local)
            run.wait_ready()
            wall0 = time.monotonic() + START_DELAY_S
            run.broadcast(Start(wall0))
            results = run.collect(worker_results, self.plan.total, setups, on_progress)
            run_s = time.monotonic() - wall0
            run.broadcast(Stop(), include_switch=True)
            extra, switch_stats = run.drain(ps_results)
            wall_s = time.monotonic() - wall_start
            _join(self.procs)
            results += extra
            measured = Measured(results, switch_stats, wall_s, _cpu_s() - cpu0, len(self.procs) + len(setups) - len(local))
            report = self._finish(self.plan.reporter.build(measured), run, run_s, results, switch_stats.rejected)
            return report, run_s, results
        except (RunFailed, KeyboardInterrupt, lifetime.Terminated) as exc:
            self._partial(exc, wall_start)
            raise
        finally:
            self._cleanup(sys.exc_info()[1])

    def _endpoints(self) -> tuple[list[HostSetup], SwitchSetup, list[HostSetup]]:
        """The setups at this run's endpoints, and those this machine hosts. Over several machines the
        plan is published (endpoints, who hosts what, a digest) and every setup sealed with a key of
        this run's, so that nothing of another run authenticates in it."""
        if self.cluster is None:
            setups, sw = self.plan.at(f"ipc://{self.workdir}/switch", f"ipc://{self.workdir}/control")
            return setups, sw, setups
        addresses, held = self.cluster.endpoints(2)  # held until the switch and the orchestrator bound them
        self.stack.callback(lambda: [s.close() for s in held])
        setups, sw = self.plan.at(*addresses)
        where = remote.machine_of(self.cluster, setups)
        nonce = secrets.token_hex(16)
        remote.publish(self.cluster, self.run_no, sw.address, sw.control_addr, where,
                       remote.digest(self.plan.config, setups, sw), nonce)
        self.key = sealed.derive(self.cluster.key, nonce)
        setups = [replace(s, key=self.key) for s in setups]
        local = [s for s, m in zip(setups, where, strict=True) if m == 0]
        return setups, replace(sw, key=self.key), local

    def _start(self, setups: list[HostSetup], sw: SwitchSetup, local: list[HostSetup]) -> _Run:
        """The external switch, the switch and local hosts' processes, then the control socket (children
        first: no zmq context crosses a fork)."""
        config = self.plan.config
        if self.plan.external:
            self.stack.enter_context(config.network.external_switch(sw.workers, sw.slots))
        start_processes([(switch_main, sw, "emu-switch"), *((host_main, s, f"emu-host{s.index}") for s in local)],
                        self.workdir, self.procs)
        self.ctx = zmq.Context()
        ctrl = sealed.make(self.ctx, zmq.ROUTER, self.key, "control")
        ctrl.setsockopt(zmq.LINGER, 0)
        ctrl.bind(sw.control_addr)
        watch = None if self.cluster is None else remote.Watch(self.cluster, ctrl)
        self.driver = _Run(ctrl, self.procs, config, len(setups), watch)
        return self.driver

    def _finish(self, report: ReplayReport, run: _Run, run_s: float, results: list[HostResult],
                switch_rejected: int) -> ReplayReport:
        dropped = sealed.rejected(run.ctrl) + switch_rejected + sum(r.rejected for r in results)
        report = replace(report, emulator=replace(report.emulator, run_s=run_s, rejected_messages=dropped,
                                                  machines=1 if self.cluster is None else self.cluster.world))
        run.started = False  # finished: a failure from here on is not a partial run
        if self.cluster is not None:
            remote.finish(self.cluster, self.run_no, report, None)
            self.published = True
        return report

    def _partial(self, exc: BaseException, wall_start: float) -> None:
        """What the processes still alive measured, marked as partial, on the exception."""
        run = self.driver
        if run is None or not run.started:
            return
        reason = {KeyboardInterrupt: "interrupted", lifetime.Terminated: "terminated"}.get(type(exc), str(exc))
        hosts, switch = run.leftover_results(self.results_due)
        with contextlib.suppress(Exception):  # a partial report must never hide the failure
            report = self.plan.reporter.build(Measured(hosts, switch, time.monotonic() - wall_start, 0.0,
                                                       len(self.procs)))
            exc.partial_report = replace(report, complete=False, reason=reason)  # type: ignore[attr-defined]

    def _cleanup(self, failure: BaseException | None) -> None:
        with lifetime.signals_held():  # a second Ctrl-C must not cut the cleanup short
            if self.cluster is not None and not self.published:  # every other machine ends with this error
                why = {KeyboardInterrupt: "interrupted", lifetime.Terminated: "terminated"}.get(
                    type(failure), str(failure)) or f"machine 0 failed ({type(failure).__name__})"
                if self.driver is not None and self.driver.watch is not None:
                    self.driver.watch.send(Abort(why))
                remote.finish(self.cluster, self.run_no, None, why)
            stop_processes(self.procs)
            if self.ctx is not None:
                self.ctx.destroy(linger=0)
            self.stack.close()
            shutil.rmtree(self.workdir, ignore_errors=True)


class _Run:
    def __init__(self, ctrl: zmq.Socket, procs: list, config: ReplayConfig, hosts: int,
                 watch: remote.Watch | None = None) -> None:
        self.ctrl, self.procs, self.config, self.hosts, self.watch = ctrl, procs, config, hosts, watch
        self.idents: dict[Any, bytes] = {}
        self.poller = zmq.Poller()
        self.poller.register(ctrl, zmq.POLLIN)
        self.started = False
        self.results: dict[tuple[int, int], HostResult] = {}  # by (host, job)
        self.pending: list[Message] = []  # read while looking for a dead process's last words

    def _dead(self) -> list[tuple[Any, int | str]]:
        """Processes that ended with an error, each with its name on the control socket."""
        return [(p, "switch" if p.name == "emu-switch" else int(p.name.removeprefix("emu-host")))
                for p in self.procs if p.exitcode not in (None, 0)]

    def _check_children(self, exclude: int | str | None = None) -> None:
        if self.watch is not None:
            self.watch.tick()
        dead = [(p, who) for p, who in self._dead() if who != exclude]
        if not dead:
            return
        p, who = dead[0]
        # a process that failed said why before it exited: prefer its own words
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline and self.poller.poll(50):
            try:
                _, data = self.ctrl.recv_multipart()
            except Rejected:
                continue
            msg = decode(data)
            if isinstance(msg, Failed) and msg.host == who:
                self._raise_failed(msg)
            if not isinstance(msg, Failed | Alive):
                self.pending.append(msg)
        raise ReplayError(f"the replay process {p.name} died (exit code {p.exitcode})")

    @staticmethod
    def _raise_failed(msg: Failed) -> None:
        if msg.user:
            raise ReplayError(msg.error)
        raise ReplayError(f"replay process {msg.host} failed: {msg.error}")

    def _recv(self, timeout_ms: int) -> Message | None:
        if self.pending:
            return self.pending.pop(0)
        if not self.poller.poll(timeout_ms):
            return None
        try:
            ident, data = self.ctrl.recv_multipart()
        except Rejected:
            return None
        msg = decode(data)
        if isinstance(msg, Alive):
            if self.watch is not None:
                self.watch.alive(msg.machine, ident)
            return None
        if isinstance(msg, Failed):
            # a process that died makes its peers fail (the switch cannot reach a killed host):
            # name that death, the cause, when there is one
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                self._check_children(exclude=msg.host)  # another's death (in its own words if it said any)
                time.sleep(0.02)
            ended = [p.name for p in self.procs if p.exitcode == 0]  # stopped as asked: not a death
            if ended:
                msg = replace(msg, error=f"{msg.error} ({', '.join(ended)} had ended normally)")
            self._raise_failed(msg)
        if isinstance(msg, Ready):
            self.idents[msg.host] = ident
        return msg

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self.idents) < self.hosts + 1:
            if time.monotonic() > deadline:
                raise ReplayError(f"only {len(self.idents)} of {self.hosts + 1} replay processes started "
                                  f"within {READY_TIMEOUT_S:.0f} s")
            self._check_children()
            self._recv(100)

    def broadcast(self, msg: Start | Stop, include_switch: bool = False) -> None:
        self.started = self.started or isinstance(msg, Start)
        data = encode(msg)
        for host, ident in self.idents.items():
            if host == "switch" and not include_switch:
                continue
            self.ctrl.send_multipart([ident, data])

    def collect(self, worker_hosts: int, total: int, setups: list[HostSetup],
                on_progress: Callable[[float], None] | None) -> list[HostResult]:
        done = self.results
        progress: dict[int, int] = {}
        sizes = {s.index: len(s.endpoints) for s in setups if s.role == "workers"}
        deadline = time.monotonic() + self.config.timeout_s
        # on the synchronized clock the run ends when the switch's clock does (``Ended``): a
        # parameter server's host may have windows to run after every worker's host reported
        ended = self.config.resolved_clock != Clock.SYNC
        while len(done) < worker_hosts or not ended:
            if time.monotonic() > deadline:
                raise ReplayError(f"the replay did not finish within --timeout {self.config.timeout_s:.0f} s; "
                                  "raise it, replay fewer iterations, or use a larger --payload-scale")
            self._check_children()
            msg = self._recv(200)
            if msg is None:
                continue
            if isinstance(msg, Progress):
                progress[msg.host] = msg.iterations
            elif isinstance(msg, HostResult):
                done[(msg.host, msg.job)] = msg
                progress[msg.host] = 10**9
            elif isinstance(msg, Ended):
                ended = True
            if on_progress is not None and total:
                its = sum(min(progress.get(h, 0), total) * n for h, n in sizes.items())
                on_progress(min(1.0, its / total))
        return list(done.values())

    def leftover_results(self, hosts: int) -> tuple[list[HostResult], SwitchResult]:
        """After a failure: ask every process still alive for what it measured (2 s at most)."""
        switch: SwitchResult | None = None
        # the switch first: a host that stops leaves the switch unable to reach it
        with contextlib.suppress(Exception):
            if "switch" in self.idents:
                self.ctrl.send_multipart([self.idents["switch"], encode(Stop())])
        deadline = time.monotonic() + 1.0
        while switch is None and time.monotonic() < deadline:
            try:
                msg = self._recv(50)
            except RunFailed:
                continue
            if isinstance(msg, SwitchResult):
                switch = msg
            elif isinstance(msg, HostResult):
                self.results[(msg.host, msg.job)] = msg
        with contextlib.suppress(Exception):
            self.broadcast(Stop())
        deadline = time.monotonic() + 2.0
        while (len(self.results) < hosts or switch is None) and time.monotonic() < deadline:
            try:
                msg = self._recv(100)
            except RunFailed:  # another process's failure: it has nothing to give
                continue
            if isinstance(msg, HostResult):
                self.results[(msg.host, msg.job)] = msg
            elif isinstance(msg, SwitchResult):
                switch = msg
        return list(self.results.values()), switch or SwitchResult({}, 0)

    def drain(self, results: int) -> tuple[list[HostResult], SwitchResult]:
        """The parameter-server hosts' results and the switch's, after Stop."""
        hosts: list[HostResult] = []
        switch: SwitchResult | None = None
        deadline = time.monotonic() + 30
        while (len(hosts) < results or switch is None) and time.monotonic() < deadline:
            if self.watch is not None:
                self.watch.tick()
            msg = self._recv(200)
            if isinstance(msg, HostResult):
                hosts.append(msg)
            elif isinstance(msg, SwitchResult):
                switch = msg
        if switch is None:
            raise ReplayError("the switch process did not report within 30 s of the end")
        return hosts, switch


def _join(procs: list) -> None:
    deadline = time.monotonic() + 10
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


__all__ = ["ReplayError", "execute"]
