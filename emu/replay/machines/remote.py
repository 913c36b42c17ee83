"""One run spread over several machines (docs/multi-host.md): machine 0's side, which publishes
the run and watches the others (``Watch``), and every other machine's, which hosts its share of
the worker host processes (``serve_share``).

Every machine plans the same run from the same trace and options (``emu.replay.machines.cluster``
checked that they were given the same), so no plan crosses the network: machine 0 publishes only
its endpoints, which machine hosts which host process, and a digest of the plan, which each
machine compares with its own. Machine 0 runs the switch, the parameter-server shards and its
share; its orchestrator is the only reader of results, as on one machine (``emu.replay.control.processes``).
Liveness goes both ways on the control socket (``Alive`` every ``HEARTBEAT_S``): a machine silent
for ``MACHINE_TIMEOUT_S`` ends the run on machine 0, and machine 0 silent as long ends it on the
others, which stop their processes; the outcome (the report, or why the run failed) goes through
the store, so every machine ends with machine 0's report or its error.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from emu import lifetime
from emu.emulator import fabric as fabrics
from emu.errors import ConfigError
from emu.replay.config.options import Clock, ReplayConfig
from emu.replay.control.children import start_processes, stop_processes
from emu.replay.control.messages import Abort, Alive, Failed, Stop, connect_control, decode, encode
from emu.replay.control.plan import RunPlan
from emu.replay.host.loop import host_main
from emu.replay.host.runtime import HostSetup
from emu.replay.machines import sealed
from emu.replay.machines.cluster import HEARTBEAT_S, MACHINE_TIMEOUT_S, Cluster, MachineLost
from emu.replay.machines.sealed import Rejected
from emu.replay.report.model import ReplayReport
from emu.replay.switch.daemon import SwitchSetup

FIRST_CONTACT_S = 60.0
CLOSED_SILENCE_S = 8 * HEARTBEAT_S  # a machine's first heartbeat of a run may wait for its plan and its processes


def check_spreadable(config: ReplayConfig) -> None:
    """What a replay spread over machines cannot do, refused on every machine alike."""
    if config.resolved_clock == Clock.WALL:
        raise ConfigError("--clock wall paces every process by its machine's wall clock, which machines do not "
                          "share: a replay over several machines runs on the synchronized clock (drop --clock wall "
                          "and --tdf)")
    if config.network.external:
        raise ConfigError(f"--fabric {config.fabric} drives a switch on this machine: a replay over several machines "
                          f"runs on {fabrics.listing(True)}")


def digest(config: ReplayConfig, setups: list[HostSetup], sw: SwitchSetup) -> str:
    """What every machine must have planned alike: the configuration and who holds which endpoint."""
    text = repr((config, [(s.index, s.role, s.endpoints, s.iters, len(s.programs), s.spans) for s in setups],
                 sw.workers, sw.slots, sw.lookahead_us, sw.pools))
    return hashlib.sha256(text.encode()).hexdigest()


def machine_of(cluster: Cluster, setups: list[HostSetup]) -> list[int]:
    """Each host process's machine: the worker hosts in shares (``Cluster.share``), the
    parameter-server shards on machine 0, beside the switch."""
    workers = [s for s in setups if s.role == "workers"]
    share = cluster.share(len(workers))
    where = {s.index: share[i] for i, s in enumerate(workers)}
    return [where.get(s.index, 0) for s in setups]


class Watch:
    """Machine 0's view of the other machines during a run: who is alive, and telling them so."""

    def __init__(self, cluster: Cluster, ctrl: zmq.Socket) -> None:
        self.cluster, self.ctrl = cluster, ctrl
        now = time.monotonic()
        self.heard: dict[int, float] = {}
        self.start = now
        self.idents: dict[int, bytes] = {}
        self.sent = 0.0
        # a closed connection (a killed machine's) shortens the verdict: whoever has been silent since
        # is gone after CLOSED_SILENCE_S, 8 heartbeats (the socket does not say who closed; hosts that
        # end close theirs too, so a live machine must be given time to speak under load)
        self.monitor = ctrl.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.closed_at: float | None = None

    def _disconnects(self) -> None:
        while True:
            try:
                recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            self.closed_at = time.monotonic()

    def alive(self, machine: int, ident: bytes) -> None:
        if 0 < machine < self.cluster.world:
            self.idents[machine] = ident
            self.heard[machine] = time.monotonic()

    def tick(self) -> None:
        """Say machine 0 is alive, and end the run if a machine went silent."""
        now = time.monotonic()
        if now - self.sent >= HEARTBEAT_S:
            self.sent = now
            self.send(Alive(0))
            for r in range(1, self.cluster.world):  # a machine that failed outside the run says so in the store
                gone = self.cluster.left(r)
                if gone is not None:
                    raise MachineLost(f"machine {r} ({self.cluster.machines[r].hostname}) left the run: "
                                      f"{gone or 'its output says why'}")
        self._disconnects()
        for r in range(1, self.cluster.world):
            last = self.heard.get(r)
            closed = self.closed_at
            if last is not None and closed is not None and last < closed and now - closed > CLOSED_SILENCE_S:
                raise MachineLost(f"machine {r} ({self.cluster.machines[r].hostname}) stopped answering after a "
                                  "connection closed: it was killed or lost its network")
            if last is None and now - self.start > FIRST_CONTACT_S:
                raise MachineLost(f"machine {r} ({self.cluster.machines[r].hostname}) never joined the run within "
                                  f"{FIRST_CONTACT_S:.0f} s")
            if last is not None and now - last > MACHINE_TIMEOUT_S:
                raise MachineLost(f"machine {r} ({self.cluster.machines[r].hostname}) stopped answering for "
                                  f"{MACHINE_TIMEOUT_S:.0f} s: it was killed, lost its network, or is overloaded")

    def send(self, msg: Alive | Abort) -> None:
        data = encode(msg)
        for ident in self.idents.values():
            try:
                self.ctrl.send_multipart([ident, data], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a machine that left cannot be told


def publish(cluster: Cluster, run: int, switch_addr: str, control_addr: str, where: list[int], plan: str,
            nonce: str) -> None:
    """The run, for the others: machine 0's endpoints, who holds which host process, the plan's
    digest, and the nonce its key is derived from."""
    cluster.put(f"run/{run}/plan", {"switch": switch_addr, "control": control_addr, "machine_of": where,
                                    "digest": plan, "nonce": nonce})


def finish(cluster: Cluster, run: int, report: ReplayReport | None, error: str | None) -> None:
    """The outcome every other machine ends with: machine 0's report, or its error."""
    try:
        if error is not None and not cluster.has(f"run/{run}/plan"):  # failed before it published the run
            cluster.put(f"run/{run}/plan", {"error": error})
        cluster.put(f"run/{run}/outcome", {"ok": error is None, "error": error,
                                           "report": None if report is None else report.to_dict()})
    except Exception:  # noqa: BLE001  (a store already gone: the others find machine 0 silent)
        pass


def serve_share(cluster: Cluster, plan: RunPlan) -> tuple[ReplayReport, float, list[Any]]:
    """A machine other than 0: run its share of the host processes of the next run, and return
    machine 0's report of it (or raise its error)."""
    config = plan.config
    check_spreadable(config)
    run = cluster.runs
    cluster.runs += 1
    doc = cluster.get(f"run/{run}/plan", what=f"machine 0's plan of run {run}")
    if "error" in doc:
        raise MachineLost(f"machine 0 ended the run: {doc['error']}")
    setups, sw = plan.at(str(doc["switch"]), str(doc["control"]))
    where = [int(m) for m in doc["machine_of"]]
    key = sealed.derive(cluster.key, str(doc["nonce"]))
    ctx = zmq.Context()
    ctrl = connect_control(ctx, str(doc["control"]), key, identity=f"m{cluster.rank}".encode())
    workdir = tempfile.mkdtemp(prefix="emu-machine-")
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        ctrl.send(encode(Alive(cluster.rank)))
        if len(where) != len(setups) or digest(config, setups, sw) != doc["digest"]:
            error = (f"machine {cluster.rank} planned run {run} otherwise than machine 0 (other options or "
                     "files): run the same command with the same files on every machine")
            ctrl.send(encode(Failed(f"machine {cluster.rank}", error, user=True)))
            ctrl.close(linger=1000)
            raise ConfigError(error)
        mine = [replace(s, key=key) for s, m in zip(setups, where, strict=True) if m == cluster.rank]
        record = lifetime.current()
        if record is not None:
            record.add_folder(workdir)
        start_processes([(host_main, s, f"emu-host{s.index}") for s in mine], workdir, procs)
        outcome = _watch(cluster, ctrl, procs, run, config.timeout_s)
    finally:
        with lifetime.signals_held():
            stop_processes(procs)
            ctx.destroy(linger=0)
            shutil.rmtree(workdir, ignore_errors=True)
    if not outcome["ok"]:
        raise MachineLost(f"machine 0 ended the run: {outcome['error']}")
    report = ReplayReport.from_dict(outcome["report"])
    return report, report.emulator.run_s, []


def _watch(cluster: Cluster, ctrl: zmq.Socket, procs: list, run: int, timeout_s: float) -> dict[str, Any]:
    """Until machine 0 gives the run's outcome (returned): say this machine is alive, and stop on
    machine 0's abort, its silence, its leaving, or a process of this machine that failed. A
    machine that holds no host process (fewer of them than machines) still says it is alive."""
    heard = time.monotonic()
    sent = 0.0
    first = True
    deadline = time.monotonic() + timeout_s + FIRST_CONTACT_S  # the run's own bound, and its start
    outcome_key = f"run/{run}/outcome"
    while True:
        now = time.monotonic()
        if now - sent >= HEARTBEAT_S:
            sent = now
            ctrl.send(encode(Alive(cluster.rank)))
            if cluster.has(outcome_key):  # a failure at once; a success once this share has ended too
                outcome = cluster.get(outcome_key, what=f"machine 0's outcome of run {run}")
                if not outcome["ok"] or all(p.exitcode is not None for p in procs):
                    return dict(outcome)
            gone = cluster.left(0)
            if gone is not None:
                raise MachineLost(f"machine 0 ({cluster.machines[0].hostname}) left the run: "
                                  f"{gone or 'its output says why'}")
        if now > deadline:
            raise MachineLost(f"machine {cluster.rank}: machine 0 gave no outcome of run {run} within the run's "
                              f"--timeout ({timeout_s:.0f} s)")
        if ctrl.poll(100):
            try:
                msg = decode(ctrl.recv())
            except Rejected:
                msg = None
            if isinstance(msg, Alive):
                heard, first = time.monotonic(), False
            elif isinstance(msg, Abort):
                raise MachineLost(f"machine 0 ended the run: {msg.reason}")
            elif isinstance(msg, Stop):
                heard = time.monotonic()
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            error = (f"the replay process {dead[0].name} on machine {cluster.rank} ({cluster.me.hostname}) died "
                     f"(exit code {dead[0].exitcode})")
            ctrl.send(encode(Failed(f"machine {cluster.rank}", error, user=True)))
            ctrl.close(linger=1000)
            raise MachineLost(error)
        silent = time.monotonic() - heard
        # before machine 0's first word, and after this machine's share ended (machine 0 builds the
        # report then), silence may last longer
        if silent > (FIRST_CONTACT_S if first or all(p.exitcode is not None for p in procs) else MACHINE_TIMEOUT_S):
            raise MachineLost(f"machine 0 ({cluster.machines[0].hostname}) stopped answering for {silent:.0f} s: "
                              "it was killed, lost its network, or is overloaded")


__all__ = ["Watch", "check_spreadable", "digest", "finish", "machine_of", "publish", "serve_share"]
