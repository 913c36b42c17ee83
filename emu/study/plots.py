"""The PNG plots of a sweep (matplotlib, headless): per trace, iteration time, speedup and scaling
efficiency against workers, and the compute / exposed communication breakdown of every point.

Replayed points are solid lines with filled markers; analytic estimates (points emu does not
replay) are dashed with hollow markers and say "estimate" in the legend, so the two are never
mixed silently. Failed points are left out (results.csv lists them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emu.emulator.links.spec import format_bandwidth
from emu.errors import RunFailed
from emu.files import make_folder, write_together
from emu.study.sweep import Row, Status

OUR_PLOT = re.compile(r".+-(iteration|speedup|efficiency|breakdown)\.png")  # the names write_plots gives


def write_plots(out: Path, rows: list[Row]) -> list[Path]:
    """Write every plot under ``out/plots``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI machines and servers
    import matplotlib.pyplot as plt

    folder = make_folder(out / "plots", "the plots")
    written: list[tuple[Path, bytes]] = []
    for trace in dict.fromkeys(r.trace for r in rows):
        mine = [r for r in rows if r.trace == trace and r.comparable]
        if not mine:
            continue
        series = _series(mine)
        estimate = lambda r: r.status == Status.ESTIMATE  # noqa: E731
        ref = next((r.speedup_over for r in mine if r.speedup_over), None)
        plots = [("iteration", "iteration time (ms)", lambda r: r.iteration_us_median / 1000, estimate,
                  "analytic estimate", series),
                 ("efficiency", "scaling efficiency (iteration at fewest workers / this)",
                  lambda r: r.scaling_efficiency, estimate, "analytic estimate", series)]
        others = {k: v for k, v in series.items() if v[0].fabric != ref}  # the reference is 1.0 throughout
        if any(r.speedup is not None for v in others.values() for r in v):
            plots.insert(1, ("speedup", f"speedup over {ref}", lambda r: r.speedup,
                             lambda r: bool(r.speedup_estimated), f"against an estimate of {ref}", others))
        for name, ylabel, value, estimated, est_label, lines in plots:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            _lines(ax, lines, value, estimated, est_label)
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)  # differences read at their true size
            ax.set_xlabel("workers")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{trace}: {ylabel}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            written.append((folder / f"{trace}-{name}.png", _png(fig, plt)))
        written.append((folder / f"{trace}-breakdown.png", _breakdown(plt, trace, mine)))
    # the set as one (a full disk keeps the earlier run's plots whole), then the earlier run's plots
    # of points this run does not draw go: the folder shows this run's rows only
    write_together(written, "the plots")
    paths = {path for path, _ in written}
    for old in folder.iterdir():
        if OUR_PLOT.fullmatch(old.name) and old not in paths:
            try:
                old.unlink(missing_ok=True)
            except OSError as exc:
                raise RunFailed(f"{old}: cannot remove an earlier run's plot ({exc.strerror or exc}); remove it "
                                "by hand") from None
    return [path for path, _ in written]


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows grouped into lines over workers, each named by the axes that vary in this trace."""
    axes = {"design": lambda r: r.design, "fabric": lambda r: r.fabric,
            "bw": lambda r: format_bandwidth(r.bandwidth_bps), "lat": lambda r: f"{r.latency_us:g}us",
            "loss": lambda r: f"loss {r.loss:g}", "strag": lambda r: r.stragglers}
    varying = [fn for fn in axes.values() if len({fn(r) for r in rows}) > 1] or [axes["fabric"]]
    groups: dict[tuple, list[Row]] = {}
    for r in rows:  # a line is one configuration but for workers, whatever the labels say
        groups.setdefault((r.peers, r.fabric, r.design), []).append(r)
    lines: dict[str, list[Row]] = {}
    for members in groups.values():
        name = " ".join(str(fn(members[0])) for fn in varying if fn(members[0]))
        while name in lines:
            name += "'"
        lines[name] = sorted(members, key=lambda r: r.workers)
    return lines


def _lines(ax: Any, series: dict[str, list[Row]], value: Callable[[Row], float | None],
           estimated: Callable[[Row], bool], est_label: str) -> None:
    for i, (name, rows) in enumerate(series.items()):
        color = f"C{i % 10}"
        real = [(r.workers, value(r)) for r in rows if not estimated(r) and value(r) is not None]
        est = [(r.workers, value(r)) for r in rows if estimated(r) and value(r) is not None]
        if real:
            ax.plot([w for w, _ in real], [v for _, v in real], "-o", color=color, label=f"{name} (replayed)")
        if est:
            # joined to the last replayed point before them, so the line reads on, dashed
            before = [p for p in real if p[0] < est[0][0]][-1:]
            joined = before + est
            ax.plot([w for w, _ in joined], [v for _, v in joined], "--", color=color)
            ax.plot([w for w, _ in est], [v for _, v in est], "o", color=color, markerfacecolor="none",
                    label=f"{name} ({est_label})")


def _breakdown(plt: Any, trace: str, rows: list[Row]) -> bytes:
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4.5))
    labels, compute, exposed, hatches = [], [], [], []
    for r in rows:
        labels.append(f"{r.design or r.fabric} x{r.workers} {format_bandwidth(r.bandwidth_bps)}"
                      + (" (est.)" if r.status == Status.ESTIMATE else ""))
        compute.append((r.compute_us or 0) / 1000)
        exposed.append((r.exposed_comm_us or 0) / 1000)
        hatches.append("//" if r.status == Status.ESTIMATE else "")
    x = range(len(rows))
    bars_c = ax.bar(x, compute, color="C0", label="compute")
    bars_e = ax.bar(x, exposed, bottom=compute, color="C3", label="exposed communication")
    for bars in (bars_c, bars_e):
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ms per iteration (critical worker)")
    ax.set_title(f"{trace}: compute and exposed communication" + (" (hatched: analytic estimate)"
                                                                  if any(hatches) else ""))
    ax.legend(fontsize=7)
    return _png(fig, plt)


def _png(fig: Any, plt: Any) -> bytes:
    import io

    fig.tight_layout()
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        return buffer.getvalue()
    finally:
        plt.close(fig)
