"""Authenticated sockets for replays spread over several machines (docs/multi-host.md).

On one machine the replay's processes talk over ipc:// sockets in a private folder, which only
their user can open. Across machines they talk over TCP, where anyone who can reach a port can
send, so every message carries two more frames: a sequence number and a tag, a keyed BLAKE2b (a
MAC, RFC 7693) of the message under a key of the run and the channel (data or control), over the
direction, the DEALER side's identity, the sequence number and every frame with its length. A
message whose tag is missing or wrong, or whose number is not above the last one from its peer,
is dropped and counted (the report's ``emulator.rejected_messages``), never parsed; one that
authenticates and is malformed came from a holder of the key, a bug, and still stops the run.

So a message recorded on the wire cannot be sent again: not later in its run (its number is
spent), not in another run (another key), not on the other channel, not back to its sender (the
direction), not under another identity.

``SealedSocket`` is a ``zmq.Socket``, so pollers and identity checks treat it as any socket: its
``send*`` seal and its ``recv*`` check, raising ``Rejected`` (a ``zmq.Again``) for a message that
fails: a non-blocking reader stops draining as on an empty queue, a reader that polled first
skips it (``except Rejected``). A ROUTER's first frame, the peer's identity, is the socket's own.

Every socket ``make`` returns, sealed or plain, is a ``FrameSocket``: its multipart messages go
frame by frame to pyzmq's backend with plain integer flags. pyzmq's own ``send_multipart`` and
``recv_multipart`` pass each frame through its Python ``send``, ``recv`` and ``getsockopt``, whose
flags are enums: a window's message of seven small frames cost 14 to 21 us to send and 15 to 22
us to receive that way, 2.4 to 3.7 and 9 us this way (a loop of 20,000 over ipc, this machine),
and the synchronized clock sends four such messages a window.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import zmq
from zmq.backend import Socket as _Backend  # the compiled socket under pyzmq's Python one

from emu.emulator.protocol.transport import MAX_FRAME, FrameError

TAG_BYTES = 16
_MORE = int(zmq.SNDMORE)
MAX_TCP_MESSAGE = MAX_FRAME  # zmq disconnects a peer that sends a larger frame (ZMQ_MAXMSGSIZE)
_TO_ROUTER, _TO_DEALER = b">", b"<"


class Rejected(zmq.Again):
    """A message failed authentication: dropped (and counted by its socket)."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why

    def __str__(self) -> str:
        return self.why


def derive(key: bytes, label: str) -> bytes:
    """A key of its own for ``label`` (a run's nonce, a channel), from ``key``."""
    return hashlib.blake2b(label.encode(), key=key, digest_size=32, person=b"emu-derive").digest()


def tag(key: bytes, head: bytes, frames: list[Any]) -> bytes:
    """The MAC of ``head`` (direction, identity, number) and ``frames``: each frame's length, then
    its bytes, so frames cannot be re-cut."""
    mac = hashlib.blake2b(key=key, digest_size=TAG_BYTES, person=b"emu-frames")
    mac.update(len(head).to_bytes(8, "little"))
    mac.update(head)
    for f in frames:
        view = memoryview(f.buffer if isinstance(f, zmq.Frame) else f).cast("B")
        mac.update(len(view).to_bytes(8, "little"))
        mac.update(view)
    return mac.digest()


def _head(direction: bytes, identity: bytes, seq: bytes) -> bytes:
    return direction + len(identity).to_bytes(2, "little") + identity + seq


class FrameSocket(zmq.Socket):
    """A ``zmq.Socket`` whose ``send_multipart`` and ``recv_multipart`` skip pyzmq's per-frame Python
    layer (the module's docstring): the same messages, flags, copies (below the socket's copy
    threshold a frame is copied even with ``copy=False``, as pyzmq does) and errors."""

    def send_multipart(self, msg_parts: Any, flags: int = 0, copy: bool = True, track: bool = False,
                       **kw: Any) -> Any:
        parts = list(msg_parts)
        flags = int(flags)
        for part in parts[:-1]:
            _Backend.send(self, part, flags | _MORE, copy=copy, track=track)
        return _Backend.send(self, parts[-1], flags, copy=copy, track=track)

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False) -> list[Any]:
        first = _Backend.recv(self, int(flags), copy=False, track=track)
        frames = [first]
        while frames[-1].more:  # the rest of a message arrives with its first frame
            frames.append(_Backend.recv(self, 0, copy=False, track=track))
        return frames if not copy else [f.bytes for f in frames]


