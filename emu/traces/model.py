"""The emu trace data model (schema_version 1) as frozen dataclasses.

A trace is, per rank, a list of iterations; each iteration is an ordered program
of compute, collective-issue and wait operations (see docs/trace-format.md).
Times are microseconds (``_us``), sizes bytes or elements as named. This module
holds only the records and their closed vocabularies; reading, writing and
checking live beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from emu.traces.mesh import Mesh

SCHEMA = "emu-trace"


class CollKind(str, Enum):
    """The collectives a trace may issue (a closed set, docs/design.md)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    BARRIER = "barrier"


class GroupRole(str, Enum):
    """Which dimension of the job's parallelism a collective's group belongs to (``group_role``)."""

    DP = "dp"  # data parallel: replicas that all-reduce their gradients
    FSDP = "fsdp"  # fully sharded data parallel: shards that gather parameters, reduce-scatter gradients
    TP = "tp"  # tensor parallel: one layer split across ranks (usually inside a node)
    PP = "pp"  # pipeline parallel: stages that pass activations and gradients (send/recv)
    EP = "ep"  # expert parallel: experts of a mixture spread over ranks (all_to_all)
    OTHER = "other"  # any other group (context parallel, a group made by hand)


class Dtype(str, Enum):
    """Element types of collective tensors, with their sizes."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        """Floating point: what in-network aggregation sums (in fixed point)."""
        return self in (Dtype.FLOAT32, Dtype.FLOAT16, Dtype.BFLOAT16, Dtype.FLOAT64)

    @property
    def numpy(self) -> str:
        """Its little-endian numpy type ('' for bfloat16, which numpy lacks: it travels as the high
        half of a float32)."""
        return _NUMPY[self]


_ITEMSIZE = {
    Dtype.FLOAT32: 4, Dtype.FLOAT16: 2, Dtype.BFLOAT16: 2, Dtype.FLOAT64: 8,
    Dtype.INT64: 8, Dtype.INT32: 4, Dtype.INT16: 2, Dtype.INT8: 1,
    Dtype.UINT8: 1, Dtype.BOOL: 1,
}
_NUMPY = {
    Dtype.FLOAT32: "<f4", Dtype.FLOAT16: "<f2", Dtype.BFLOAT16: "", Dtype.FLOAT64: "<f8",
    Dtype.INT64: "<i8", Dtype.INT32: "<i4", Dtype.INT16: "<i2", Dtype.INT8: "i1",
    Dtype.UINT8: "u1", Dtype.BOOL: "?",
}


# Dtype spellings of PyTorch's traces: record_param_comms' "dtype", gloo's "Input type", the
# execution trace's "Tensor(float)" (Kineto and Chakra imports)
DTYPE_SPELLINGS: dict[str, Dtype] = {
    "Float": Dtype.FLOAT32, "float": Dtype.FLOAT32, "Half": Dtype.FLOAT16, "c10::Half": Dtype.FLOAT16,
    "BFloat16": Dtype.BFLOAT16, "c10::BFloat16": Dtype.BFLOAT16, "Double": Dtype.FLOAT64,
    "double": Dtype.FLOAT64, "Long": Dtype.INT64, "long int": Dtype.INT64, "long": Dtype.INT64,
    "Int": Dtype.INT32, "int": Dtype.INT32, "Short": Dtype.INT16, "short int": Dtype.INT16,
    "Char": Dtype.INT8, "signed char": Dtype.INT8, "Byte": Dtype.UINT8, "unsigned char": Dtype.UINT8,
    "Bool": Dtype.BOOL, "bool": Dtype.BOOL,
}


class Source(str, Enum):
    """Where a trace came from."""

    CAPTURE = "capture"  # emu ran the workload itself
    KINETO = "kineto"  # imported from profiler traces a user already had
    SYNTHETIC = "synthetic"  # made by emu for a physics check (emu.traces.synthetic)
    LIVE = "live"  # recorded by emu run from the real ranks' calls into its backend (emu.run)
    CHAKRA = "chakra"  # imported from MLCommons Chakra execution traces (emu.traces.chakra)


@dataclass(frozen=True)
class Compute:
    """The rank is busy for ``dur_us`` and issues nothing meanwhile."""

    name: str
    dur_us: float


@dataclass(frozen=True)
class Sparsity:
    """How sparse a collective's tensor was, measured on the real gradients (OmniReduce's view).

    The tensor is cut into blocks of ``block_elements``; ``nonzero`` is the fraction of blocks
    holding a non-zero element on this rank, ``union`` the fraction non-zero on at least one rank
    of the captured job (so ``nonzero <= union``: how much the ranks' blocks overlap).

    ``sparse_tensor``: the all_reduce was the framework's own sparse collective (gloo's all_reduce
    of a sparse COO tensor: only the non-zero rows, with their indices, cross), so a replay runs
    each fabric's sparse algorithm whatever the cost; a block is then one row. Otherwise the
    tensor was dense (a DDP gradient bucket) and its zero blocks were counted.
    """

    block_elements: int
    nonzero: float
    union: float
    sparse_tensor: bool = False


@dataclass(frozen=True)
class Coll:
    """A collective issued at this point onto the rank's communication stream.

    ``count`` is the element count of the full tensor (all_gather: the output,
    reduce_scatter: the input); each rank's shard is ``count / group_size``.
    ``observed_us`` is what the capture measured from issue to completion
    (None where the source had no completion time).
    """

    id: int
    kind: CollKind
    dtype: Dtype
    count: int
    bytes: int
    group_size: int
    observed_us: float | None = None
    root: int | None = None
    peer: int | None = None
    group: tuple[int, ...] | None = None
    tensors: tuple[tuple[int, ...], ...] | None = None
    sparsity: Sparsity | None = None  # measured where the capture could see the data (all_reduce)
    # which dimension of the job's mesh the group belongs to (absent: unknown, or a one-group job)
    group_role: GroupRole | None = None
    # the rank's communication stream: collectives of one stream complete in issue order, those of
    # different streams run concurrently (absent: the rank's one stream, as every collective of v1)
    stream: int | None = None
    # an all_to_all's elements per peer, where they are not even (absent: count / group_size each)
    splits: Splits | None = None


@dataclass(frozen=True)
class Splits:
    """An all_to_all's elements per peer, as ``all_to_all_single`` takes its split sizes (in
    elements, not rows): ``send_elements[j]`` of this rank's input go to member j of the group,
    ``recv_elements[j]`` of its output come from member j. Absent on a ``Coll``: every peer gets
    ``count / group_size``, as the trace format had it before (docs/trace-format.md)."""

    send_elements: tuple[int, ...]
    recv_elements: tuple[int, ...]

    @classmethod
    def of(cls, op: Coll) -> Splits:
        """An all_to_all's sizes: its own, or where it has none ``count / group_size`` each way."""
        if op.splits is not None:
            return op.splits
        even = (op.count // op.group_size,) * op.group_size
        return cls(even, even)

    @property
    def imbalance(self) -> float:
        """The largest send or receive over their mean (1.0: even, or nothing moved)."""
        values = self.send_elements + self.recv_elements
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean else 1.0


@dataclass(frozen=True)
class Wait:
    """Compute blocks until the listed collectives have finished.

    ``blocked_us`` (optional, an addition to v1) is how long the captured rank
    was actually blocked here; it lets summaries and calibration reconstruct
    the measured timeline: sum(compute) + sum(blocked) == measured_us.
    """

    ids: tuple[int, ...]
    blocked_us: float | None = None


Op = Compute | Coll | Wait


@dataclass(frozen=True)
class Iteration:
    """One training step of one rank: its measured time and its program."""

    step: int
    measured_us: float
    ops: tuple[Op, ...]

    @property
    def colls(self) -> tuple[Coll, ...]:
        return tuple(op for op in self.ops if isinstance(op, Coll))

    @property
    def compute_us(self) -> float:
        return sum(op.dur_us for op in self.ops if isinstance(op, Compute))

    @property
    def blocked_us(self) -> float:
        return sum(op.blocked_us or 0.0 for op in self.ops if isinstance(op, Wait))


@dataclass(frozen=True)
class RankProgram:
    rank: int
    iterations: tuple[Iteration, ...]


@dataclass(frozen=True)
class Experts:
    """A mixture of experts' layout (``meta.experts``), where the trace records it: what a replay at
    another expert-parallel size needs (``emu.replay.plan.experts``, docs/moe.md)."""

    count: int  # experts over the expert-parallel group (each rank holds count / ep of them)
    params_per_expert: int  # elements of one expert's parameters (its gradients' dtype: meta.dtype)


@dataclass(frozen=True)
class CaptureNoise:
    """How steady the profiled steps were, and how busy the machine was while they ran
    (``meta.noise``; ``emu.traces.noise``, docs/capture.md "Noise")."""

    step_cv: float  # the profiled steps' durations: std over mean, the most varied rank's
    compute_cv: float  # a step's compute (its Compute ops summed): std over mean, the most varied rank's
    rank_cv: float = 0.0  # the ranks' median compute a step: std over mean across the ranks in the file
    other_cores: float | None = None  # cores other processes kept busy during the window (a capture's own)
    steal: float | None = None  # the share of the machine's CPU time its hypervisor took (a capture's own)
    busy: tuple[str, ...] = ()  # why the steps may not be a quiet machine's, one line each (empty: none found)
    windows: int = 1  # profiled windows the capture took, the steadiest kept (emu capture --windows)
    # the capture's steps past its window, without the profiler: their median wall time (the
    # ranks' median of each rank's), and the fewest a rank timed (None, 0: not measured, as in imports)
    unprofiled_step_us: float | None = None
    unprofiled_steps: int = 0


@dataclass(frozen=True)
class TraceMeta:
    """Provenance of a trace. Optional fields are None where the source is silent."""

    source: Source
    world_size: int
    backend: str
    device: str
    framework: str
    dtype: str
    captured_at: str
    model: str | None = None
    batch_size: int | None = None
    params: int | None = None
    command: str | None = None
    kineto_files: tuple[str, ...] = field(default_factory=tuple)
    # What the source lacked and what the trace holds instead, one line each (an
    # import records a gap rather than invent a value; docs/trace-format.md)
    gaps: tuple[str, ...] = field(default_factory=tuple)
    # The DDP communication hook the captured script registered (its function's name): with
    # PyTorch's fp16, bf16 or PowerSGD hooks the all_reduces are the compressed buckets
    comm_hook: str | None = None
    # The job's device mesh (emu.traces.mesh.Mesh), where the source recorded it
    mesh: Mesh | None = None
    # How the capture's ranks shared this machine: its CPU cores, and the threads each rank used
    cpu_cores: int | None = None
    threads_per_rank: int | None = None
    # A mixture of experts' layout, where the source recorded it (emu capture --model moe does)
    experts: Experts | None = None
    # The profiled steps' spread and the machine's load while they ran (captures, imports, emu run)
    noise: CaptureNoise | None = None


@dataclass(frozen=True)
class GradientSample:
    """Values of one gradient bucket on one rank as the capture's hook saw them, before the
    all_reduce summed them, at ``values`` positions of the bucket the capture drew (the same on
    every rank of the job, so the ranks' samples pair element by element): what a replay's
    compressors are measured on (``emu.capture.sparsity``, docs/compression.md)."""

    rank: int
    iteration: int  # index into the rank's iterations
    coll: int  # the all_reduce's id there
    values: bytes  # float32, little-endian

    def array(self):  # -> numpy.ndarray (numpy is imported only here: the model is plain data)
        import numpy as np

        return np.frombuffer(self.values, "<f4")


@dataclass(frozen=True)
class Trace:
    """A whole emu trace: provenance and the programs of some or all ranks; ``gradient_samples``,
    where a capture recorded them (a built-in workload with sparsity on)."""

    meta: TraceMeta
    ranks: tuple[RankProgram, ...]
    gradient_samples: tuple[GradientSample, ...] = ()

    @property
    def iterations(self) -> int:
        return min((len(r.iterations) for r in self.ranks), default=0)

    def rank(self, rank: int) -> RankProgram:
        for program in self.ranks:
            if program.rank == rank:
                return program
        raise KeyError(rank)
