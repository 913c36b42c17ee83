"""The replay report: docs/design.md's contract as frozen dataclasses, and its JSON.

Meanings (docs/design.md): an iteration's ``emulated_us`` is its period: from the moment the last
worker finished the iteration before (the first iteration: the earliest worker's start) to the
moment the last worker finishes this one; ``span_us`` runs from the earliest worker's start of
the iteration to the same end, and holds the workers' skew on top of the period. ``compute_us``,
``comm_us`` and ``exposed_comm_us`` are those of that last (critical) worker: the
sum of its compute, the union of its collectives' issue-to-completion intervals,
and the time its compute was blocked in waits. ``bytes_sent`` counts emulated
wire bytes (times R) of every link direction, headers and retransmissions included.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emu.errors import ConfigError
from emu.files import write_atomic

# 2: trace.sha256, config.stragglers and config.design added (CHANGELOG.md); no meaning changed
# 3: verification.elements_distinct, fabric.packets_lost_modelled and jobs[].compression added; no
# meaning changed
# 4: compression.data added; no meaning changed
# 5: sparsity.sent_fraction from the bytes that crossed the links; sparsity's byte counts added
# 6: iterations[].emulated_us (and the summary's iteration times, throughput) is the period, last end
# to last end, no longer the span; iterations[].span_us added (the span, what emulated_us was)
REPORT_VERSION = 6


@dataclass(frozen=True)
class IterationReport:
    index: int
    emulated_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    critical_worker: int
    start_offset_us: float  # the critical worker's start after the earliest worker's
    # the earliest worker's start to the last end: compute_us + exposed_comm_us + start_offset_us
    span_us: float


@dataclass(frozen=True)
class Summary:
    iteration_us_median: float
    iteration_us_p99: float
    throughput_samples_per_s: float | None
    bytes_sent: float


@dataclass(frozen=True)
class Verification:
    ok: bool
    # element deliveries checked: every worker checks what it receives, so a result reaching M
    # workers counts M times (``elements_distinct``: once)
    elements_checked: int
    mismatches: int
    # what the workers sent: generated (emu.emulator.payload.generated, every sum exact) or recorded (the
    # real ranks' tensors of emu run: point-to-point sums within their dtype's rounding, the
    # switch's int32 sums exact)
    payload: str = "generated"
    payload_note: str | None = None  # why a recorded payload was not sent
    # point-to-point segments that stood for payload on the emulated wire, and those of them that
    # carried no real element: at a coarse payload scale a chunk of the real tensor (a ring's is
    # 1/M of it) can be empty, its emulated bytes crossed every link and no value of it was checked
    segments: int = 0
    segments_without_data: int = 0
    # distinct elements of the results checked, each once however many workers checked it (a
    # result every member receives counts at one member; a reduce_scatter's shard at its owner)
    elements_distinct: int = 0


@dataclass(frozen=True)
class EmulatorReport:
    clock: str  # sync (conservative synchronization) or wall (paced by the wall clock, dilated)
    tdf: float | None  # null on the synchronized clock
    payload_scale: int
    lag_us_p99: float | None  # null on the synchronized clock, where nothing is late
    lag_us_max: float | None
    trustworthy: bool
    reordered: int  # link hand-overs out of emulated-time order (beyond packet-level interleaving)
    reorder_error_us: float  # the most those could have shifted one endpoint's packet times, summed
    wall_s: float
    cpu_percent: float
    processes: int
    events: int  # the hosts' local events handled: resumptions (a cohort's once) and retransmission timers
    advice: str | None
    run_s: float = 0.0  # wall seconds of the run itself (without process start and stop)
    calibration: dict | None = None  # how auto chose tdf and payload scale
    windows: int | None = None  # rounds of the synchronized clock
    real_bytes: float = 0.0  # bytes of data messages that really crossed between processes (both ways)
    machines: int = 1  # machines the replay was spread over (docs/multi-host.md)
    rejected_messages: int = 0  # messages dropped as unauthenticated (several machines: emu.replay.machines.sealed)


@dataclass(frozen=True)
class LinkUsage:
    """One kind of link's utilisation over the replay (busy time over the emulated span)."""

    links: int
    mean: float
    max: float
    busiest: str  # the name of the busiest link of the kind


@dataclass(frozen=True)
class BridgeReport:
    """A switch outside emu behind its bridge (``--fabric bmv2``: emu/p4/bridge.py), counted by the
    bridge. The fabric's other counters (packets, results, duplicates, ...) are then those of emu's
    protocol model fed the same packets in the same order: the P4 program counts nothing."""

    frames: int  # contribution frames sent to the switch, resends included
    results: int  # result frames it sent back (every port's copy of a multicast)
    barriers: int  # the bridge's FLUSH barriers (docs/p4.md)
    barrier_resends: int  # barriers sent again: one had not come back on every port in time
    resent: int  # contributions sent again for results the switch lost (real drops)
    differs: int  # results whose header or sum differs from the protocol model's (0: the program agrees)


