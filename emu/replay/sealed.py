"""Authenticated sockets for replays spread over several machines (docs/multi-host.md).

On one machine the replay's processes talk over ipc:// sockets in a private folder, which only
their user can open. Across machines they talk over TCP, where anyone who can reach the port can
send, so every message carries a tag: a keyed BLAKE2b (a MAC, RFC 7693 section 2.9) of its frames
under the run's shared secret, as a last frame. A message whose tag is missing or wrong is dropped
and counted (the report's ``emulator.rejected_messages``), never parsed; one that authenticates
and is malformed came from a holder of the key, a bug, and still stops the run (FrameError).

``SealedSocket`` is a ``zmq.Socket``, so pollers and identity checks treat it as any socket: its
``send*`` add the tag and its ``recv*`` check it, raising ``Rejected`` (a ``zmq.Again``) for a
message that fails: a non-blocking reader stops draining as it would on an empty queue, and a
reader that polled first skips it (``except Rejected``). A ROUTER's first frame, the peer's
identity, is the socket's own and not covered.

What a tag does not stop, documented rather than hidden: a recorded message sent again within
the same run (its window numbers make most such copies fail a later check, not all).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import zmq

from emu.emulator.transport import MAX_FRAME

TAG_BYTES = 16
MAX_TCP_MESSAGE = MAX_FRAME  # zmq disconnects a peer that sends a larger frame (ZMQ_MAXMSGSIZE)


class Rejected(zmq.Again):
    """A message failed authentication: dropped (and counted by its socket)."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why

    def __str__(self) -> str:
        return self.why


def tag(key: bytes, frames: list[Any]) -> bytes:
    """The MAC of ``frames``: each frame's length, then its bytes, so frames cannot be re-cut."""
    mac = hashlib.blake2b(key=key, digest_size=TAG_BYTES, person=b"emu-frames")
    for f in frames:
        view = memoryview(f.buffer if isinstance(f, zmq.Frame) else f).cast("B")
        mac.update(len(view).to_bytes(8, "little"))
        mac.update(view)
    return mac.digest()


class SealedSocket(zmq.Socket):
    key: bytes = b""
    routed: bool = False  # a ROUTER: the first frame is a peer's identity
    rejected: int = 0

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kw: Any) -> Any:
        return self.send_multipart([data], flags, copy=copy, track=track)

    def send_multipart(self, msg_parts: Any, flags: int = 0, copy: bool = True, track: bool = False,
                       **kw: Any) -> Any:
        parts = list(msg_parts)
        covered = parts[1:] if self.routed else parts
        # zmq.Socket's own send_multipart calls self.send: frame by frame here instead
        for part in parts:
            zmq.Socket.send(self, part, flags | zmq.SNDMORE, copy=copy, track=track)
        return zmq.Socket.send(self, tag(self.key, covered), flags, copy=True, track=track)

    def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> Any:
        parts = self.recv_multipart(flags, copy=copy, track=track)
        if len(parts) != 1:
            self.rejected += 1
            raise Rejected(f"a message of {len(parts)} frames where one was expected")
        return parts[0]

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False) -> list[Any]:
        parts = [zmq.Socket.recv(self, flags, copy=copy, track=track)]
        while self.getsockopt(zmq.RCVMORE):  # the rest of a message arrives with its first frame
            parts.append(zmq.Socket.recv(self, 0, copy=copy, track=track))
        head = 1 if self.routed else 0
        if len(parts) < head + 2:  # at least one frame and the tag
            self.rejected += 1
            raise Rejected("a message without a tag")
        body, got = parts[:-1], parts[-1]
        got_bytes = got.bytes if isinstance(got, zmq.Frame) else got
        if not hmac.compare_digest(tag(self.key, body[head:]), got_bytes):
            self.rejected += 1
            raise Rejected("a message whose tag does not match")
        return body


def make(ctx: zmq.Context, kind: int, key: bytes | None) -> zmq.Socket:
    """A socket of ``kind``: sealed under ``key`` (bounded in message size), or plain without one."""
    if key is None:
        return ctx.socket(kind)
    sock = ctx.socket(kind, socket_class=SealedSocket)
    sock.key = key
    sock.routed = kind == zmq.ROUTER
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_TCP_MESSAGE)
    return sock


def rejected(*socks: zmq.Socket | None) -> int:
    """Messages these sockets dropped (plain sockets drop none)."""
    return sum(getattr(s, "rejected", 0) for s in socks if s is not None)


__all__ = ["Rejected", "SealedSocket", "make", "rejected", "tag"]
