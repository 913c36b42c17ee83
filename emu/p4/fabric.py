"""``--fabric bmv2``: the P4 program of emu/p4 on BMv2, registered into emu's fabrics.

The hosts' contributions leave the switch process as Ethernet frames on one veth per
worker towards simple_switch_grpc, which aggregates; the bridge (``emu.p4.bridge``)
stamps its results with emulated time. BMv2 keeps no emulated time of its own, so it
cannot take part in the synchronized clock: a bmv2 replay runs on the wall clock.
"""

from __future__ import annotations

import contextlib

from emu.emulator import mechanisms as mech
from emu.emulator.fabric import Fabric, SwitchPorts, register
from emu.errors import ConfigError


@register
class Bmv2Fabric(Fabric):
    name = "bmv2"
    description = "in-network aggregation by emu's P4 program on BMv2 (wall clock)"
    mechanisms = (mech.STREAM, mech.RING, *mech.COMMON)  # the P4 program aggregates float all_reduces
    synchronizable = False

    def check(self, workers: int, elements: int) -> None:
        if elements != 64:
            raise ConfigError("--fabric bmv2 runs 64-element packets (256 need recirculation): --elements 64")

    def check_available(self) -> None:
        from emu.p4.bmv2 import check_available

        check_available()

    def external_switch(self, workers: int, slots: int) -> contextlib.AbstractContextManager[object]:
        from emu.p4.bmv2 import Bmv2Switch

        return Bmv2Switch(workers, slots)

    def switch_ports(self, workers: int, elements: int) -> SwitchPorts | None:
        from emu.p4.bmv2 import host_interface
        from emu.p4.bridge import Bmv2Ports

        return Bmv2Ports([host_interface(w) for w in range(workers)], elements)
