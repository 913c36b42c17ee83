"""The payload scale (``--payload-scale auto``) and the sizes emu refuses to replay for real.

R packets on the emulated wire per packet really sent (docs/design.md, "Payload scaling"): the
smallest power of two that keeps the workers' real bytes of an iteration within budget, no coarser
than a sparse parameter server's shards allow.
"""

from __future__ import annotations

from emu.emulator.algorithms.sparse_p2p import ps_sparse
from emu.emulator.fabric import available_memory_bytes
from emu.emulator.physics import forms as physics
from emu.errors import ConfigError
from emu.replay.config.options import REAL_BYTES_PER_ITERATION, ReplayConfig
from emu.replay.plan.sparsity import with_sparsity
from emu.traces.model import Trace


def scale_for(real_bytes: float) -> int:
    """The smallest power of two R that brings ``real_bytes`` within REAL_BYTES_PER_ITERATION."""
    r = 1
    while real_bytes / r > REAL_BYTES_PER_ITERATION:
        r *= 2
    return r


def choose_payload_scale(trace: Trace, config: ReplayConfig) -> int:
    """The smallest power of two R that keeps the real bytes of an iteration within budget, and no
    coarser than a sparse parameter server's shards allow (``sparse_ps_scale_limit``)."""
    per_worker = max(sum(op.bytes for op in it.colls) for r in trace.ranks for it in r.iterations)
    r = scale_for(per_worker * config.workers)
    limit = sparse_ps_scale_limit(trace, config)
    return r if limit is None else min(r, power_of_two_below(limit))


# A sparse push lands whole real blocks on the shards: with few of them per shard (each standing
# for R emulated blocks) the load of the busiest shard is a coarse draw, and times grow with R
# (dlrm at 128 workers, 10 Gb/s: 48 ms at R = 64, 26 ms at R = 2; docs/sparse.md). This many real
# blocks per shard keep the load within a few percent of its expectation.
MIN_SPARSE_BLOCKS_PER_SHARD = 32


def sparse_ps_scale_limit(trace: Trace, config: ReplayConfig) -> int | None:
    """The largest R at which the largest sparse parameter-server all_reduce still gives every shard
    ``MIN_SPARSE_BLOCKS_PER_SHARD`` real blocks (at least 1), or None where nothing runs sparse there."""
    if not config.network.parameter_server:
        return None
    largest = None
    for rank in with_sparsity(trace, config.workers, config.sparsity):
        for it in rank.iterations:
            for op in it.colls:
                if op.sparsity is not None and ps_sparse(op.sparsity, config.workers, op.dtype.itemsize) \
                        and (largest is None or op.count > largest.count):
                    largest = op
    if largest is None or largest.sparsity is None:
        return None
    blocks = largest.count / largest.sparsity.block_elements
    return max(1, int(blocks / (config.shards * MIN_SPARSE_BLOCKS_PER_SHARD)))


def check_scale(trace: Trace, config: ReplayConfig) -> None:
    """A real ring or parameter server whose segments would not fit in this machine's free
    memory: refuse it and give the analytic estimate instead (``Fabric.beyond_p2p_limit``)."""
    network = config.network
    if not network.beyond_p2p_limit(config.workers, config.shards):
        return
    largest = max((op for r in trace.ranks for it in r.iterations for op in it.colls), key=lambda op: op.bytes)
    estimate = physics.ring_time_us(largest.count, largest.dtype.itemsize, config.workers, config.link)
    need = network.p2p_peak_bytes(config.workers, config.shards)
    shards = f" and {config.shards} shards" if network.parameter_server else ""
    raise ConfigError(
        f"--fabric {config.fabric} --workers {config.workers}: a real {config.fabric} of {config.workers} workers"
        f"{shards} needs about {need / 1e9:.1f} GB, more than half of the {available_memory_bytes() / 1e9:.1f} GB "
        f"this machine has free, so emu does not replay it; the analytic estimate for the largest collective "
        f"({largest.bytes / 1e6:.1f} MB) on a ring is {estimate / 1000:.2f} ms (docs/physics.md); use --fabric ina, "
        f"fewer workers{' or --ps-shards' if network.parameter_server else ''}, or a machine with more memory")


def power_of_two_below(n: int) -> int:
    r = 1
    while r * 2 <= n:
        r *= 2
    return r
