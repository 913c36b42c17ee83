"""What the P4 switch's control plane writes, decided in plain code (unit-tested everywhere).

For a job: one entry in the ``job`` table (job id and worker count -> the worker count
the program compares against and the job's multicast group), and one multicast group
whose replicas send a copy to each worker's port with the worker id as replica id
(the program's egress writes it into the result's ``worker`` field), and the group of the
bridge's barrier (``FLUSH_GROUP``: the same ports). The P4Runtime
encoding of these records is ``emu.p4.control``'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emu.errors import ConfigError

MAX_WORKERS = 32  # one 32-bit bitmap per slot copy, as SwitchML
# the multicast group of the bridge's barrier (wire.MsgType.FLUSH): every worker's port, replica id the
# worker; job groups are job + 1, below it. BMv2's replication engine holds group ids 0..4095
# (simple_pre.h: DEFAULT_MGID_TABLE_SIZE)
FLUSH_GROUP = 4095


@dataclass(frozen=True)
class JobEntry:
    job: int
    num_workers: int
    mcast_grp: int


@dataclass(frozen=True)
class Replica:
    port: int
    rid: int  # the worker id the copy goes to


@dataclass(frozen=True)
class MulticastGroup:
    group: int
    replicas: tuple[Replica, ...]


@dataclass(frozen=True)
class SwitchPlan:
    jobs: tuple[JobEntry, ...]
    groups: tuple[MulticastGroup, ...]


def plan(job: int, ports: Sequence[int]) -> SwitchPlan:
    """The entries for one job whose worker w sits behind ``ports[w]``."""
    workers = len(ports)
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"the P4 switch aggregates 1 to {MAX_WORKERS} workers per job, not {workers}; "
                          "more need a hierarchy of switches")
    if len(set(ports)) != workers or min(ports) < 0:
        raise ConfigError(f"each worker needs its own switch port, got {list(ports)}")
    if not 0 <= job < FLUSH_GROUP - 1:
        raise ConfigError(f"job ids are 0 to {FLUSH_GROUP - 2} (BMv2's multicast groups), got {job}")
    group = job + 1  # 0 means "no multicast" in v1model
    replicas = tuple(Replica(port=p, rid=w) for w, p in enumerate(ports))
    return SwitchPlan(jobs=(JobEntry(job=job, num_workers=workers, mcast_grp=group),),
                      groups=(MulticastGroup(group=group, replicas=replicas),
                              MulticastGroup(group=FLUSH_GROUP, replicas=replicas)))
