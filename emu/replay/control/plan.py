"""What a run of processes is made of, decided before any starts: the ``RunPlan`` that
``emu.replay.control.processes.execute`` receives, for one job (``emu.replay.orchestrator``) or
several sharing the fabric (``emu.replay.jobs``).

A plan holds every host's and the switch's setup without the addresses, which only the run knows
(a private folder's sockets, or machine 0's TCP endpoints), and how to build the report from what
the processes measured (``Reporter``), which the run also needs for a partial report after a
failure and, over several machines, to hand every machine the same report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from emu.replay.config.options import ReplayConfig
from emu.replay.control.messages import HostResult, SwitchResult
from emu.replay.host.runtime import HostSetup
from emu.replay.report.model import ReplayReport
from emu.replay.switch.daemon import SwitchSetup


@dataclass(frozen=True)
class Measured:
    """What a run's processes measured, as the report is built from it."""

    hosts: list[HostResult]
    switch: SwitchResult
    wall_s: float
    cpu_s: float
    processes: int


class Reporter(Protocol):
    """Builds the report of a run (whole, or partial after a failure) from what it measured."""

    def build(self, measured: Measured) -> ReplayReport: ...


@dataclass(frozen=True)
class RunPlan:
    """Every process of one run, laid out (addresses left empty until ``at``)."""

    config: ReplayConfig  # the fabric's (a single job's, or the jobs' together)
    hosts: tuple[HostSetup, ...]
    switch: SwitchSetup
    total: int  # worker iterations, for progress
    reporter: Reporter
    external: bool = False  # start the fabric's switch outside emu for the run (Fabric.external_switch)

    def at(self, switch_addr: str, control_addr: str) -> tuple[list[HostSetup], SwitchSetup]:
        """The setups with the run's endpoints."""
        hosts = [replace(h, switch_addr=switch_addr, control_addr=control_addr,
                         parts=tuple(replace(p, switch_addr=switch_addr, control_addr=control_addr) for p in h.parts))
                 for h in self.hosts]
        return hosts, replace(self.switch, address=switch_addr, control_addr=control_addr)
