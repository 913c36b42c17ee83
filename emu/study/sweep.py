"""``emu sweep``: one replay per point of a grid, resumable, with the analytic estimate beside each.

The output folder holds one report per point (``points/SLUG.json``), a log for each point that
failed (``points/SLUG.log``), and the study's tables (``results.csv``, ``results.json``), rewritten
whole after every point so that an interrupted sweep leaves tables of what it finished. Run again
with the same ``--out``, a sweep skips the points whose complete report is there (read by the
replay's own reader; any other is replayed again, and ``on_note`` hears why). One sweep at a time
writes a folder (``.emu-sweep.lock``).

A point emu refuses to replay (a real ring or parameter server past its worker limit) gets the
analytic estimate (``emu.study.predict``) instead, labelled ``estimate`` in every table and plot.
A point whose replay fails (a process died, the time ran out) is tried once more, then recorded
as ``failed`` with its log; the sweep goes on.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import emu
from emu.errors import ConfigError, EmuError, RunFailed
from emu.files import hold_folder, make_folder, write_atomic
from emu.replay import ReplayReport
from emu.study.grid import Point, TraceCache
from emu.traces.model import Trace

if TYPE_CHECKING:
    from emu.study.predict import Prediction

RETRIES = 1  # a crashed point is tried once more (docs/reliability.md)
RESULTS_EVERY_S = 2.0  # the tables are rewritten at most this often while a sweep runs, and at its end
RESULTS_VERSION = 1


class Status(str, enum.Enum):
    """Where a row's numbers come from."""

    REPLAYED = "replayed"  # an emulation through the fabric
    ESTIMATE = "estimate"  # the closed form only: emu does not replay this point (docs/physics.md)
    FAILED = "failed"  # the replay failed twice; see the log


@dataclass(frozen=True)
class Row:
    """One point of a study, as results.csv and results.json hold it. Times in microseconds."""

    trace: str
    design: str | None
    fabric: str
    workers: int
    bandwidth_bps: float | None
    latency_us: float
    loss: float
    stragglers: str
    status: Status
    iteration_us_median: float | None
    iteration_us_p99: float | None
    compute_us: float | None  # medians over iterations, of the critical worker
    comm_us: float | None
    exposed_comm_us: float | None
    predicted_us: float | None  # the analytic estimate of the median iteration
    predict_error: float | None  # the estimate's error: (predicted - replayed) / replayed (docs/physics.md)
    speedup: float | None = None  # the reference fabric's iteration over this one's, same other axes
    speedup_over: str | None = None
    speedup_estimated: bool | None = None  # an analytic estimate is on one side of the speedup
    scaling_efficiency: float | None = None  # iteration at the grid's fewest workers over this one's
    verification_ok: bool | None = None
    trustworthy: bool | None = None
    complete: bool | None = None
    wall_s: float | None = None
    sent_fraction: float | None = None  # of a sparse replay's blocks' bytes, against dense (docs/sparse.md)
    compression_ratio: float | None = None  # a compressed replay's bytes per worker, dense over compressed
    compression_error: float | None = None  # one step's relative error of its aggregate (docs/compression.md)
    attempts: int = 0
    report: str | None = None
    log: str | None = None
    reason: str | None = None
    slug: str = ""
    peers: str = ""  # equal for points that differ only in fabric, design identity and workers

    @property
    def comparable(self) -> bool:
        """Its time can be set beside others': an estimate, or a replay that verified and is
        trustworthy (a failed point's, or a suspect replay's, cannot)."""
        if self.status == Status.ESTIMATE:
            return self.iteration_us_median is not None
        return self.status == Status.REPLAYED and self.verification_ok is True and self.trustworthy is not False


@dataclass(frozen=True)
class SweepResult:
    rows: tuple[Row, ...]
    out: Path
    skipped: int  # points resumed from an earlier run
    plots: tuple[Path, ...] = ()  # the PNG files written (``run_sweep(plots=True)``)
    plots_error: str | None = None  # why they could not be written (the tables were)


