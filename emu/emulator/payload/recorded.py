"""Recorded payload: the real ranks' own tensors as the data the fabric carries (docs/run.md).

``emu run`` records, for every collective its K real ranks issued, each rank's *payload vector*
``V_r``: the values a worker holding rank r's data contributes at each element of the
collective's tensor (all_reduce and broadcast: the tensor; reduce_scatter: its inputs end to end;
all_gather: the rank's input repeated over the output, so that chunk j of a ring holds worker
j's shard). Worker ``w`` of a replay at M workers runs real rank ``w mod K``'s program, so it
sends ``V_{w mod K}``, and the sum a reduction must reach is ``M / K * sum_r V_r``.

Only the first ``ceil(count / R)`` elements of each are kept: what a replay at payload scale R
really sends. The generator of ``emu.emulator.payload.generated`` makes values whose every partial sum is
exact; real values are not, so a point-to-point sum is checked within the rounding its dtype
allows (``RecordedBlock.slack``), while on ``ina`` the switch adds integers and the expected
int32 sums are exact (``emu.emulator.protocol.ina``).

On disk (``payload_arrays`` / ``load_payload``) a payload is one ``.npz`` file of plain arrays,
read with ``allow_pickle=False``: a JSON header and one (K, kept) array per collective of every
recorded iteration.
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from emu.errors import TraceError

PAYLOAD_FORMAT = "emu-payload"
PAYLOAD_VERSION = 1
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


@dataclass(frozen=True)
class RecordedBlock:
    """Elements [lo, hi) of one collective on every real rank, as float64 (K, hi - lo)."""

    ranks: np.ndarray
    dtype: str

    def values(self, worker: int) -> np.ndarray:
        """What worker ``worker`` contributes: its real rank's values."""
        return self.ranks[worker % len(self.ranks)]

    def expected_sum(self, num_workers: int) -> np.ndarray:
        """The sum over ``num_workers`` workers, ``num_workers / K`` of them per real rank."""
        return (num_workers // len(self.ranks)) * self.ranks.sum(axis=0)

    def slack(self, num_workers: int) -> np.ndarray:
        """How far a sum of ``num_workers`` terms formed in any order, rounded to the dtype at
        each hop, may be from the float64 sum: half a unit of the dtype per addition, of at most
        the sum of the magnitudes, and one more for the final rounding (integers sum exactly)."""
        eps = _EPS.get(self.dtype, 0.0)
        return num_workers * eps / 2 * (num_workers // len(self.ranks)) * np.abs(self.ranks).sum(axis=0)


def checkable(dtype: str, workers: int) -> bool:
    """Whether a point-to-point sum of ``workers`` recorded values of ``dtype`` can be checked
    meaningfully: its slack (``RecordedBlock.slack``, ``M eps / 2`` of the magnitudes) must stay
    below a tenth of one worker's average share (``1 / M`` of them), or a lost or doubled
    contribution could pass: ``M^2 eps / 2 < 1 / 10``. float32 passes up to 1,295 workers, float16
    up to 14; integers always."""
    eps = _EPS.get(dtype, 0.0)
    return workers * workers * eps / 2 < 0.1


@dataclass(frozen=True)
class RecordedPayload:
    """The payload vectors of a trace's collectives: ``tensors[i * per_iteration + c]`` is
    collective c of recorded iteration i, a (K, kept) array in the collective's dtype (None for a
    barrier, which carries nothing). A replay reuses iterations cyclically, as it does the
    trace's, so collective ``seq`` of a replay is entry ``seq mod len(tensors)``.

    An entry's rows are the distinct payload vectors its workers send, worker ``w`` row ``w mod
    rows``: K as recorded (real rank ``w mod K``'s); a compressed replay's entries may hold M (each
    worker's own message, ``emu.replay.plan.compressed_payload``) or one (an all_gather's output
    with every worker's message in its place), and every sum is ``M / rows`` times the rows'."""

    real_ranks: int
    per_iteration: int
    dtypes: tuple[str, ...]  # per entry
    tensors: tuple[np.ndarray | None, ...]

    def __post_init__(self) -> None:
        if len(self.tensors) != len(self.dtypes) or (self.per_iteration and len(self.tensors) % self.per_iteration):
            raise ValueError("a payload has one dtype per entry and whole iterations")

    def __hash__(self) -> int:  # identity: the lru cache below keys on it
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @property
    def iterations(self) -> int:
        return len(self.tensors) // self.per_iteration if self.per_iteration else 0

    def entry(self, seq: int) -> np.ndarray | None:
        return self.tensors[seq % len(self.tensors)] if self.tensors else None

    def kept(self, seq: int) -> int:
        """Elements kept of collective ``seq`` (0: none, a barrier)."""
        t = self.entry(seq)
        return 0 if t is None else int(t.shape[1])

    def block(self, seq: int, lo: int, hi: int) -> RecordedBlock:
        t = self.entry(seq)
        if t is None or hi > t.shape[1]:
            raise ValueError(f"collective {seq}: elements [{lo}, {hi}) were not recorded")
        return RecordedBlock(ranks=_wide(t[:, lo:hi]), dtype=self.dtypes[seq % len(self.tensors)])

    def rows(self, seq: int, workers: np.ndarray, blocks: np.ndarray, k: int) -> np.ndarray:
        """float64 rows of ``k`` elements (zero padded past the tensor): block ``blocks[i]`` of
        worker ``workers[i]``, which holds real rank ``workers[i] mod K``'s values."""
        padded = _padded(self, seq % len(self.tensors), k)
        return padded[np.asarray(workers) % len(padded), np.asarray(blocks)]

    def rank_rows(self, seq: int, blocks: np.ndarray, k: int) -> np.ndarray:
        """(K, len(blocks), k): every real rank's rows of ``blocks``."""
        return _padded(self, seq % len(self.tensors), k)[:, np.asarray(blocks)]

    def shard_rows(self, seq: int, workers: np.ndarray, blocks: np.ndarray, k: int, shards: int,
                   lanes: int) -> np.ndarray:
        """A reduce_scatter's rows on the stream (``emu.emulator.protocol.ina``): float64 rows of ``k``, shard
        ``s``'s elements ``[s lanes, (s+1) lanes)`` cut into blocks of its own and zero padded; block
        ``blocks[i]`` of worker ``workers[i]`` (real rank ``workers[i] mod K``'s values)."""
        sharded = _sharded(self, seq % len(self.tensors), k, shards, lanes, False)
        return sharded[np.asarray(workers) % len(sharded), np.asarray(blocks)]

    def rank_shard_rows(self, seq: int, blocks: np.ndarray, k: int, shards: int, lanes: int) -> np.ndarray:
        """(K, len(blocks), k): ``shard_rows`` of every real rank."""
        return _sharded(self, seq % len(self.tensors), k, shards, lanes, False)[:, np.asarray(blocks)]

    def gather_lanes(self, seq: int, owners: np.ndarray, blocks: np.ndarray, k: int, shards: int,
                     lanes: int) -> np.ndarray:
        """An all_gather's rows on the stream: int32 lanes of 4 bytes of the tensor's dtype, shard
        ``s``'s ``ceil(n / shards)`` elements (real rank ``s mod K``'s, as the owner of shard ``s``
        holds) in ``lanes`` lanes, cut into blocks of its own; block ``blocks[i]`` of its owner."""
        sharded = _sharded(self, seq % len(self.tensors), k, shards, lanes, True)
        return sharded[np.asarray(owners) % len(sharded), np.asarray(blocks)]

    def padded(self, counts: list[int]) -> RecordedPayload:
        """Each entry zero padded to at least ``counts[i]`` elements: an all_gather's or
        reduce_scatter's padding to whole shards at the replay's M workers, which the K real ranks'
        tensors never held (zeros: every worker sends them, and every check expects them)."""
        return RecordedPayload(self.real_ranks, self.per_iteration, self.dtypes, tuple(
            t if t is None or t.shape[1] >= n else np.pad(t, ((0, 0), (0, n - t.shape[1])))
            for t, n in zip(self.tensors, counts, strict=True)))

    def trimmed(self, counts: list[int], scale: int) -> RecordedPayload:
        """Each entry cut to the ``ceil(count / scale)`` elements a replay at payload scale
        ``scale`` sends (``counts``: per entry)."""
        return RecordedPayload(self.real_ranks, self.per_iteration, self.dtypes, tuple(
            None if t is None else t[:, : -(-n // scale)] for t, n in zip(self.tensors, counts, strict=True)))


def _wide(t: np.ndarray) -> np.ndarray:
    return t.astype(np.float64)


@functools.lru_cache(maxsize=8)
def _padded(payload: RecordedPayload, index: int, k: int) -> np.ndarray:
    """Entry ``index`` as float64 (K, blocks, k), zero padded: made once per collective and
    packet size, and kept while the stream is at it."""
    t = payload.tensors[index]
    if t is None:
        raise ValueError(f"collective {index} carries no payload")
    blocks = -(-t.shape[1] // k)
    out = np.zeros((t.shape[0], blocks * k))
    out[:, : t.shape[1]] = t
    return out.reshape(t.shape[0], blocks, k)


@functools.lru_cache(maxsize=8)
def _sharded(payload: RecordedPayload, index: int, k: int, shards: int, lanes: int, raw: bool) -> np.ndarray:
    """Entry ``index`` as (K, shards x P, k), each shard in ``P = ceil(lanes / k)`` blocks of its own:
    float64 elements (``lanes`` a shard), or (``raw``) int32 lanes of the shard's bytes in its dtype."""
    t = payload.tensors[index]
    if t is None:
        raise ValueError(f"collective {index} carries no payload")
    blocks = -(-lanes // k) if lanes else 0
    out = np.zeros((t.shape[0], shards, blocks * k), np.int32 if raw else np.float64)
    per = -(-t.shape[1] // shards)
    for s in range(shards):
        part = t[:, s * per:(s + 1) * per] if raw else t[:, s * lanes:(s + 1) * lanes]
        if raw:  # the shard's bytes, zero padded to whole lanes
            data = np.zeros((t.shape[0], lanes * 4), np.uint8)
            flat = np.ascontiguousarray(part).view(np.uint8).reshape(t.shape[0], -1)
            data[:, : flat.shape[1]] = flat[:, : lanes * 4]
            out[:, s, :lanes] = data.view("<i4")
        else:
            out[:, s, : part.shape[1]] = part
    return out.reshape(t.shape[0], shards * blocks, k)


def payload_arrays(payload: RecordedPayload) -> dict[str, np.ndarray]:
    """The plain arrays of a payload's .npz file: a JSON header, and ``t{i}`` per entry held."""
    head = {"format": PAYLOAD_FORMAT, "version": PAYLOAD_VERSION, "real_ranks": payload.real_ranks,
            "per_iteration": payload.per_iteration, "dtypes": list(payload.dtypes),
            "present": [t is not None for t in payload.tensors]}
    arrays = {f"t{i}": t for i, t in enumerate(payload.tensors) if t is not None}
    return {"header": np.frombuffer(json.dumps(head).encode(), np.uint8), **arrays}


def load_payload(path: str | os.PathLike[str]) -> RecordedPayload:
    """Read a payload's .npz (``payload_arrays``); a TraceError naming the file and what is wrong."""
    try:
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        if not zipfile.is_zipfile(path):
            raise TraceError(f"{path}: not an emu payload file (a .npz that emu run writes beside --trace-out)")
        with np.load(path, allow_pickle=False) as z:
            head = json.loads(bytes(z["header"]).decode())
            if head.get("format") != PAYLOAD_FORMAT or head.get("version") != PAYLOAD_VERSION:
                raise TraceError(f"{path}: not an emu payload of version {PAYLOAD_VERSION} (format "
                                 f"{head.get('format')!r}, version {head.get('version')!r}); write it again with "
                                 "emu run --trace-out")
            k, dtypes, present = int(head["real_ranks"]), tuple(head["dtypes"]), head["present"]
            tensors = []
            for i, here in enumerate(present):
                if not here:
                    tensors.append(None)
                    continue
                t = z[f"t{i}"]
                if t.ndim != 2 or t.shape[0] != k:
                    raise TraceError(f"{path}: entry t{i} has shape {t.shape}, not ({k}, elements)")
                tensors.append(t)
            return RecordedPayload(real_ranks=k, per_iteration=int(head["per_iteration"]), dtypes=dtypes,
                                   tensors=tuple(tensors))
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(f"{path}: no such payload file") from None
    except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable emu payload ({exc}); write it again with emu run "
                         "--trace-out") from None
