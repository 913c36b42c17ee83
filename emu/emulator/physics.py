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