def refusal(point: Point) -> str | None:
    """Why emu does not replay this point (and estimates it instead), or None."""
    config = point.config
    if config.network.beyond_p2p_limit(config.workers, config.shards):
        need = config.network.p2p_peak_bytes(config.workers, config.shards)
        return (f"a real {config.fabric} of {config.workers} workers needs about {need / 1e9:.1f} GB, more than "
                "half of this machine's free memory: analytic estimate")
    return None


def run_sweep(points: list[Point], out: Path, traces: TraceCache, *, with_prediction: bool = True,
              on_point: Callable[[int, Point, Row], None] | None = None,
              on_start: Callable[[int, Point], None] | None = None,
              on_progress: Callable[[float], None] | None = None,
              on_status: Callable[[str], None] | None = None,
              on_note: Callable[[str], None] | None = None, plots: bool = False) -> SweepResult:
    """Replay every point into ``out`` (resuming what is there) and write the study's tables, and
    with ``plots`` its plots, all while holding the folder; ``on_note`` hears why an earlier report
    found there could not stand."""
    from emu.replay import plan_programs, replay

    # a trace that cannot scale, or be compressed as asked, fails before any replay (the grid's sparsity
    # and compression are one value for every point)
    for point in {(p.trace, p.config.workers): p for p in points if refusal(p) is None}.values():
        plan_programs(traces.get(point.trace), point.config.workers, point.trace, point.config.sparsity,
                      point.config.compress, switch_sums=point.config.switch_sums, mesh=point.config.mesh)
    folder = out / "points"
    make_folder(folder, "the sweep's points", ConfigError)
    lock = _one_writer(out)
    rows: list[Row] = []
    skipped = 0
    written, tables_done, plotted, plots_error = 0.0, False, [], None
    try:
        for i, point in enumerate(points):
            if on_start is not None:
                on_start(i, point)
            why = refusal(point)
            prediction, unpredictable = (_predict(traces.get(point.trace), point) if with_prediction or why
                                         else (None, None))
            predicted = None if prediction is None else prediction.iteration_us_median
            done, bad = _finished(out, point)
            if bad is not None and on_note is not None:
                on_note(f"{bad}: replaying the point again")
            if done is not None:
                skipped += 1
                row = _replayed(point, done, predicted, attempts=0)
            elif why is not None:
                row = _estimate(point, prediction, why, unpredictable)
            else:
                row = _replay_point(replay, traces.get(point.trace), point, out, predicted, on_status)
            rows.append(row)
            if time.monotonic() - written > RESULTS_EVERY_S:  # whole tables often, not after every point
                write_results(out, with_derived(rows))
                written = time.monotonic()
            if on_progress is not None:
                on_progress((i + 1) / len(points))
            if on_point is not None:
                on_point(i, point, row)
        write_results(out, with_derived(rows))
        tables_done = True
        if plots:
            from emu.study.plots import write_plots

            try:
                plotted = write_plots(out, with_derived(rows))
            except EmuError as exc:  # the caller still shows the tables, then says so
                plots_error = str(exc)
    finally:  # an interrupted sweep leaves the tables of what it finished
        try:
            if rows and not tables_done:
                write_results(out, with_derived(rows))
        finally:
            lock.close()  # releases the folder
    return SweepResult(rows=tuple(with_derived(rows)), out=out, skipped=skipped, plots=tuple(plotted),
                       plots_error=plots_error)


LOCK_NAME = ".emu-sweep.lock"


def _one_writer(out: Path) -> BinaryIO:
    """The folder's lock (``out/.emu-sweep.lock``, an exclusive flock held while the sweep runs and
    released by the kernel however it ends): a second sweep into the same folder would rewrite the
    tables with its points only, so it is refused (ConfigError) instead."""
    return hold_folder(out, LOCK_NAME, f"--out {out}: another emu sweep is writing this folder now; wait for it to "
                       "end, or give another --out (two sweeps into one folder would each keep only their own points "
                       "in results.csv)")


