"""Our own reader of the frames that carry nearly every byte: a mixin for websockets' asyncio
connections (issue 40 item 2).

websockets parses each frame through a generator: the received chunk is appended to its buffer,
the payload sliced out of it into a new object, then unmasked into another; a binary frame read by
a client is copied once more when its message is joined. On a stream those three copies and the
generator's turns per frame were most of the Mind's user time per byte. Every message of ours is a
binary frame (envelopes and data frames alike), never fragmented, never compressed, so this reader
takes exactly those, complete, from the chunk as the transport gave it:
- a masked payload (what a server reads) is unmasked straight from the chunk: one copy;
- an unmasked one (what a client reads) that fills the chunk is the chunk itself, else one copy;
- the frame goes to the connection's assembler as websockets' own parser would have put it, so
  `recv`, `async for` and their flow control (pausing the transport) are unchanged.

Everything else (ping, pong, close, text, a fragment, reserved bits, a wrong mask, a frame over the
size limit) is handed to websockets whole, at a frame boundary, so its parser and its rules (the
answers to pings, the closing handshake, the errors and close codes) stay the ones that judge it.
That boundary is why the handshake's bytes are split off here: what follows the HTTP head in the
same chunk is read by this reader once the connection is open, never fed to websockets' parser
(which would then hold part of a frame). Once a frame cannot be taken whole (over the limit, or
the connection no longer open), every later byte goes to websockets, for good.
"""

from __future__ import annotations

from typing import Any

from websockets.frames import Frame, Opcode
from websockets.protocol import SERVER, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

FAST = 0x82
"""The first byte of the frames this reader takes: FIN set, no reserved bit, opcode binary."""
READ_MAX = 1 << 20
"""What one read of the socket may take (asyncio's transports read 256 KiB at a time). A stream's
frames are 256 KiB and a header: read 256 KiB at a time, nearly every one straddles two reads and
is copied whole into `_tail` before it is unmasked; read up to 1 MiB, most are taken straight from
the chunk they came in."""
CONTROL_MAX = 125
HEAD_END = b"\r\n\r\n"


class FrameReader:
    """Mixed into a websockets asyncio `ServerConnection` or `ClientConnection` (before it in the
    bases): it replaces `data_received` for the open connection."""

    protocol: Any
    recv_messages: Any
    _tail: bytearray | None = None
    """The start of a frame whose end has not come yet."""
    _need = 0
    """The bytes `_tail` must hold before its first frame is whole (what its header says)."""
    _head_tail = b""
    """The last bytes of the head so far: its end may come split between two chunks."""
    _head_seen = False
    """The HTTP head has been handed to websockets (what came with it is ours)."""
    _slow = False
    """Every byte goes to websockets from now on."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if isinstance(getattr(transport, "max_size", None), int):  # a plain socket's (TLS reads its own way)
            transport.max_size = READ_MAX

    def data_received(self, data: bytes) -> None:
        p = self.protocol
        if self._slow:
            super().data_received(data)  # type: ignore[misc]
            return
        if p.state is State.CONNECTING:
            self._handshake_bytes(data)
            return
        if self._tail is None:
            self._frames(data)
            return
        with memoryview(data) as view:
            off = self._complete(view)
            if off >= len(data):
                return
            if self._slow:  # the frame completed made websockets the reader: the rest is its own
                super().data_received(bytes(view[off:]))
            else:
                self._frames(view[off:])

    def _complete(self, view: memoryview) -> int:
        """Add to `_tail` only the bytes its frame still needs, and read it: what follows it in the
        chunk is read from the chunk itself (appended to the tail, every later frame of the chunk
        was copied once more and its rest moved down again). Returns where in `view` the chunk
        goes on; past its end while the tail's frame is still incomplete."""
        off = 0
        while (tail := self._tail) is not None:
            need = self._need - len(tail)
            if len(view) - off < need:
                tail += view[off:]
                return len(view)
            tail += view[off : off + need]
            off += need
            self._tail = None
            self._frames(tail)  # the tail's frame, whole; or, if only its header was, the tail again
        return off

    def eof_received(self) -> Any:
        tail, self._tail = self._tail, None
        if tail:  # a frame cut short: websockets says so as it would have
            self._slow = True
            super().data_received(bytes(tail))  # type: ignore[misc]
        return super().eof_received()  # type: ignore[misc]

    def _handshake_bytes(self, data: bytes) -> None:
        """Before the connection is open: the HTTP head to websockets, anything after it kept for
        this reader (a client's first frames may share the response's chunk)."""
        if self._head_seen:  # a server answering asynchronously, the peer sending before the answer:
            self._slow = True  # its parser sees frame bytes now, so the boundary is its own
            super().data_received(data)  # type: ignore[misc]
            return
        window = self._head_tail + data  # the end of the head may straddle two chunks
        end = window.find(HEAD_END)
        if end < 0:
            self._head_tail = window[-3:]
            super().data_received(data)  # type: ignore[misc]
            return
        self._head_seen = True
        cut = end + len(HEAD_END) - len(self._head_tail)
        head, rest = data[:cut], data[cut:]
        super().data_received(head)  # type: ignore[misc]
        if not rest:
            return
        if self.protocol.state is State.OPEN:
            self._frames(rest)
        else:  # refused (a body follows), or a server still deciding: websockets reads the rest
            self._slow = True
            super().data_received(rest)  # type: ignore[misc]

    def _frames(self, data: bytes | bytearray | memoryview) -> None:
        """Each complete frame in `data`, in order; an incomplete last one kept for the next chunk."""
        with memoryview(data) as view:
            pos = self._read(data, view)
        if pos < len(data):
            if isinstance(data, bytearray):
                del data[:pos]
                self._tail = data
            else:
                self._tail = bytearray(data[pos:])

    def _read(self, data: bytes | bytearray | memoryview, view: memoryview) -> int:
        """The frames of `data` from its start: where the first incomplete one starts (`_need`
        set to its whole length, or to its header's), or the end."""
        p = self.protocol
        server = p.side is SERVER
        size = len(data)
        pos = 0
        self._need = 2
        while size - pos >= 2:
            if p.state is not State.OPEN:
                self._slow = True
                super().data_received(bytes(view[pos:]))  # type: ignore[misc]
                return size
            b0, b1 = data[pos], data[pos + 1]
            length = b1 & 0x7F
            head = 2
            if length >= 126:  # the length follows in 2 bytes, or in 8
                head += 2 if length == 126 else 8
                if size - pos < head:
                    self._need = head
                    break
                length = int.from_bytes(view[pos + 2 : pos + head], "big")
            masked = b1 & 0x80
            if masked:
                head += 4
            limit = p.max_message_size if b0 & 0x0F < 8 else CONTROL_MAX
            if limit is not None and length > limit:
                # websockets refuses it (1009, 1002) from its header alone: never wait for its bytes
                self._slow = True
                super().data_received(bytes(view[pos:]))  # type: ignore[misc]
                return size
            end = pos + head + length
            if end > size:
                self._need = head + length
                break
            if b0 == FAST and bool(masked) is server and p.current_size is None:
                start = pos + head
                if masked:
                    payload = apply_mask(view[start:end], bytes(view[start - 4 : start]))
                else:
                    payload = bytes(view[start:end])
                self._put(Frame(Opcode.BINARY, payload))
            else:  # theirs to judge, whole
                super().data_received(bytes(view[pos:end]))  # type: ignore[misc]
            pos = end
            self._need = 2
        return pos

    def _put(self, frame: Frame) -> None:
        try:
            self.recv_messages.put(frame)
        except EOFError:  # the assembler closed (the connection is ending): nobody reads it
            pass
