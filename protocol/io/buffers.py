"""Buffers written as they are, never joined: what a partial scatter-gather send leaves to send,
and the WebSocket mask key as it stands for a payload masked apart from its header.

Shared by the daemons' writer (`protocol.io.batching`) and the CLI's (`mind.client.ws`,
`mind.client.blocking`); it imports nothing, so the CLI's start stays free of websockets.
"""

from __future__ import annotations

from typing import Any

IOV_MAX = 1024
"""Buffers one `sendmsg` takes at most (Linux's UIO_MAXIOV)."""


def unsent(buffers: list[Any], n: int) -> list[Any]:
    """What is left of `buffers` once the first `n` bytes were sent: whole buffers as they are,
    the one cut through as a view of its rest (no copy)."""
    for i, buf in enumerate(buffers):
        if n < len(buf):
            return [memoryview(buf)[n:], *buffers[i + 1 :]] if n else buffers[i:]
        n -= len(buf)
    return []


def turned(key: bytes, offset: int) -> bytes:
    """The 4-byte mask `key` as it applies from byte `offset` of a frame's payload on (RFC 6455
    5.3: byte i is masked with key[i % 4]), so a part masked on its own joins the rest exactly."""
    turn = offset % 4
    return key[turn:] + key[:turn]
