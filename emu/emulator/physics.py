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
"""

from __future__ import annotations

from emu.emulator.links import LinkSpec
from emu.emulator.wire import MTU, agg_wire_bytes, p2p_wire_bytes


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