@dataclass(frozen=True)
class FabricReport:
    """Real messages and emulated packets are counted apart (docs/design.md, "Report")."""

    name: str
    packets: int  # real aggregation rows the switch handled
    retransmissions: int  # real rows the workers' streams sent again (payload scale 1 only)
    duplicates: int
    slots: int  # real slots in the switch's pool
    slots_emulated: int
    results: int
    answered: int
    dropped: int
    lost: int  # real rows the links dropped (payload scale 1 only)
    segments: int
    fallbacks: dict[str, int] = field(default_factory=dict)
    packets_lost: int = 0  # emulated packets lost on any link, every kind; each is resent
    # of those, the ones whose loss and resending a model drew and timed, no real message dropped:
    # a point-to-point segment's packets always, INA's at payload scale above 1 (docs/reliability.md)
    packets_lost_modelled: int = 0
    # packets the switch dropped unapplied (docs/protocol.md): always 0 between emu's own workers
    invalid: int = 0
    malformed: int = 0
    stale: int = 0
    # per kind of link (uplink, downlink; on a topology NIC up and down, node port up and down, leaf
    # to spine and spine to leaf): its utilisation; and the busiest link of all (docs/topology.md)
    utilisation: dict[str, LinkUsage] = field(default_factory=dict)
    busiest_link: dict[str, Any] | None = None
    bridge: BridgeReport | None = None  # a switch outside emu (bmv2): what crossed to it and back


@dataclass(frozen=True)
class SparsityReport:
    """What the payload of the replayed sparse all_reduces held (docs/sparse.md), counted from the
    hashes that made it: of their blocks, the fraction non-zero on some worker (``union_fraction``)
    and the mean fraction non-zero on a worker (``nonzero_fraction``). What crossed the links for
    them is counted where each message was sent (a stream's results once per worker reached),
    resends aside: ``sent_bytes``, their values and block indices, and ``header_bytes``, the
    headers and framing of the same packets; ``dense_bytes`` is what the dense algorithm sends in
    values (a formula: it did not run), and ``sent_fraction`` is ``sent_bytes / dense_bytes``. All
    three are emulated bytes (a payload scale's real messages stand for R times theirs).
    ``sparse_collectives`` ran a sparse algorithm (``ring``, ``ps``: where cheaper than dense;
    ``ina``: the sparse stream, where it applies), ``dense_collectives`` sent every block."""

    collectives: int  # sparse all_reduces replayed (every iteration's)
    blocks: int  # their blocks of real elements (with payload scale R, ceil(count / R) each)
    union_fraction: float
    nonzero_fraction: float
    sent_fraction: float = 1.0
    sparse_collectives: int = 0
    dense_collectives: int = 0
    sent_bytes: float = 0.0
    header_bytes: float = 0.0
    dense_bytes: float = 0.0


@dataclass(frozen=True)
class AdaptiveStep:
    """One iteration of ``--compress adaptive``: the bandwidth the workers agreed on before it,
    and the compressor each bucket got (program order)."""

    iteration: int
    start_us: float | None  # emulated time the iteration began (its first worker)
    bandwidth_bps: float
    choices: list[str]


@dataclass(frozen=True)
class AdaptiveReport:
    """What ``--compress adaptive`` chose over time (emu.replay.plan.adaptive)."""

    floor: float  # the most aggressive top-k ratio allowed
    candidates: list[str]
    passes: int  # replays until the choices were those their own measurements called for
    agreement: str  # how the workers agreed on a bandwidth
    steps: list[AdaptiveStep]


@dataclass(frozen=True)
class CompressionReport:
    """What ``--compress`` did, per worker and iteration (the first rank program's first iteration):
    the all_reduces it compressed, their bytes before and after (as each worker sends them: an
    all_gather's share, an all_reduce's tensor), the compute it cost, and one step's error."""

    compressor: str
    aggregation: str  # the collective it uses: all_reduce or all_gather
    feedback: bool  # error feedback (GRACE's residual memory)
    in_switch: bool  # INA summed it in the switch (int32: 4 bytes a value, or a quantizer's lanes); false: point to point
    collectives: int
    bytes_dense: int
    bytes_compressed: int
    ratio: float
    compress_us: float
    decompress_us: float
    speed: float
    error: float | None  # relative L2 error of the aggregate against the exact sum
    cosine: float | None  # cosine similarity of the aggregate and the exact sum (sign methods: their measure)
    error_sample: str | None  # what the error was measured on
    # after each of 8 steps, the accumulated aggregates' error against the accumulated exact sums
    error_accumulated: list[float] | None = None
    # a quantizer summed in the switch: its int32 lanes held exactly the sums of the workers' levels
    # (on the error's sample); None where nothing was summed in lanes
    switch_exact: bool | None = None
    adaptive: AdaptiveReport | None = None  # --compress adaptive: the choices over time
    # what the error was measured on and the fabric carried: "recorded" (the real ranks' tensors of
    # --payload, compressed for real, their messages on the wire), "sampled" (the error on the
    # gradients a capture sampled, the trace's gradient_samples; generated payload of the compressed
    # sizes), "generated" (a generated sample apart, and generated payload of the compressed sizes)
    data: str = "generated"


