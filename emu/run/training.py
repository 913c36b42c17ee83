"""The script's loss against emulated time, and the time to reach a loss (docs/compression.md,
"emu run: time to a loss").

A script reports its loss with ``emu.run.report_loss``; the coordinator stamps each report with
the optimizer steps the rank had completed (``Coordinator.losses``). The emulated time after N
steps is the sum of the replay's first N iteration times, one per optimizer step: a step emu run
replayed (the recorded ones after ``--warmup``) is charged its replayed time, a step it did not
(the warm-up's, where DDP builds its buckets; steps past ``--iters``) the replayed iterations'
mean, and the point says how many were (``LossPoint.charged_mean``).

Under ``--compress`` emu run runs the script twice by default, compressed and then uncompressed,
the same command each time (a script that seeds itself starts from the same parameters and
data), and ``TrainingReport`` holds both curves: the time to a loss is where each first reaches
it. The target is ``--target-loss``, else the uncompressed run's last loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LossPoint:
    steps: int  # optimizer steps completed when the loss was reported
    emulated_us: float  # emulated time after those steps
    loss: float  # the mean over the real ranks that reported (NaN where the script's was not finite)
    charged_mean: int  # steps before it that were not replayed, charged the replayed iterations' mean


@dataclass(frozen=True)
class Curve:
    """One run's loss curve."""

    compressor: str  # the gradients' compressor (``none``: uncompressed)
    points: tuple[LossPoint, ...]
    iteration_us_median: float | None  # the replay's

    def reached(self, target: float) -> LossPoint | None:
        """The first point at or below ``target``."""
        return next((p for p in self.points if p.loss <= target), None)


@dataclass(frozen=True)
class TrainingReport:
    """The runs' loss curves (the run asked for first) and when each first reached the target."""

    curves: tuple[Curve, ...]
    target_loss: float | None
    target_from: str  # what the target is: "--target-loss", or the baseline's last loss

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"target_loss": self.target_loss, "target_from": self.target_from, "curves": []}
        for c in self.curves:
            hit = c.reached(self.target_loss) if self.target_loss is not None else None
            points = [{**asdict(p), "loss": p.loss if math.isfinite(p.loss) else None} for p in c.points]  # JSON
            doc["curves"].append({**asdict(c), "points": points,
                                  "time_to_target_us": None if hit is None else hit.emulated_us,
                                  "steps_to_target": None if hit is None else hit.steps})
        return doc


def curve(compressor: str, losses: tuple[tuple[int, float], ...], times_us: list[float], median_us: float | None,
          warmup: int) -> Curve:
    """The loss curve of a run whose script reported ``losses`` (steps completed, loss), on the
    emulated times of its replayed iterations ``times_us`` (module docstring)."""
    mean = sum(times_us) / len(times_us) if times_us else 0.0
    points = []
    for steps, loss in losses:
        replayed = [times_us[i - warmup] for i in range(steps) if 0 <= i - warmup < len(times_us)]
        points.append(LossPoint(steps=steps, emulated_us=sum(replayed) + mean * (steps - len(replayed)),
                                loss=loss, charged_mean=steps - len(replayed)))
    return Curve(compressor=compressor, points=tuple(points), iteration_us_median=median_us)


def training_report(curves: tuple[Curve, ...], target_loss: float | None) -> TrainingReport | None:
    """The runs' curves and the target (None where no run reported a loss)."""
    if not any(c.points for c in curves):
        return None
    if target_loss is not None:
        return TrainingReport(curves, target_loss, "--target-loss")
    base = curves[-1]
    if len(curves) > 1 and base.points:
        return TrainingReport(curves, base.points[-1].loss, "the uncompressed run's last loss")
    return TrainingReport(curves, None, "none (give --target-loss)")
