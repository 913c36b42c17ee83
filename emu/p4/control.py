"""The P4Runtime side: load the pipeline into BMv2 and write a ``SwitchPlan`` with finsy.

finsy (PyPI) is imported only here and only when the BMv2 fabric starts; the decision
of what to write is ``emu.p4.entries``. The P4Info and the BMv2 JSON come from
``p4c-bm2-ss --p4runtime-files`` (``emu.p4.bmv2.compile_program``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from emu.errors import ConfigError
from emu.p4.bmv2 import DEVICE_ID, Compiled
from emu.p4.entries import SwitchPlan

CONNECT_TIMEOUT_S = 30.0


def push(plan: SwitchPlan, address: str, compiled: Compiled, log: Path) -> None:
    """Set the forwarding pipeline and write the job's entries; returns when they are in.

    A refusal from the switch is one ConfigError naming its cause and the switch's log.
    """
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
        sw = fy.Switch("emu", address, switch_options(fy, compiled, ready))
        async with sw:
            await asyncio.wait_for(done.wait(), CONNECT_TIMEOUT_S)

    quiet = logging.getLogger("finsy")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its warnings (BMv2 has no gNMI) would reach the user's terminal
    try:
        asyncio.run(main())
    except TimeoutError:
        raise ConfigError(f"BMv2 at {address} did not accept the pipeline within {CONNECT_TIMEOUT_S:.0f} s; "
                          f"its log: {log}") from None
    except (fy.P4ClientError, asyncio.CancelledError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"BMv2 at {address} refused the pipeline or its entries: {first}; "
                          f"its log: {log}") from None
    finally:
        quiet.setLevel(level)


def switch_options(fy: object, compiled: Compiled, ready: object) -> object:
    """finsy's options for BMv2: the compiled program and the device id it was started with."""
    return fy.SwitchOptions(p4info=compiled.p4info, p4blob=compiled.bmv2_json,  # type: ignore[attr-defined]
                            device_id=DEVICE_ID, ready_handler=ready)