def _replay_point(replay: Callable[..., ReplayReport], trace: Trace, point: Point, out: Path,
                  predicted: float | None, on_status: Callable[[str], None] | None) -> Row:
    log: list[str] = []
    report_name, log_name = f"points/{point.slug}.json", f"points/{point.slug}.log"

    def status(text: str) -> None:
        log.append(f"{time.strftime('%H:%M:%S')} {text}")
        if on_status is not None:
            on_status(text)

    reason = "failed"
    for attempt in range(1, RETRIES + 2):
        status(f"attempt {attempt}: {point.slug}")
        try:
            report = replay(trace, point.config, trace_path=point.trace, on_status=status)
        except ConfigError:
            raise  # bad input is the user's to fix, not a crash to retry
        except RunFailed as exc:
            reason = str(exc)
            status(f"attempt {attempt} failed: {exc}")
            partial: ReplayReport | None = getattr(exc, "partial_report", None)
            if partial is not None:
                log.append(json.dumps({"partial_report": partial.to_dict()}, default=str)[:200_000])
            continue
        except Exception as exc:  # a bug in emu: recorded with its traceback, and the sweep goes on
            reason = f"{type(exc).__name__}: {exc} (an internal error: please report it with this log)"
            status(f"attempt {attempt} failed: {reason}")
            log.append(traceback.format_exc())
            continue
        report.save(out / report_name)
        (out / log_name).unlink(missing_ok=True)  # an earlier run's failure is no longer the story
        return _replayed(point, report.to_dict(), predicted, attempts=attempt)
    write_atomic(out / log_name, "\n".join(log) + "\n", "the point's log")
    return _base(point, Status.FAILED, predicted, reason=reason, log=log_name, attempts=RETRIES + 1)


def _finished(out: Path, point: Point) -> tuple[dict[str, Any] | None, str | None]:
    """An earlier run's report of this very point that can stand (read by ``emu check``'s reader,
    whole by the replay's own, complete, verified, trustworthy, of the same trace content), or None
    and, where a file is there, why not (then the point runs again and says so)."""
    from emu.study.reports import CURRENT_VERSION, read_report

    path = out / "points" / f"{point.slug}.json"
    if not path.exists():
        return None, None
    try:
        loaded = read_report(path)
        if loaded is None:
            return None, f"{path}: no report_version: not a replay report"
        if loaded.version != CURRENT_VERSION:  # another meaning or shape (an iteration was a span before 6)
            return None, f"{path}: report_version {loaded.version}, where this emu writes {CURRENT_VERSION}"
        doc = ReplayReport.from_dict(loaded.doc).to_dict()  # every field of its kind, as the replay wrote it
    except (ConfigError, TypeError, ValueError, KeyError) as exc:
        why = (str(exc).splitlines() or [""])[0][:300]
        return None, why if why.startswith(str(path)) else f"{path}: {why}"
    problem = ("incomplete" if not doc.get("complete") or doc.get("summary") is None else
               "of another trace's content" if doc["trace"].get("sha256") != point.trace_sha256 else
               "not verified or not trustworthy" if not doc["verification"].get("ok")
               or not doc["emulator"].get("trustworthy") else None)
    return (None, f"{path}: {problem}") if problem else (doc, None)


def _predict(trace: Trace, point: Point) -> tuple[Prediction | None, str | None]:
    """The estimate, or None and why the closed form cannot give one (the replay still runs)."""
    from emu.study.predict import predict

    try:
        return predict(trace, point.config), None
    except ConfigError as exc:
        return None, str(exc)


def _base(point: Point, status: Status, predicted: float | None, **extra: Any) -> Row:
    c = point.config
    link = c.link
    doc: dict[str, Any] = dict(
        trace=point.label, design=point.design, fabric=c.fabric, workers=c.workers,
        bandwidth_bps=None if link.bandwidth_bps == float("inf") else link.bandwidth_bps,
        latency_us=link.latency_us, loss=link.loss, stragglers=" ".join(s.text for s in c.stragglers),
        status=status, iteration_us_median=None, iteration_us_p99=None, compute_us=None, comm_us=None,
        exposed_comm_us=None, predicted_us=predicted, predict_error=None, slug=point.slug, peers=point.peers)
    doc.update(extra)
    return Row(**doc)


