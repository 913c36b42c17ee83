"""emu run: real ranks of an unmodified script inside a large emulated job (docs/run.md).

This package may import torch (the real ranks need it); replay stays torch-free. A script
reports its loss with ``report_loss``, which does nothing outside emu run.
"""

from __future__ import annotations

import math


def report_loss(loss: float) -> None:
    """Tell emu run the training loss now (a float, or a one-element tensor), so that its report
    gives the loss curve against emulated time and the time to reach a loss (``--target-loss``).
    A report is placed at the optimizer steps the rank has completed: report the loss of the
    parameters after N steps before step N + 1 runs, as examples/ddp_learn.py does. Outside emu
    run (plain python, torchrun) it does nothing, so a script may call it unconditionally."""
    import sys

    backend = sys.modules.get("emu.run.backend")
    ch = backend.channel() if backend is not None else None
    if ch is None:
        return
    value = float(loss.item() if hasattr(loss, "item") else loss)
    ch.loss(value if math.isfinite(value) else float("nan"))
