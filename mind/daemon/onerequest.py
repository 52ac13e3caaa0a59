"""One HTTP request per connection before the upgrade: a mixin for the Mind's server connections.

A peer that pipelines a second HTTP request behind its first (attack 12: two requests on one
connection, no credential needed) had websockets parse the second as WebSocket frames while still
answering the first; the answer then found the connection half-closed and websockets logged an
`AssertionError` traceback per connection (+4.8 MiB of log per 5 s), and the first request got no
answer at all. Here the bytes after the first request's head are held back until the answer is
sent: after a `101` they are the peer's first frames and go on to the protocol; after any other
answer (a `/healthz` body, a refusal) the connection is closing and they are dropped. So a
pipelining peer gets exactly one clean answer, and the log nothing but websockets' usual line.
"""

from __future__ import annotations

from typing import Any

from websockets.protocol import State

HELD_MAX = 64 << 10
"""Bytes held behind the request head: a peer that sends more before its answer is cut off."""


class OneRequest:
    protocol: Any
    transport: Any
    _head_tail = b""
    _held: bytearray | None = None

    def data_received(self, data: bytes) -> None:
        if self._held is not None:
            if len(self._held) + len(data) > HELD_MAX:
                self.transport.abort()
                return
            self._held += data
            return
        if self.protocol.state is State.CONNECTING:
            window = self._head_tail + data
            end = window.find(b"\r\n\r\n")
            if end >= 0:
                cut = end + 4 - len(self._head_tail)
                self._held = bytearray(data[cut:])
                data = data[:cut]
            else:
                self._head_tail = window[-3:]
        super().data_received(data)  # type: ignore[misc]

    def reads_frames(self) -> bool:
        """Bytes read while some are held go where those went (`data_received`), after them."""
        return self._held is None and super().reads_frames()  # type: ignore[misc]

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().handshake(*args, **kwargs)  # type: ignore[misc]
        finally:
            held, self._held = self._held, None
            if held and self.protocol.state is State.OPEN:
                super().data_received(bytes(held))  # type: ignore[misc]
