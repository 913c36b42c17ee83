"""``--fabric bmv2``: the P4 program of emu/p4 on BMv2, registered into emu's fabrics.

The switch process (or the replay's one process) drives BMv2 through the bridge
(``emu.p4.bridge.Bmv2Pool``) in the software switch's place: the same windows of the
synchronized clock, the same stamps, BMv2's sums. A collective the software switch would
aggregate and the program cannot (a sparse stream, a sub-group's pool, reduce_scatter and
all_gather rounds) is refused by name before anything starts, as is a topology: BMv2 here is
one switch with one port per worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import replace

from emu.emulator import fabric as fabrics
from emu.emulator import mechanisms as mech
from emu.emulator.fabric import Fabric, Pool, register
from emu.emulator.mechanisms import Setting
from emu.errors import ConfigError
from emu.traces.model import Coll


@register
class Bmv2Fabric(Fabric):
    name = "bmv2"
    description = "in-network aggregation by emu's P4 program on BMv2"
    mechanisms = (mech.STREAM, mech.RING, *mech.COMMON)  # the P4 program aggregates float all_reduces
    sums_in_switch_process = True  # through the bridge to BMv2
    topologies = False

    def check(self, workers: int, elements: int) -> None:
        if elements != 64:
            raise ConfigError("--fabric bmv2 runs 64-element packets (256 need recirculation): --elements 64")
        from emu.p4.entries import MAX_WORKERS

        if workers > MAX_WORKERS:
            raise ConfigError(f"--fabric bmv2 aggregates up to {MAX_WORKERS} workers (the program's bitmap is 32 "
                              f"bits), not {workers}: give --workers {MAX_WORKERS} or fewer, or use --fabric ina")

    def check_available(self) -> None:
        from emu.p4.bmv2 import check_available

        check_available()

    def check_collectives(self, ops: Iterable[Coll], s: Setting) -> None:
        """What ``ina`` would aggregate on its switch and the program cannot: refused by name."""
        ina = replace(s, fabric=fabrics.get("ina"))
        for op in ops:
            if not mech.choose(op, ina).stream:
                continue  # point to point on ina too (an integer all_reduce, a group inside a node)
            sparse = op.sparsity is not None and mech.STREAM.streams_sparse(op, ina)
            if mech.choose(op, s).stream and not sparse:
                continue
            what = ("a sparse all_reduce" if sparse else f"an {op.kind.value}"
                    + (f" of a sub-group of {len(op.group)}" if op.group is not None else ""))
            hint = ", or dense (--sparsity none)" if sparse else ""
            raise ConfigError(f"--fabric {self.name}: collective {op.id}, {what}, aggregates on the switch under "
                              "--fabric ina, and emu's P4 program runs a whole job's dense float all_reduces only "
                              f"(docs/p4.md, 'What it does not do'): replay it on --fabric ina{hint}")

    def external_switch(self, workers: int, slots: int) -> contextlib.AbstractContextManager[object]:
        from emu.p4.bmv2 import Bmv2Switch

        return Bmv2Switch(workers, slots)

    def pool(self, slots: int, workers: int, elements: int, job: int) -> Pool:
        from emu.p4.bmv2 import host_interface, where_log
        from emu.p4.bridge import Bmv2Pool, RawPorts

        if job != 0:
            raise ConfigError("--fabric bmv2 aggregates one job's pool (the program's job table holds one): "
                              "replay several jobs or a sharded trace's sub-groups on --fabric ina")
        return Bmv2Pool(slots, workers, elements, job, RawPorts([host_interface(w) for w in range(workers)]),
                        where_log)