def _estimate(point: Point, prediction: Prediction | None, why: str, unpredictable: str | None) -> Row:
    if prediction is None:
        return _base(point, Status.FAILED, None, reason=f"{why}, but the closed form cannot give one: {unpredictable}")
    p = prediction
    return _base(point, Status.ESTIMATE, p.iteration_us_median, iteration_us_median=p.iteration_us_median,
                 iteration_us_p99=p.iteration_us_p99, compute_us=p.compute_us, comm_us=p.comm_us,
                 exposed_comm_us=p.exposed_comm_us, reason=why)


def _replayed(point: Point, doc: dict[str, Any], predicted: float | None, attempts: int) -> Row:
    summary = doc["summary"]
    its = doc.get("iterations") or []

    def med(key: str) -> float | None:
        return statistics.median(it[key] for it in its) if its else None

    median = summary["iteration_us_median"]
    emulator = doc.get("emulator") or {}
    return _base(point, Status.REPLAYED, predicted, iteration_us_median=median,
                 iteration_us_p99=summary["iteration_us_p99"], compute_us=med("compute_us"), comm_us=med("comm_us"),
                 exposed_comm_us=med("exposed_comm_us"),
                 predict_error=(predicted - median) / median if predicted is not None and median else None,
                 verification_ok=(doc.get("verification") or {}).get("ok"), trustworthy=emulator.get("trustworthy"),
                 complete=doc.get("complete"), wall_s=emulator.get("wall_s"), attempts=attempts,
                 sent_fraction=(doc.get("sparsity") or {}).get("sent_fraction"),
                 compression_ratio=(doc.get("compression") or {}).get("ratio"),
                 compression_error=(doc.get("compression") or {}).get("error"),
                 report=f"points/{point.slug}.json")


def with_derived(rows: list[Row]) -> list[Row]:
    """Fill the speedup over the reference fabric (ring where the grid has it, else the first) at the
    same workers and every other value equal (``peers``), and the scaling efficiency: the iteration
    at the grid's fewest workers over this one (1.0 is perfect weak scaling), None where that point
    has no time that can stand."""
    fabrics = list(dict.fromkeys(r.fabric for r in rows))
    ref = "ring" if "ring" in fabrics else fabrics[0] if fabrics else None
    reference = {(r.peers, r.workers): r for r in rows if r.fabric == ref and r.comparable}
    fewest: dict[tuple, Row] = {}
    for r in rows:
        group = (r.peers, r.fabric, r.design)
        if group not in fewest or r.workers < fewest[group].workers:
            fewest[group] = r
    out = []
    for r in rows:
        if not r.comparable:
            out.append(r)
            continue
        base = reference.get((r.peers, r.workers))
        small = fewest[(r.peers, r.fabric, r.design)]
        out.append(replace(
            r, speedup=base.iteration_us_median / r.iteration_us_median if base and r.iteration_us_median else None,
            speedup_over=ref if base else None,
            speedup_estimated=(Status.ESTIMATE in (r.status, base.status)) if base else None,
            scaling_efficiency=small.iteration_us_median / r.iteration_us_median
            if small.comparable and r.iteration_us_median else None))
    return out


COLUMNS = [f.name for f in fields(Row)]


def write_results(out: Path, rows: list[Row]) -> None:
    """results.csv and results.json, each written whole (docs/what-if.md lists the columns)."""
    docs = [_row_doc(r) for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for d in docs:
        writer.writerow({k: "" if v is None else v for k, v in d.items()})
    write_atomic(out / "results.csv", buf.getvalue(), "the sweep's table")
    doc = {"results_version": RESULTS_VERSION, "emu_version": emu.__version__, "points": docs}
    write_atomic(out / "results.json", json.dumps(doc, indent=1) + "\n", "the sweep's results")


def _row_doc(row: Row) -> dict[str, Any]:
    doc = asdict(row)
    doc["status"] = row.status.value
    return doc
