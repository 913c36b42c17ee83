"""The analytic times emu's emulated network should reproduce (docs/physics.md).

For one collective of ``count`` elements with nothing else on the links, every
worker with an uplink and a downlink of bandwidth ``B`` and one-way latency ``L``
to a store-and-forward switch, and ``S`` the bytes on the wire (headers included):

- in-network aggregation: ``S / B + 2 L`` (each worker streams its contributions up
  while the results stream down; the INA window covers the bandwidth-delay product);
- ring all-reduce among ``M``: ``2 (M-1)/M x S / B + 2 (M-1)`` hops, each crossing two
  links (``2 L``) and one packet's store and forward at the switch.

``ina_detail_us`` adds what emu's protocol adds on top: the exponent round (one window
of header-only packets and a round trip; their results stream back under the data) and
the last packet's store and forward.

The forms of every collective kind (docs/physics.md, "Predictions"): the INA stream, and the
point-to-point algorithms of ``emu.emulator.algorithms.p2p`` (and of ``emu.emulator.algorithms.sparse_p2p`` for sparse
all_reduces) solved from their send orders and the links' FIFOs, segment by segment. Which form a
collective takes is its mechanism's business (``emu.emulator.mechanisms``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from emu.emulator.algorithms.p2p import SEG_ELEMENTS, segment_elements
from emu.emulator.algorithms.sparse_p2p import index_overhead, worker_fraction
from emu.emulator.links.spec import LinkSpec
from emu.emulator.protocol.sparse_ina import packet_union
from emu.emulator.protocol.wire import (
    FRAME_OVERHEAD,
    MTU,
    P2P_HEADER,
    agg_wire_bytes,
    p2p_packets,
    p2p_wire_bytes,
    sparse_wire_bytes,
)
from emu.traces.model import Sparsity


def ina_wire_bytes(count: int, elements: int = 64) -> float:
    packets = -(-count // elements)
    return packets * agg_wire_bytes(elements)


def ina_time_us(count: int, link: LinkSpec, elements: int = 64) -> float:
    return float(link.serialization_us(ina_wire_bytes(count, elements))) + 2 * link.latency_us


def ina_detail_us(count: int, link: LinkSpec, elements: int, slots: int) -> float:
    """The formula plus the exponent round and the final packet's store and forward."""
    packets = -(-count // elements)
    exp_packets = min(slots, packets)
    # the exponent batch goes up first; its results stream back while the data follows
    exp_round = float(link.serialization_us(exp_packets * agg_wire_bytes(0))) + 2 * link.latency_us
    return ina_time_us(count, link, elements) + exp_round + float(link.serialization_us(agg_wire_bytes(elements)))


def ina_reduce_scatter_us(count: int, workers: int, link: LinkSpec, elements: int, slots: int) -> float:
    """A reduce_scatter on the stream (emu.emulator.protocol.ina): every worker sends every block, as an
    all_reduce's uplink does (each shard's blocks apart: ``g`` shards of ``ceil(count / g / k)``),
    after the exponent round; each downlink carries its shard and the others' header-only
    completions, less. So the all_reduce's form over the shards' blocks."""
    shard = -(-count // workers)  # a count that does not divide: the last shards padded
    shard_packets = -(-shard // elements) if count else 0
    return ina_detail_us(workers * shard_packets * elements, link, elements, slots) if shard_packets else 0.0


def ina_all_gather_us(count: int, itemsize: int, workers: int, link: LinkSpec, elements: int) -> float:
    """An all_gather on the stream: no exponent round; each shard's ``e`` packets (4 bytes a lane)
    go up from its owner with every other worker's headers, and every downlink carries all ``g e``;
    the busier link (the downlink, but for a very small packet payload) sets the pace, plus the
    round trip's latency and the last packet's store and forward."""
    shard = -(-count // workers)
    e = -(-shard * itemsize // (4 * elements)) if count else 0
    if not e:
        return 0.0
    down = workers * e * agg_wire_bytes(elements)
    up = e * agg_wire_bytes(elements) + (workers - 1) * e * agg_wire_bytes(0)
    return (float(link.serialization_us(max(up, down))) + 2 * link.latency_us
            + float(link.serialization_us(agg_wire_bytes(elements))))


def pipeline_bound_us(count: int, link: LinkSpec, elements: int, slots: int, workers: int,
                      packet_rate: float) -> float:
    """A dense INA all_reduce bound by a switch whose pipeline takes ``packet_rate`` packets a second
    (docs/topology.md, "Switch limits"): every worker's ``min(S, D)`` exponent and ``D`` data
    packets through it one after another, plus a packet's round trip. Each packet costs the
    pipeline the same, header-only or not."""
    packets = -(-count // elements) if count else 0
    if not packets:
        return 0.0
    through = workers * (packets + min(slots, packets)) * 1e6 / packet_rate
    return through + 2 * (float(link.serialization_us(agg_wire_bytes(elements))) + link.latency_us)


def ina_pipeline_us(count: int, link: LinkSpec, elements: int, slots: int, workers: int,
                    packet_rate: float | None) -> float:
    """The link's form (without loss), or the pipeline's bound where it is slower."""
    linked = ina_detail_us(count, link, elements, slots) if count else 0.0
    return linked if packet_rate is None else max(linked, pipeline_bound_us(count, link, elements, slots, workers,
                                                                             packet_rate))


def sparse_ina_us(count: int, sparsity: Sparsity, link: LinkSpec, elements: int, slots: int) -> float:
    """The sparse stream (emu.emulator.protocol.sparse_ina): the announcement round (one header per slot up,
    its results back), then every worker's downlink carries the ``u n`` union blocks, 8 bytes more a
    packet; its uplink carries as many packets, the holders' with data, so the downlink sets the
    pace; and the last packet's store and forward."""
    packets = -(-count // elements)
    announce = min(slots, packets)
    first = float(link.serialization_us(announce * sparse_wire_bytes(0))) + 2 * link.latency_us
    union = packet_union(sparsity, elements) * packets
    return (first + float(link.serialization_us(union * sparse_wire_bytes(elements))) + 2 * link.latency_us
            + float(link.serialization_us(sparse_wire_bytes(elements))))


def ring_time_us(count: int, itemsize: int, workers: int, link: LinkSpec) -> float:
    if workers < 2:
        return 0.0
    chunk = count * itemsize / workers
    steps = 2 * (workers - 1)
    hop = 2 * link.latency_us + float(link.serialization_us(p2p_wire_bytes(min(chunk, MTU))))
    return steps * float(link.serialization_us(p2p_wire_bytes(chunk))) + steps * hop


def ring_messages(workers: int, segments_per_chunk: int = 1) -> int:
    """Messages a real ring all-reduce among ``workers`` sends, per collective."""
    return 2 * (workers - 1) * workers * segments_per_chunk


def ina_loss_extra_us(count: int, link: LinkSpec, workers: int, pool: int, rto_us: float,
                      elements: int = 64) -> float:
    """What loss adds, in expectation, to one in-network all_reduce: the lost packets' bytes sent
    again, and the tail (docs/physics.md, "Loss").

    Losses in mid-stream cost their timeout only while the link has nothing else to carry; in
    the stream's last pass of the pool nothing follows them, so the collective ends when the
    worst of the pool's last positions is through. A position is hit if any of the ``2N``
    link directions loses it (``q = 1 - (1-p)**2N``); each retry goes through with
    ``(1-p)**2``; with ``M`` the most timeouts any of the ``W`` positions needs,
    ``E[M] = sum_j 1 - (1 - q r**(j-1))**W`` (``r = 1 - (1-p)**2``). Exact as ``p -> 0``; a lower
    bound as losses become frequent enough to starve the link in mid-stream."""
    p = link.loss
    if p <= 0:
        return 0.0
    q = 1 - (1 - p) ** (2 * workers)
    r = 1 - (1 - p) ** 2
    packets = -(-count // elements)
    positions = min(pool, packets)
    expected_max, j = 0.0, 1
    while True:
        term = 1 - (1 - q * r ** (j - 1)) ** positions
        expected_max += term
        if term < 1e-9 or j > 1000:
            break
        j += 1
    resent = float(link.serialization_us(ina_wire_bytes(count, elements))) * p / (1 - p)
    return resent + rto_us * expected_max


# -- every collective on every software fabric (docs/physics.md, "Predictions") ------------------
#
# Point-to-point collectives move segments (emu.emulator.algorithms.p2p): a collective's tensor is cut into
# ``parts`` chunks and each chunk into ``g`` segments of at most SEG_ELEMENTS real elements (with
# payload scale R, ceil(count / R) real elements stand for ``count``), each segment ``w`` wire
# bytes in ``n`` packets. A segment leaves its uplink in ``s = w / B`` and reaches the other
# endpoint ``h = s / n + 2 L`` after it left (the switch forwards packet by packet: the last
# packet's store and forward, two latencies). The closed forms below solve the links' FIFO
# recurrences for the send orders of emu's algorithms, every worker starting at once.


def expected_rounds(packets: int, loss: float) -> float:
    """Expected resend rounds (each a timeout) until every one of ``packets`` got through a link
    that loses each with ``loss``: E[max of geometric tries - 1] = sum_j 1 - (1 - p**j)**n."""
    if loss <= 0:
        return 0.0
    total, j = 0.0, 1
    while True:
        term = 1 - (1 - loss**j) ** packets
        total += term
        if term < 1e-12 or j > 1000:
            return total
        j += 1


class _Segments:
    """The segments of one chunk of a point-to-point collective, and their times on a link."""

    def __init__(self, count: int, itemsize: int, parts: int, link: LinkSpec, rto_us: float,
                 payload_scale: int) -> None:
        real = -(-count // payload_scale) if count else 0
        real_chunk = -(-real // parts)  # the largest chunk (Layout.chunk_range)
        self.g = max(1, -(-real_chunk // segment_elements(real, count * itemsize)))
        payload = count * itemsize / parts / self.g
        self._times(payload, link, rto_us)

    @classmethod
    def of(cls, payload: float, g: int, link: LinkSpec, rto_us: float) -> _Segments:
        """``g`` segments of ``payload`` bytes each (the sparse algorithms' parts)."""
        seg = cls.__new__(cls)
        seg.g = g
        seg._times(payload, link, rto_us)
        return seg

    def _times(self, payload: float, link: LinkSpec, rto_us: float) -> None:
        self.n = p2p_packets(int(math.ceil(payload)))
        wire = payload + self.n * (FRAME_OVERHEAD + P2P_HEADER.itemsize)
        p = link.loss
        # loss: the resent packets' bytes take their share of the link (p / (1-p) more on average),
        # and the segment's last packet waits for its timeouts on both links (one chain's expectation)
        self.s = float(link.serialization_us(wire)) / (1 - p)
        self.h = (float(link.serialization_us(wire)) / self.n + 2 * link.latency_us
                  + 2 * rto_us * expected_rounds(self.n, p))


def ring_pipelined_us(count: int, itemsize: int, workers: int, link: LinkSpec, steps: int,
                      rto_us: float = 0.0, payload_scale: int = 1) -> float:
    """``steps`` ring steps (all_reduce 2(M-1), reduce_scatter and all_gather M-1) of chunks of
    ``count / M`` elements, each forwarded segment by segment as it arrives.

    Every uplink carries ``steps x g`` segments in step order; step k's segment i is ready ``h``
    after step k-1's segment i left the left neighbour. The last segment arrives at
    ``max(K g s + h, K (s + h) + (g-1) s)``: link-bound when ``h <= (g-1) s`` (the steps
    pipeline), else every step waits for its first segment."""
    if workers < 2:
        return 0.0
    seg = _Segments(count, itemsize, workers, link, rto_us, payload_scale)
    k, g, s, h = steps, seg.g, seg.s, seg.h
    return max(k * g * s + h, k * (s + h) + (g - 1) * s)


def tree_broadcast_us(count: int, itemsize: int, workers: int, link: LinkSpec, rto_us: float = 0.0,
                      payload_scale: int = 1) -> float:
    """Binomial-tree broadcast (p2p.BinomialBroadcast): the root sends each segment to its ``d = bit_length(M-1)``
    children in turn, so segments leave it every ``d s``; a node forwards each segment to its
    children (fewer than d) as it arrives. Worker ``v`` (relative to the root) is reached through
    its bits from the lowest up, one hop per bit, and is its parent's child number
    (next bit - this bit - 1): its last segment arrives at
    ``(g-1) d s + (hb(v) + 1) s + popcount(v) h``, hb the highest bit; the time is the largest over
    ``v < M`` (the candidates: M-1, and M-1 with one set bit cleared and all below it set)."""
    if workers < 2:
        return 0.0
    seg = _Segments(count, itemsize, 1, link, rto_us, payload_scale)
    top = workers - 1
    d = top.bit_length()
    candidates = [top] + [(top & ~(1 << b)) | ((1 << b) - 1) for b in range(d) if top >> b & 1]
    reach = max((v.bit_length()) * seg.s + bin(v).count("1") * seg.h for v in candidates if v > 0)
    return (seg.g - 1) * d * seg.s + reach


def all_to_all_us(count: int, itemsize: int, workers: int, link: LinkSpec, rto_us: float = 0.0,
                  payload_scale: int = 1) -> float:
    """Direct exchange (p2p.AllToAll): every worker sends chunk j to worker j, in order of j. Worker
    M-1 is everyone's last destination: all M-1 chunks reach its downlink at once, after the
    senders' other M-2 chunks: ``(M-2) g s + (M-1) g s + h``."""
    if workers < 2:
        return 0.0
    seg = _Segments(count, itemsize, workers, link, rto_us, payload_scale)
    return (2 * workers - 3) * seg.g * seg.s + seg.h


def uneven_all_to_all_us(sent: list[list[int]], itemsize: int, link: LinkSpec, rto_us: float = 0.0,
                         payload_scale: int = 1) -> float:
    """Direct exchange with per-peer sizes (p2p.UnevenAllToAll), every member starting at once: the
    last member's end (``uneven_all_to_all_ends``). With every message ``g`` segments of ``s`` this
    is ``all_to_all_us``: ``(2M-3) g s + h``."""
    return float(uneven_all_to_all_ends(sent, itemsize, link, rto_us, payload_scale).max(initial=0.0))


def uneven_all_to_all_ends(sent: list[list[int]], itemsize: int, link: LinkSpec, rto_us: float = 0.0,
                           payload_scale: int = 1, starts: Sequence[float] | None = None) -> np.ndarray:
    """Each member's end of a direct exchange with per-peer sizes, member i sending member j its
    ``sent[i][j]`` elements, a message in segments of its own, in order of j, from its own start
    (``starts``, us; all 0 by default). Member j's downlink takes what every sender's uplink
    delivers, first come first served (a fluid queue): it is done at ``max_s (s + what reaches it
    from s on)``, s over the times its messages start leaving their senders, after each sender's
    messages to the members before j. A member ends when its downlink, and its own uplink, are done,
    and a segment's flight ``h`` later; all 0 where nothing is sent."""
    m = len(sent)
    t = np.zeros((m, m))
    h = 0.0
    forms: dict[int, tuple[float, float]] = {}  # a message's g s and h, by its elements
    for i in range(m):
        for j in range(m):
            n = int(sent[i][j])
            if i != j and n:
                if n not in forms:
                    seg = _Segments(n, itemsize, 1, link, rto_us, payload_scale)
                    forms[n] = (seg.g * seg.s, seg.h)
                t[i, j], h = forms[n][0], max(h, forms[n][1])
    if h == 0.0:
        return np.zeros(m)
    begin = np.zeros(m) if starts is None else np.asarray(starts, np.float64)
    at = begin[:, None] + np.cumsum(t, axis=1) - t  # i's messages to the members before j after its start
    end = begin + t.sum(axis=1)  # each uplink
    for j in range(m):
        a, d = at[:, j][t[:, j] > 0], t[:, j][t[:, j] > 0]
        if len(a):  # from each start s on, what still reaches j: min(d, a + d - s), at least 0
            after = np.clip(np.minimum(d[None, :], (a + d)[None, :] - a[:, None]), 0.0, None).sum(axis=1)
            end[j] = max(end[j], float((a + after).max()))
    return end + h


def send_recv_us(count: int, itemsize: int, link: LinkSpec, rto_us: float = 0.0, payload_scale: int = 1) -> float:
    """One tensor from sender to receiver: ``g s + h`` (the sender is done when it starts)."""
    seg = _Segments(count, itemsize, 1, link, rto_us, payload_scale)
    return seg.g * seg.s + seg.h


def barrier_us(workers: int, link: LinkSpec, rto_us: float = 0.0) -> float:
    """Dissemination barrier (p2p.Barrier): ceil(log2 M) rounds of one header-only packet each."""
    rounds = max(0, (workers - 1).bit_length())
    seg = _Segments(0, 1, 1, link, rto_us, 1)
    return rounds * (seg.s + seg.h)


def ps_all_reduce_us(count: int, itemsize: int, workers: int, shards: int, link: LinkSpec,
                     rto_us: float = 0.0, payload_scale: int = 1) -> float:
    """Parameter server (p2p.PSClient, PSServer): every worker pushes chunk j of ``count / P`` to shard
    j, in order of j; shard j's downlink takes the M workers' copies of each segment (``M s``), the
    shard sums a segment once all M are in and sends it to the M workers in turn (``M s`` on its
    uplink). The last shard starts receiving ``(P-1) g s`` in, so the last worker has the last sum at
    ``(P-1) g s + M g s + M s + 2 h``: about 2 S/B with many segments per chunk, 3 S/B with one
    (each shard stores and forwards whole segments)."""
    seg = _Segments(count, itemsize, shards, link, rto_us, payload_scale)
    g, s, h = seg.g, seg.s, seg.h
    return (shards - 1) * g * s + workers * g * s + workers * s + 2 * h


def _sparse_parts(count: int, itemsize: int, blocks: float, sparsity: Sparsity, link: LinkSpec,
                  rto_us: float, payload_scale: int) -> _Segments:
    """The parts of a sparse block set (emu.emulator.algorithms.sparse_p2p) of ``blocks`` real blocks of ``K``:
    even parts of whole blocks, at most SEG_ELEMENTS values each; each block carries its 4-byte
    index, and each real block stands for ``R`` emulated ones."""
    k = sparsity.block_elements
    real = -(-count // payload_scale) if count else 0
    g = max(1, math.ceil(blocks / max(1, SEG_ELEMENTS // k)))
    # a block's emulated bytes, its index included (the tensor's last block may be short: K on average)
    block_bytes = count * itemsize / real * k * (1 + index_overhead(k, itemsize)) if real else 0.0
    return _Segments.of(blocks * block_bytes / g, g, link, rto_us)


def _real_blocks(count: int, k: int, payload_scale: int) -> int:
    real = -(-count // payload_scale) if count else 0
    return -(-real // k)


def sparse_ring_us(count: int, itemsize: int, workers: int, sparsity: Sparsity, link: LinkSpec,
                   rto_us: float = 0.0, payload_scale: int = 1) -> float:
    """Sparse all-gather on the ring (sparse_p2p.SparseRing): every worker's set of non-zero blocks,
    ``f S (1 + o)`` bytes in ``g`` parts, goes M-1 steps round the ring, each part forwarded as it
    arrives: the pipelined ring of ``K = M-1`` steps. The sets differ: a worker holds each of the
    ``u n`` union blocks with ``q = f/u`` (n blocks), so a set has ``f n`` blocks give or take
    ``sigma = sqrt(u n q (1-q))``, and the largest of M about ``f n + z_M sigma`` (z_M: the expected
    largest of M standard normals, Blom's approximation). A link carries every set but one (the
    mean's ``K g s`` and one largest set's ``g' s'``); a step waits for the largest set's parts:
    ``max((K-1) g s + g' s' + h', K (s' + h') + (g'-1) s')``."""
    if workers < 2:
        return 0.0
    n = _real_blocks(count, sparsity.block_elements, payload_scale)
    f = worker_fraction(sparsity, workers)
    q = min(1.0, f / sparsity.union) if sparsity.union > 0 else 1.0
    z = statistics.NormalDist().inv_cdf((workers - 0.375) / (workers + 0.25))
    mean = f * n
    hi = min(float(n), mean + z * math.sqrt(sparsity.union * n * q * (1 - q)))
    seg = _sparse_parts(count, itemsize, mean, sparsity, link, rto_us, payload_scale)
    big = _sparse_parts(count, itemsize, hi, sparsity, link, rto_us, payload_scale)
    k = workers - 1
    return max((k - 1) * seg.g * seg.s + big.g * big.s + big.h, k * (big.s + big.h) + (big.g - 1) * big.s)


def sparse_ps_us(count: int, itemsize: int, workers: int, shards: int, sparsity: Sparsity, link: LinkSpec,
                 rto_us: float = 0.0, payload_scale: int = 1) -> float:
    """Sparse parameter server (sparse_p2p.SparsePSClient, SparsePSServer): every worker pushes its
    non-zero blocks of shard j's range (``f S (1 + o) / P``, ``g_f`` parts of ``s_f``) in order of j,
    as the dense pushes go; a shard answers once every push is in (the union is known only then),
    with the union's blocks of its range (``u S (1 + o) / P``, ``g_u`` parts) to each worker in turn,
    shard j from worker j on (so that the shards' answers do not queue at one downlink):
    ``(P-1) g_f s_f + M g_f s_f + h_f + max(M, P) g_u s_u + h_u``."""
    m, p = workers, shards
    n = _real_blocks(count, sparsity.block_elements, payload_scale) / p  # a shard's range
    push = _sparse_parts(count, itemsize, worker_fraction(sparsity, m) * n, sparsity, link, rto_us,
                         payload_scale)
    pull = _sparse_parts(count, itemsize, sparsity.union * n, sparsity, link, rto_us, payload_scale)
    return ((p - 1) * push.g * push.s + m * push.g * push.s + push.h
            + max(m, p) * pull.g * pull.s + pull.h)
