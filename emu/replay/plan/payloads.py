"""Whether a replay's workers send the real ranks' tensors (``emu run``; docs/run.md), checked
against the trace they were recorded with before any process starts."""

from __future__ import annotations

import numpy as np

from emu.emulator.mechanisms import choose
from emu.emulator.payload.recorded import RecordedPayload, checkable
from emu.errors import ConfigError
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.compressed_payload import RealError, compressed_payload
from emu.traces.model import Coll, CollKind, Trace


def recorded_payload(trace: Trace, config: ReplayConfig, payload: RecordedPayload | None,
                     path: str) -> tuple[RecordedPayload | None, str | None, RealError | None]:
    """``payload`` where the replay can send it, or None and why not (a note for the report);
    under ``--compress``, the real ranks' messages in place of their compressed tensors and the
    error of what they aggregate to (``plan.compressed_payload``); a ConfigError where it does not
    belong to ``trace`` or holds too few elements at the replay's payload scale (``config.scale``)."""
    if payload is None:
        return None, None, None
    if config.sparsity.source == "option":
        return None, ("--sparsity draws which blocks each worker holds: the workers sent generated sparse "
                      "payload, not the real ranks' tensors"), None
    ran = _ran(trace, config)
    checked, note = _checked(trace, config, payload, path, ran if config.compress.active else None)
    if checked is None:
        return None, note, None
    counts = [op.count for op in ran]
    if not config.compress.active:
        return checked.padded([-(-n // config.scale) for n in counts]), note, None
    real, error, why = compressed_payload(trace, config, checked)
    if real is None:
        return None, (f"--compress {config.compress.label}: {why}, so the workers sent generated payload of the "
                      "compressed sizes, not the real ranks' messages"), None
    return real.trimmed(counts, config.scale).padded([-(-n // config.scale) for n in counts]), None, error


def _ran(trace: Trace, config: ReplayConfig) -> list[Coll]:
    """Worker 0's collectives as the replay runs them: compressed (under ``--compress``), and
    all_gathers and reduce_scatters padded to whole shards (``plan.programs``)."""
    from emu.replay.plan.programs import programs_for

    return [op for it in programs_for(trace, config, first=1)[0].iterations for op in it.colls]


def _checked(trace: Trace, config: ReplayConfig, payload: RecordedPayload, path: str,
             ran: list[Coll] | None) -> tuple[RecordedPayload | None, str | None]:
    """``payload`` checked against ``trace`` (ConfigError where it does not belong to it), or None
    and why the replay cannot send it; ``ran``: the collectives as a compressed replay runs them."""
    k = payload.real_ranks
    if k != len(trace.ranks):
        raise ConfigError(f"{path}: holds {k} real ranks' tensors; the trace has {len(trace.ranks)} ranks: give "
                          "the payload written with this trace")
    if config.workers % k:
        raise ConfigError(f"--workers {config.workers}: the payload's {k} real ranks stand for the same number of "
                          f"workers each; give a multiple of {k}, or replay without --payload")
    colls = [op for it in trace.ranks[0].iterations for op in it.colls]
    if payload.iterations != trace.iterations or len(payload.tensors) != len(colls):
        raise ConfigError(f"{path}: holds {payload.iterations} iterations of {payload.per_iteration} collectives; "
                          f"the trace has {trace.iterations} of {len(colls) // max(1, trace.iterations)}: give the "
                          "payload written with this trace")
    if any(op.kind == CollKind.ALL_TO_ALL for op in colls):
        return None, ("the real ranks' all_to_alls are not recorded (each worker's pieces go to different peers): "
                      "the workers sent generated payload, every piece checked")
    r = config.scale
    for i, op in enumerate(colls):
        if (op.kind in _UNRECORDED) != (payload.tensors[i] is None) or op.dtype.value != payload.dtypes[i]:
            raise ConfigError(f"{path}: entry {i} is not collective {op.id} of the trace ({op.kind.value} of "
                              f"{op.dtype.value}): give the payload written with this trace")
        need = -(-op.count // r) if op.kind not in _UNRECORDED else 0
        if payload.kept(i) < need:
            kept = payload.kept(i)
            least = -(-op.count // max(1, kept))
            raise ConfigError(f"{path}: collective {op.id} has {kept:,} of its {op.count:,} elements recorded, and "
                              f"payload scale {r} sends {need:,}: replay with --payload-scale {_pow2_at_least(least)} "
                              "or more")
    bad = next((i for i, t in enumerate(payload.tensors)
                if t is not None and t.dtype.kind == "f" and not np.isfinite(t).all()), None)
    if bad is not None:  # inf and NaN have no fixed point, and NaN equals nothing: nothing to check
        return None, (f"the real ranks' tensors hold inf or NaN (collective {colls[bad].id}, as after an overflow): "
                      "the workers sent generated payload, whose every sum can be checked")
    # sums formed point to point (the switch's are exact integers; copies are compared exactly),
    # of the collectives as they run (compressed: fp16's float16 values, randomk's)
    summed = [op for op in (ran or colls) if op.kind in (CollKind.REDUCE_SCATTER, CollKind.ALL_REDUCE)
              and not choose(op, config.setting).stream]
    loose = sorted({op.dtype.value for op in summed if not checkable(op.dtype.value, config.workers)})
    if loose:
        return None, (f"point to point, a sum of {config.workers} workers' {', '.join(loose)} values may round by more "
                      "than one worker's contribution, so checking it would prove nothing: the workers sent generated "
                      "payload, whose every sum is exact")
    return payload, None


_UNRECORDED = (CollKind.BARRIER, CollKind.ALL_TO_ALL)  # collectives whose tensors emu run does not keep


def _pow2_at_least(n: int) -> int:
    r = 1
    while r < n:
        r *= 2
    return r
