"""The one definition of emu's packets: headers, sizes on the wire, the frame template.

An aggregation packet is Ethernet / IPv4 / UDP (destination port ``UDP_PORT``) /
``AGG_HEADER`` (16 bytes) / payload of ``k`` signed 32-bit integers, all big-endian.
A point-to-point packet (ring, parameter server, all fallbacks) carries
``P2P_HEADER`` (16 bytes) and elements of the collective's own dtype.

The layouts are numpy structured dtypes, so that the software switch, the fake
workers, the conformance vectors and the P4 program's header check (which parses
the ``.p4`` source and compares it with ``AGG_FIELDS``) share one definition.

Wire bytes count everything a link serializes: Ethernet header and FCS, the
preamble, start delimiter and inter-frame gap (20 bytes), IPv4, UDP, emu header
and payload. Every time formula in emu uses ``wire_bytes``.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np

from emu.errors import EmuError
from emu.traces.model import Dtype

UDP_PORT = 0xBEE0  # SwitchML's range is 0xBEE0-0xBEEF
ETH_HEADER = 14
ETH_FCS = 4
ETH_L1 = 20  # preamble 7 + start delimiter 1 + inter-frame gap 12
IPV4_HEADER = 20
UDP_HEADER = 8
MTU = 1500  # bytes of IP packet, the Ethernet default
ELEMENTS_DEFAULT = 64  # int32 per aggregation packet (256 B): one pipeline pass
ELEMENTS_ALLOWED = (64, 256)  # 256 needs recirculation on a real switch
MAX_WORKERS_SOFTWARE = 65535  # worker ids are 16 bits


class MsgType(IntEnum):
    """The first byte of both headers."""

    CONTRIB = 1  # a worker's contribution to a slot (no payload: exponents only)
    RESULT = 2  # the switch's aggregate for a slot, to one worker
    P2P = 3  # point-to-point data (ring, parameter server, fallbacks)
    SPARSE_CONTRIB = 4  # a worker's round of the sparse stream: its block (or none) and its next one
    SPARSE_RESULT = 5  # the switch's sum of a sparse round, with the next block any worker holds
    # a reduce_scatter round's completion, header only, for every worker of the pool but ``worker``
    # (the owner of the round's shard, which gets the RESULT with the sum)
    SCATTER_DONE = 6
    # a bridge's barrier to an external switch (emu.p4.bridge): the P4 program sends it back on every
    # port as FLUSHED, after everything it processed before it, and touches no state; no worker sends it
    FLUSH = 7
    FLUSHED = 8


FLAG_COPY = 0x01  # which of the slot's two copies
# The kind of a round (docs/protocol.md, "Reduce-scatter and all-gather"): an all_reduce's round has
# neither; a reduce_scatter's sums every worker's block and sends the sum to its shard's owner
# alone, a completion to the rest; an all_gather's carries the owner's block only (the others send
# headers) and multicasts it. FLAG_OWNER marks the packet of the worker whose shard the round is.
FLAG_SCATTER = 0x02
FLAG_GATHER = 0x04
FLAG_OWNER = 0x08


class MalformedPacket(EmuError, ValueError):
    """Bytes off a port that are not a well-formed emu packet.

    A ValueError too, so that receivers that drop what they cannot parse (the
    BMv2 bridge) keep doing so; an EmuError, so that nothing from the wire reaches
    a user as a bare exception.
    """


# (name, numpy type, bits): the order and widths the P4 header must match.
AGG_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("msg_type", ">u1", 8),
    ("flags", ">u1", 8),  # bit 0: slot copy; bits 1-3: FLAG_SCATTER, FLAG_GATHER, FLAG_OWNER
    ("job", ">u2", 16),
    ("worker", ">u2", 16),  # contributor (CONTRIB) or destination (RESULT)
    ("num_workers", ">u2", 16),
    ("slot", ">u2", 16),
    ("exponent", ">i1", 8),  # CONTRIB: exponent to agree on; RESULT: the agreed maximum
    ("size", ">u1", 8),  # payload elements / 64 (0: exponents only)
    ("chunk", ">u4", 32),  # the chunk's number in the worker's stream
)
AGG_HEADER = np.dtype([(name, typ) for name, typ, _ in AGG_FIELDS])

# The sparse stream's header (docs/sparse.md, docs/protocol.md): the aggregation header, then
# the block this round sums and the sender's next non-zero block of the slot's partition (a
# result: the minimum over the workers). BLOCK_NONE: no block (an announcement; the end).
SPARSE_FIELDS: tuple[tuple[str, str, int], ...] = AGG_FIELDS + (
    ("block", ">u4", 32),
    ("next", ">u4", 32),
)
SPARSE_HEADER = np.dtype([(name, typ) for name, typ, _ in SPARSE_FIELDS])
SPARSE_EXTRA = SPARSE_HEADER.itemsize - AGG_HEADER.itemsize  # 8 bytes more than a dense packet
BLOCK_NONE = 0xFFFFFFFF

P2P_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("msg_type", ">u1", 8),
    ("dtype", ">u1", 8),  # index into DTYPE_CODES
    ("job", ">u2", 16),
    ("src", ">u2", 16),
    ("dst", ">u2", 16),
    ("seq", ">u4", 32),  # the collective's number in the job's stream
    ("segment", ">u4", 32),  # the segment's number in the collective's layout
)
P2P_HEADER = np.dtype([(name, typ) for name, typ, _ in P2P_FIELDS])
assert AGG_HEADER.itemsize == 16 and P2P_HEADER.itemsize == 16 and SPARSE_HEADER.itemsize == 24

PAYLOAD = np.dtype(">i4")  # aggregation payload elements on the wire
# a segment's dtype on the wire: its index here (the order of emu.traces.model.Dtype, fixed)
DTYPE_CODES = tuple(d.value for d in Dtype)

FRAME_OVERHEAD = ETH_L1 + ETH_HEADER + ETH_FCS + IPV4_HEADER + UDP_HEADER  # 66 bytes


def agg_wire_bytes(elements: int) -> int:
    """Bytes one aggregation packet of ``elements`` int32 occupies on a link."""
    return FRAME_OVERHEAD + AGG_HEADER.itemsize + 4 * elements


def sparse_wire_bytes(elements: int) -> int:
    """Bytes one packet of the sparse stream (``elements`` int32, 0 for a header alone) occupies."""
    return agg_wire_bytes(elements) + SPARSE_EXTRA


MIN_WIRE_BYTES = FRAME_OVERHEAD + 16  # the smallest packet emu sends: a header without payload

P2P_PAYLOAD_MAX = MTU - IPV4_HEADER - UDP_HEADER - P2P_HEADER.itemsize  # 1456 bytes


def p2p_packets(payload_bytes: int) -> int:
    """Packets a point-to-point segment of ``payload_bytes`` needs (at least one)."""
    return max(1, -(-payload_bytes // P2P_PAYLOAD_MAX))


def p2p_wire_bytes(payload_bytes: int) -> int:
    """Bytes a point-to-point segment occupies on a link, headers of every packet included."""
    return payload_bytes + p2p_packets(payload_bytes) * (FRAME_OVERHEAD + P2P_HEADER.itemsize)


# The Ethernet / IPv4 / UDP part of a frame is a fixed template (docs/design.md): emu's
# addresses, TTL 64, UDP checksum 0 (allowed over IPv4). Only the lengths and the
# IPv4 checksum follow from the payload.
ETH_DST = bytes.fromhex("02e0e0000001")
ETH_SRC = bytes.fromhex("02e0e0000002")
IP_SRC = bytes([10, 224, 0, 2])
IP_DST = bytes([10, 224, 0, 1])


def _ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def frame(emu_packet: bytes) -> bytes:
    """Wrap an emu header + payload into Ethernet / IPv4 / UDP (no FCS)."""
    udp_len = UDP_HEADER + len(emu_packet)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, IPV4_HEADER + udp_len, 0, 0x4000, 64, 17, 0,
                     IP_SRC, IP_DST)
    ip = ip[:10] + struct.pack("!H", _ipv4_checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", UDP_PORT, UDP_PORT, udp_len, 0)
    return ETH_DST + ETH_SRC + b"\x08\x00" + ip + udp + emu_packet


def unframe(data: bytes) -> bytes:
    """The emu header + payload of a frame made by ``frame`` (checks the template).

    The UDP length, not the frame's, ends the packet: Ethernet pads frames shorter
    than 60 bytes (an exponent-only packet is 58), and the padding is not payload.
    """
    if len(data) < ETH_HEADER + IPV4_HEADER + UDP_HEADER + 16 or data[12:14] != b"\x08\x00":
        raise MalformedPacket("not an IPv4 Ethernet frame of emu")
    ip = data[ETH_HEADER:ETH_HEADER + IPV4_HEADER]
    if ip[0] != 0x45 or ip[9] != 17:
        raise MalformedPacket("not an IPv4 UDP packet without options (emu's template)")
    udp = data[ETH_HEADER + IPV4_HEADER:]
    port, length = struct.unpack("!HH", udp[2:6])
    if port != UDP_PORT:
        raise MalformedPacket("not emu's UDP port")
    if not UDP_HEADER + 16 <= length <= len(udp):
        raise MalformedPacket(f"UDP length {length} does not fit the {len(udp)} bytes received")
    return udp[UDP_HEADER:length]


def _pack(layout: np.dtype, header: np.void | dict, payload: np.ndarray | None) -> bytes:
    rec = np.zeros(1, layout)
    for name in layout.names or ():
        rec[name] = header[name]
    body = b"" if payload is None else np.asarray(payload, dtype=PAYLOAD).tobytes()
    return rec.tobytes() + body


def _unpack(layout: np.dtype, types: tuple[MsgType, ...], header_name: str, packet_name: str,
            data: bytes) -> tuple[np.void, np.ndarray]:
    n = layout.itemsize
    if len(data) < n:
        raise MalformedPacket(f"{len(data)} bytes, shorter than the {n}-byte {header_name}")
    header = np.frombuffer(data[:n], layout)[0]
    if int(header["msg_type"]) not in types:
        raise MalformedPacket(f"message type {int(header['msg_type'])} is not {packet_name}'s")
    if (len(data) - n) % PAYLOAD.itemsize:
        raise MalformedPacket(f"payload of {len(data) - n} bytes is not whole int32 elements")
    payload = np.frombuffer(data[n:], PAYLOAD).astype(np.int32)
    if len(payload) != 64 * int(header["size"]):
        raise MalformedPacket(f"payload of {len(payload)} elements, header says {64 * int(header['size'])}")
    return header, payload


def agg_packet(header: np.void | dict, payload: np.ndarray | None = None) -> bytes:
    """One aggregation packet (emu header + payload) as bytes."""
    return _pack(AGG_HEADER, header, payload)


def parse_agg_packet(data: bytes) -> tuple[np.void, np.ndarray]:
    """Header and payload (native int32) of one aggregation packet.

    Raises MalformedPacket for what no emu sender makes: fewer than 16 bytes, a
    type other than CONTRIB, RESULT or SCATTER_DONE, a payload that is not whole int32 or not
    the ``64 * size`` elements the header says. Ranges (worker, slot, job) depend
    on the pool and are the switch's to check.
    """
    return _unpack(AGG_HEADER, (MsgType.CONTRIB, MsgType.RESULT, MsgType.SCATTER_DONE), "header",
                   "an aggregation packet", data)


def sparse_packet(header: np.void | dict, payload: np.ndarray | None = None) -> bytes:
    """One packet of the sparse stream (24-byte header + payload) as bytes."""
    return _pack(SPARSE_HEADER, header, payload)


def parse_sparse_packet(data: bytes) -> tuple[np.void, np.ndarray]:
    """Header (``SPARSE_HEADER``) and payload of one packet of the sparse stream; MalformedPacket
    for a type other than SPARSE_CONTRIB or SPARSE_RESULT or a payload that is not ``64 * size``
    int32."""
    return _unpack(SPARSE_HEADER, (MsgType.SPARSE_CONTRIB, MsgType.SPARSE_RESULT), "sparse header",
                   "a sparse packet", data)


def parse_packet(data: bytes) -> tuple[np.void, np.ndarray, tuple[int, int] | None]:
    """Any aggregation packet: header (its 16 aggregation bytes), payload, and for the sparse
    stream its (block, next)."""
    if len(data) >= 1 and data[0] in (MsgType.SPARSE_CONTRIB, MsgType.SPARSE_RESULT):
        h, p = parse_sparse_packet(data)
        agg = np.zeros(1, AGG_HEADER)[0]
        for name in AGG_HEADER.names:
            agg[name] = h[name]
        return agg, p, (int(h["block"]), int(h["next"]))
    h, p = parse_agg_packet(data)
    return h, p, None