@dataclass(frozen=True)
class GroupReport:
    """The collectives of one role of a sharded or split job's groups (docs/parallelism.md)."""

    role: str  # dp, fsdp, tp, pp, ep, other; "" where the trace names none
    dims: tuple[str, ...]  # the mesh dimensions its groups span (a send's and a recv's: the one they cross)
    groups: int  # how many such groups the replay has (pp: sender-receiver channels)
    size: int  # workers in each
    collectives: int  # a group's collectives an iteration
    bytes: int  # a member's collectives' bytes an iteration (full tensors, as the trace counts them)
    kinds: tuple[str, ...]
    ran: tuple[str, ...]  # how the fabric ran them: "switch", "ring", "parameter server", "tree", ...
    inside_nodes: bool  # every group lies within one node of the topology (its traffic never leaves it)
    padded_elements: int  # a group's padding an iteration: all_gathers and reduce_scatters grown to whole shards
    expected: int  # collectives the run's workers had to complete (every member's, every iteration)
    completed: int  # those they completed


@dataclass(frozen=True)
class ParallelismReport:
    """How a sharded or split trace was laid out and what each kind of group did (docs/parallelism.md)."""

    trace_mesh: str | None  # the trace's mesh (None: sub-groups without one, replayed as they are)
    mesh: str | None  # the replay's
    scaled: tuple[str, ...]  # the dimensions that changed size
    kept: tuple[str, ...]
    groups: tuple[GroupReport, ...]
    accounted: bool  # every collective of every group completed on every worker
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobReport:
    """One of several jobs sharing the fabric (docs/topology.md, "Several jobs")."""

    job: int
    trace: dict[str, Any]  # path, model, sha256
    workers: int
    nodes: list[int] | None  # the fabric's nodes it holds (on a topology)
    slots: int  # its share of the switch's pool (emulated slots)
    iterations: tuple[IterationReport, ...]
    summary: Summary | None  # over all its iterations
    verification: Verification
    overlapped: int  # its iterations that ended while every job still ran
    shared_us: float | None  # their median (None: none did; give more --iters)
    alone_us: float | None  # the same iterations' median alone on the fabric: the same nodes and share of the pool
    slowdown: float | None  # shared_us over alone_us
    # --compress: what the job's workers compressed (adaptive: the choices they made sharing the
    # fabric; the top-level compression is job 0's)
    compression: CompressionReport | None = None


@dataclass(frozen=True)
class ReplayReport:
    report_version: int
    emu_version: str
    config: dict[str, Any]
    trace: dict[str, Any]
    iterations: tuple[IterationReport, ...]
    summary: Summary | None  # None when no iteration was completed by every worker
    verification: Verification
    emulator: EmulatorReport
    fabric: FabricReport
    complete: bool = True  # false: the partial report of a failed or interrupted run
    reason: str | None = None  # why it is partial
    sparsity: SparsityReport | None = None  # None when every all_reduce was dense
    compression: CompressionReport | None = None  # None without --compress
    jobs: tuple[JobReport, ...] | None = None  # several jobs sharing the fabric; the rest is job 0's
    parallelism: ParallelismReport | None = None  # a sharded or split trace's layout and groups

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["iterations"] = [asdict(it) for it in self.iterations]
        if self.jobs is not None:
            doc["jobs"] = [{**asdict(j), "iterations": [asdict(it) for it in j.iterations]} for j in self.jobs]
        return doc

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n", "the report")

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ReplayReport:
        """The report ``to_dict`` gave (read back from JSON: a saved report, or machine 0's for the
        other machines of a replay spread over several); ConfigError where it is not one."""
        return _build(cls, doc, "report")


def _build(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _build(option, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r:.60} is none of {hint}")
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        hints = typing.get_type_hints(hint)
        names = {f.name for f in dataclasses.fields(hint)}
        if set(value) - names:
            raise ConfigError(f"{where}: unknown keys {sorted(set(value) - names)}")
        return hint(**{k: _build(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin is tuple and isinstance(value, list):
        (item, _) = typing.get_args(hint)
        return tuple(_build(item, v, where) for v in value)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [_build(item, v, where) for v in value]
    if origin is dict and isinstance(value, dict):
        _, item = typing.get_args(hint)
        return {k: _build(item, v, f"{where}.{k}") for k, v in value.items()}
    if hint is Any or (hint in (dict, list) and isinstance(value, hint)):
        return value
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    raise ConfigError(f"{where}: {value!r:.60} is not a {getattr(hint, '__name__', hint)}")


def write_chrome_trace(spans: dict[int, list[tuple[str, str, float, float]]], path: str | os.PathLike[str]) -> Path:
    """Every worker's compute, communication and wait spans in emulated time (Perfetto, chrome://tracing)."""
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                                     "args": {"name": "emu replay (emulated time)"}}]
    for w in sorted(spans):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": w, "args": {"name": f"worker {w}"}})
        for cat, name, start, end in spans[w]:
            events.append({"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": w,
                           "ts": round(start, 3), "dur": round(end - start, 3)})
    return write_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}), "the Chrome trace")