class SealedSocket(FrameSocket):
    key: bytes = b""
    identity: bytes = b""  # a DEALER's own (its messages' and its peer's replies' MACs name it)
    routed: bool = False  # a ROUTER: the first frame is a peer's identity
    rejected: int = 0
    _sent: Any = None  # next number to send (a ROUTER: per peer)
    _seen: Any = None  # the last number received (a ROUTER: per peer)

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kw: Any) -> Any:
        return self.send_multipart([data], flags, copy=copy, track=track)

    def send_multipart(self, msg_parts: Any, flags: int = 0, copy: bool = True, track: bool = False,
                       **kw: Any) -> Any:
        parts = list(msg_parts)
        if self.routed:
            peer = bytes(parts[0])
            n = self._sent.get(peer, 0)
            self._sent[peer] = n + 1
            seq = n.to_bytes(8, "little")
            mac = tag(self.key, _head(_TO_DEALER, peer, seq), parts[1:])
        else:
            seq = self._sent.to_bytes(8, "little")
            self._sent += 1
            mac = tag(self.key, _head(_TO_ROUTER, self.identity, seq), parts)
        # zmq.Socket's own send_multipart calls self.send, which is sealed: frames and seal at once here
        return FrameSocket.send_multipart(self, [*parts, seq, mac], flags, copy=copy, track=track)

    def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> Any:
        parts = self.recv_multipart(flags, copy=copy, track=track)
        if len(parts) != 1:  # authentic, so a holder of the key's bug: stops the run
            raise FrameError(f"an authenticated message of {len(parts)} frames where one was expected")
        return parts[0]

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False) -> list[Any]:
        parts = FrameSocket.recv_multipart(self, flags, copy=copy, track=track)
        head = 1 if self.routed else 0
        if len(parts) < head + 3:  # at least one frame, the number and the tag
            return self._reject("a message without a number and a tag")
        raw = [p.bytes if isinstance(p, zmq.Frame) else p for p in parts[-2:]]
        seq, got = raw
        if len(seq) != 8 or len(got) != TAG_BYTES:
            return self._reject("a message whose number or tag has the wrong size")
        if self.routed:
            peer = bytes(parts[0])
            expected = tag(self.key, _head(_TO_ROUTER, peer, seq), parts[1:-2])
        else:
            peer = b""
            expected = tag(self.key, _head(_TO_DEALER, self.identity, seq), parts[:-2])
        if not hmac.compare_digest(expected, got):
            return self._reject("a message whose tag does not match")
        n = int.from_bytes(seq, "little")
        last = self._seen.get(peer, -1)
        if n <= last:
            return self._reject(f"message number {n} from {peer.decode(errors='replace') or 'the peer'} again")
        self._seen[peer] = n
        return parts[:-2]

    def _reject(self, why: str) -> list[Any]:
        self.rejected += 1
        raise Rejected(why)


def make(ctx: zmq.Context, kind: int, key: bytes | None, channel: str = "data",
         identity: bytes | None = None) -> zmq.Socket:
    """A socket of ``kind``: sealed under ``key`` and ``channel`` (bounded in message size), or
    plain without a key. ``identity``: a DEALER's (required when sealed)."""
    if key is None:
        sock = ctx.socket(kind, socket_class=FrameSocket)
    else:
        sock = ctx.socket(kind, socket_class=SealedSocket)
        sock.key = derive(key, channel)
        sock.routed = kind == zmq.ROUTER
        sock._sent = {} if sock.routed else 0
        sock._seen = {}
        if not sock.routed:
            if identity is None:
                raise ValueError("a sealed DEALER needs its identity")
            sock.identity = identity
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_TCP_MESSAGE)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    return sock


def rejected(*socks: zmq.Socket | None) -> int:
    """Messages these sockets dropped (plain sockets drop none)."""
    return sum(getattr(s, "rejected", 0) for s in socks if s is not None)


__all__ = ["FrameSocket", "Rejected", "SealedSocket", "derive", "make", "rejected", "tag"]
