"""Our own reader of the frames that carry nearly every byte: a mixin for websockets' asyncio
connections (issue 40 item 2).

websockets parses each frame through a generator: the received chunk is appended to its buffer,
the payload sliced out of it into a new object, then unmasked into another; a binary frame read by
a client is copied once more when its message is joined. On a stream those three copies and the
generator's turns per frame were most of the Mind's user time per byte. Every message of ours is a
binary frame (envelopes and data frames alike), never fragmented, never compressed, so this reader
takes exactly those, complete, from a buffer it owns:
- it is an `asyncio.BufferedProtocol`: a plain socket is read with `recv_into` straight into that
  buffer, and TLS decrypts into it (asyncio's TLS transport otherwise reads 256 KiB pieces and
  joins them into one more copy of every byte);
- a masked payload (what a server reads) is unmasked straight out of the buffer: one copy; an
  unmasked one (what a client reads) is copied out once;
- the frame goes to the connection's assembler as websockets' own parser would have put it, so
  `recv`, `async for` and their flow control (pausing the transport) are unchanged.

The buffer starts small (an idle connection holds `SMALL`), grows to `READ_MAX` once a read fills
the room it was offered (a stream), to a whole frame when one is larger (doubling as its bytes
come, never at its header's word), and goes back to `SMALL`
when it empties a while after the stream's last full read. Only an incomplete frame is ever moved
down (to the buffer's start, so that each read is offered at least half of it).

Everything else (ping, pong, close, text, a fragment, reserved bits, a wrong mask, a frame over the
size limit) is handed to websockets whole, at a frame boundary, so its parser and its rules (the
answers to pings, the closing handshake, the errors and close codes) stay the ones that judge it.
That boundary is why the handshake's bytes are split off here: what follows the HTTP head in the
same chunk is read by this reader once the connection is open, never fed to websockets' parser
(which would then hold part of a frame). Once a frame cannot be taken whole (over the limit, or
the connection no longer open), every later byte goes to websockets, for good. Bytes that are not
frames of ours go through `data_received`, so a mixin above this one (the Mind's one-request
guard) sees them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.protocol import SERVER, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

FAST = 0x82
"""The first byte of the frames this reader takes: FIN set, no reserved bit, opcode binary."""
SMALL = 64 << 10
"""The buffer of a connection that is not streaming: what it holds while idle."""
READ_MAX = 1 << 20
"""The buffer of a stream, so what one read may take (asyncio's transports read 256 KiB at a
time). A stream's frames are 256 KiB and a header: read 256 KiB at a time, nearly every one
straddles two reads and is moved down before it is unmasked; read up to 1 MiB, most are taken
where they came in."""
MIN_READ = 16 << 10
"""The least room a read is offered beyond the incomplete frame's bytes."""
IDLE_S = 1.0
"""A buffer grown for a stream goes back to `SMALL` once it empties this long after the last read
that filled it (at once, a reader faster than its sender shrank and regrew it every few reads:
each regrowth a fresh megabyte, zeroed)."""
CONTROL_MAX = 125
HEAD_END = b"\r\n\r\n"


