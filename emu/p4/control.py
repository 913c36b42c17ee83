"""The P4Runtime side: load the pipeline into BMv2 and write a ``SwitchPlan`` with finsy.

finsy (PyPI) is imported only here and only when the BMv2 fabric starts; the decision
of what to write is ``emu.p4.entries``. The P4Info and the BMv2 JSON come from
``p4c-bm2-ss --p4runtime-files`` (``emu.p4.bmv2.compile_program``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from emu.errors import ConfigError
from emu.p4.entries import SwitchPlan

CONNECT_TIMEOUT_S = 30.0


def push(plan: SwitchPlan, address: str, p4info: Path, bmv2_json: Path) -> None:
    """Set the forwarding pipeline and write the job's entries; returns when they are in."""
    try:
        import finsy as fy
    except ImportError:
        raise ConfigError("the BMv2 fabric needs finsy for P4Runtime: pip install 'emu[p4]'") from None

    async def ready(sw: fy.Switch) -> None:
        entities = [fy.P4TableEntry("job", match=fy.Match({"hdr.emu.job": e.job,
                                                            "hdr.emu.num_workers": e.num_workers}),
                                    action=fy.Action("set_job", workers=e.num_workers, mcast_grp=e.mcast_grp))
                    for e in plan.jobs]
        entities += [fy.P4MulticastGroupEntry(g.group, replicas=[(r.port, r.rid) for r in g.replicas])
                     for g in plan.groups]
        await sw.insert(entities)
        done.set()

    done = asyncio.Event()

    async def main() -> None:
        options = fy.SwitchOptions(p4info=p4info, p4blob=bmv2_json, ready_handler=ready)
        sw = fy.Switch("emu", address, options)
        async with sw:
            await asyncio.wait_for(done.wait(), CONNECT_TIMEOUT_S)

    try:
        asyncio.run(main())
    except TimeoutError:
        raise ConfigError(f"BMv2 at {address} did not accept the pipeline within {CONNECT_TIMEOUT_S:.0f} s") from None