class FrameReader(asyncio.BufferedProtocol):
    """Mixed into a websockets asyncio `ServerConnection` or `ClientConnection` (before it in the
    bases): the transport reads into this reader's buffer (`get_buffer`, `buffer_updated`) instead
    of calling `data_received`."""

    protocol: Any
    recv_messages: Any
    _buf: bytearray | None = None
    _start = 0
    """Where the unread bytes of `_buf` begin: the start of an incomplete frame, if any."""
    _end = 0
    """Where they end."""
    _need = 2
    """The bytes from `_start` the first frame needs before it is whole (what its header says)."""
    _offered = 0
    """The room the last `get_buffer` offered."""
    _filled = False
    """The last read filled all of it: a stream, whose next read is offered `READ_MAX`."""
    _filled_at = 0.0
    """When a read last filled the room it was offered (monotonic)."""
    _head_tail = b""
    """The last bytes of the head so far: its end may come split between two chunks."""
    _head_seen = False
    """The HTTP head has been handed to websockets (what came with it is ours)."""
    _slow = False
    """Every byte goes to websockets from now on."""

    # --- what the transport calls ---

    def get_buffer(self, sizehint: int) -> memoryview:
        buf = self._buf
        start, end = self._start, self._end
        used = end - start
        want = max(self._need, used + MIN_READ)
        if want > READ_MAX:
            # A frame larger than a stream's buffer: its room doubles with the bytes that came, never
            # the length its header announces at once (a header alone must not cost megabytes).
            want = max(used + MIN_READ, min(want, 2 * used))
        if buf is None:
            buf = self._buf = bytearray(SMALL)
        grow = self._filled and len(buf) < READ_MAX
        if len(buf) < want or grow:
            # A new buffer, never a resized one: the transport may still hold a view of this one.
            new = bytearray(max(want, READ_MAX if grow else len(buf)))
            with memoryview(buf) as view:
                new[:used] = view[start:end]
            buf = self._buf = new
            self._start, self._end = 0, used
        elif start and (len(buf) - start < want or len(buf) - end < len(buf) // 2):
            # The incomplete frame moved down (same size: no resize), so that a read is offered at
            # least half the buffer (at most one frame moved per read); a copy first where they overlap.
            if start >= used:
                with memoryview(buf) as view:
                    buf[:used] = view[start:end]
            else:
                buf[:used] = buf[start:end]
            self._start, self._end = 0, used
        self._filled = False
        self._offered = len(buf) - self._end
        return memoryview(buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if not self.reads_frames():
            buf = self._buf
            assert buf is not None
            data = bytes(buf[self._end : self._end + nbytes])
            self.data_received(data)  # the whole chain: a mixin above this one sees these bytes
            return
        self._took(nbytes)

    def reads_frames(self) -> bool:
        """Whether the bytes read now are frames this reader takes from its buffer; else they go
        to `data_received` as bytes (the handshake, and everything once websockets reads)."""
        return not self._slow and self.protocol.state is State.OPEN

    def data_received(self, data: bytes) -> None:
        """Bytes given rather than read into the buffer (the handshake's, those a mixin held back,
        a test's): the same reading as `buffer_updated`, after one copy into the buffer."""
        p = self.protocol
        if self._slow:
            super().data_received(data)  # type: ignore[misc]
            return
        if p.state is State.CONNECTING:
            self._handshake_bytes(data)
            return
        self._feed(data)

    def eof_received(self) -> Any:
        buf, start, end = self._buf, self._start, self._end
        self._start = self._end = 0
        if buf is not None and end > start:  # a frame cut short: websockets says so as it would have
            self._slow = True
            super().data_received(bytes(buf[start:end]))  # type: ignore[misc]
        # past `BufferedProtocol`'s own `eof_received` (a no-op) to the connection's
        return super(asyncio.BufferedProtocol, self).eof_received()  # type: ignore[misc]

    # --- reading ---

    def _feed(self, data: bytes | memoryview) -> None:
        with memoryview(data) as view:
            off = 0
            while off < len(view):
                if self._slow:  # a frame of this chunk made websockets the reader: the rest is its own
                    super().data_received(bytes(view[off:]))  # type: ignore[misc]
                    return
                room = self.get_buffer(-1)
                n = min(len(room), len(view) - off)
                room[:n] = view[off : off + n]
                room.release()
                off += n
                self._took(n)

    def _took(self, nbytes: int) -> None:
        """`nbytes` more in the room `get_buffer` offered: noted (a read that filled it is a
        stream's), then the complete frames read (`_parse`)."""
        if nbytes >= self._offered:
            self._filled = True
            self._filled_at = time.monotonic()
        self._end += nbytes
        self._parse()

    def _parse(self) -> None:
        """The complete frames in the buffer; the start of an incomplete one kept where it is."""
        buf = self._buf
        assert buf is not None
        with memoryview(buf) as view:
            pos = self._read(buf, view, self._start, self._end)
        if pos < self._end:
            self._start = pos
            return
        self._start = self._end = 0
        if len(buf) > READ_MAX or (len(buf) > SMALL and time.monotonic() - self._filled_at > IDLE_S):
            self._buf = None  # (a frame over READ_MAX read, or the stream has quieted)
            self._offered = 0

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
            self._feed(rest)
        else:  # refused (a body follows), or a server still deciding: websockets reads the rest
            self._slow = True
            super().data_received(rest)  # type: ignore[misc]

    def _read(self, data: bytearray, view: memoryview, pos: int, size: int) -> int:
        """The frames of `data[pos:size]`: where the first incomplete one starts (`_need` set to
        its whole length, or to its header's), or `size`."""
        p = self.protocol
        server = p.side is SERVER
        self._need = 2
        while size - pos >= 2:
            if p.state is not State.OPEN:
                self._slow = True
                super().data_received(bytes(view[pos:size]))  # type: ignore[misc]
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
                super().data_received(bytes(view[pos:size]))  # type: ignore[misc]
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
