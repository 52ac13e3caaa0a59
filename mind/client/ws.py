"""The client half of RFC 6455 that the CLI's fast path needs, sans-I/O.

Why not the `websockets` library here: importing it (with asyncio) costs more than a whole fast
`mind exec` (its version module alone imports `importlib.metadata`). The Mind speaks plain RFC 6455
with no extension and no subprotocol, so the client half is small: the upgrade request and the check
of its answer, masked frames out, unmasked frames in, fragmentation, ping/pong and the closing
handshake. Like `websockets.protocol.Protocol` it does no I/O at all: the shell (`mind/client/blocking.py`)
feeds it bytes with `receive_data` / `receive_eof`, writes what `data_to_send` returns, and reads what
happened from `events`.

A server that breaks the protocol gets a `WsError` carrying the close code to send; nothing it
sends makes this buffer more than one response head (16 KiB) or one message (`max_size`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from typing import Any

from protocol.errors import MindhandError
from protocol.io.buffers import turned

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
MAX_HEAD = 16 << 10

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 1002
CLOSE_ABNORMAL = 1006
CLOSE_BAD_DATA = 1007
CLOSE_TOO_BIG = 1009
CLOSE_NO_STATUS = 1005

# event kinds returned by `events()`
MESSAGE, PONG, CLOSED = "message", "pong", "closed"


class WsError(MindhandError):
    """The server broke the protocol (or refused the upgrade); `code` is the close code to send."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


_C_MASK: Any = None
"""websockets' C `apply_mask`, once looked up (False: not available)."""


def _c_mask() -> Any:
    """The C masking of the `websockets` package, loaded from its extension file without importing
    the package (30 ms of imports the fast path avoids): masking in Python runs at ~300 MiB/s, which
    made piping a large stdin through `mind exec` spend seconds per GiB on it. Looked up only for a
    large frame, so `mind exec -- true` never pays for it."""
    global _C_MASK
    if _C_MASK is None:
        _C_MASK = False
        try:
            import importlib.machinery
            import importlib.util

            spec = importlib.util.find_spec("websockets")
            if spec is not None and spec.origin is not None:
                folder = os.path.dirname(spec.origin)
                for name in os.listdir(folder):
                    if name.startswith("speedups.") and name.endswith(".so"):
                        loader = importlib.machinery.ExtensionFileLoader("speedups", os.path.join(folder, name))
                        ext = importlib.util.spec_from_loader("speedups", loader)
                        if ext is not None:
                            module = importlib.util.module_from_spec(ext)
                            loader.exec_module(module)
                            _C_MASK = module.apply_mask
                        break
        except Exception:  # any failure: the pure-Python masking below is always right
            _C_MASK = False
    return _C_MASK


def apply_mask(data: bytes | memoryview, mask: bytes) -> bytes:
    """XOR with the 4-byte mask: the C one for large frames when it can be had, else one big-integer
    operation (no per-byte Python loop)."""
    if len(data) >= 16 << 10:
        fast = _c_mask()
        if fast:
            return bytes(fast(data, mask))
    n = len(data)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


SCATTER_MIN = 4096
"""A frame's payload from this size on is written as a buffer of its own (`buffers_to_send`)."""
WHOLE_MIN = 64 << 10
"""A whole message from this size on that has not all arrived is gathered in a buffer of its own,
which the shell reads into (`buffer_to_fill`) and which is handed on as it is: no copy of it into
the read buffer and out again. A stream's 512 KiB chunks were copied so twice, besides the read's
own new object: perf of `mind exec -- cat` at 1 GiB, 14 % of the CLI's samples in `memmove` and 7 %
in page faults."""


class WsClient:
    """One client connection: `connecting` (upgrade sent) -> `open` -> `closing` -> `closed`."""

    def __init__(self, host: str, path: str = "/", max_size: int = 1 << 20, key: bytes | None = None) -> None:
        self.key = base64.b64encode(key if key is not None else os.urandom(16)).decode()
        self.max_size = max_size
        self.state = "connecting"
        self.close_code: int | None = None
        self.close_reason = ""
        self._close_sent = False
        self._buf = bytearray()
        self._out: list[bytes] = [
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {self.key}\r\nSec-WebSocket-Version: 13\r\nUser-Agent: mindhand-cli\r\n\r\n"
            ).encode()
        ]
        self._frag_op: int | None = None
        self._frag = bytearray()
        self._events: list[tuple] = []
        self._whole: bytearray | None = None
        """A large whole message being gathered (`WHOLE_MIN`), of its opcode `_whole_op`."""
        self._whole_op = OP_BINARY
        self._filled = 0
        self._spare: bytearray | None = None
        """The last large message's buffer, used again for the next if nobody holds it (`_gather`)."""

    # --- the shell's side ---

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())

    def buffers_to_send(self) -> list[bytes]:
        """What `data_to_send` joins: a large frame's masked payload is a buffer of its own, so a
        writer with scatter-gather (`sendmsg`) sends it without copying it into one."""
        out, self._out = self._out, []
        return out

    def events(self) -> list[tuple]:
        """`(MESSAGE, bytes | str)`, `(PONG, payload)`, `(CLOSED, code, reason)`, in arrival order."""
        ev, self._events = self._events, []
        return ev

    def buffer_to_fill(self) -> memoryview | None:
        """Where the next bytes belong when they are the rest of a large message being gathered:
        the shell may `recv_into` it and then call `filled`. None: use `receive_data`."""
        if self._whole is None or self.state == "closed":
            return None
        return memoryview(self._whole)[self._filled :]

    def filled(self, n: int) -> None:
        """`n` bytes were read into `buffer_to_fill()`."""
        assert self._whole is not None and 0 < n <= len(self._whole) - self._filled
        self._filled += n
        if self._filled == len(self._whole):
            self._whole_done()

    def receive_data(self, data: bytes) -> None:
        if self.state == "closed" or not data:
            return
        if self._whole is not None:
            take = min(len(data), len(self._whole) - self._filled)
            with memoryview(data) as view:
                self._whole[self._filled : self._filled + take] = view[:take]
            self.filled(take)
            if take == len(data):
                return
            data = data[take:]
        self._buf += data
        if self.state == "connecting":
            self._parse_head()
        if self.state in ("open", "closing"):
            self._parse_frames()

    def receive_eof(self) -> None:
        if self.state == "connecting":
            raise WsError(CLOSE_ABNORMAL, "did not receive a valid HTTP response (the connection closed)")
        if self.state != "closed":
            self._closed(CLOSE_ABNORMAL, "")

    def send_binary(self, payload: bytes | tuple[bytes, bytes | memoryview]) -> None:
        """One binary message: `payload`, or a (header, payload) pair sent as one message, masked
        part by part (the payload's key turned by the header's length), never joined first."""
        self._require_open()
        if isinstance(payload, tuple):
            self._frame_parts(*payload)
        else:
            self._frame(OP_BINARY, payload)

    def send_ping(self, payload: bytes) -> None:
        self._require_open()
        self._frame(OP_PING, payload)

    def send_close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Start (or answer) the closing handshake; the server then closes the TCP connection."""
        if self._close_sent or self.state in ("connecting", "closed"):
            return
        self._close_sent = True
        self._frame(OP_CLOSE, code.to_bytes(2, "big") + reason.encode()[:123])
        if self.state == "open":
            self.state = "closing"

    # --- parsing ---

    def _require_open(self) -> None:
        if self.state != "open" or self._close_sent:
            raise WsError(CLOSE_ABNORMAL, "the connection is closing")

    def _parse_head(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                raise WsError(CLOSE_PROTOCOL, "the HTTP response head is too large")
            return
        lines = bytes(self._buf[:end]).decode("iso-8859-1").split("\r\n")
        del self._buf[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or parts[0] != "HTTP/1.1" or not parts[1].isdigit():
            raise WsError(CLOSE_PROTOCOL, "did not receive a valid HTTP response")
        status = int(parts[1])
        if status != 101:
            raise WsError(CLOSE_PROTOCOL, f"server rejected WebSocket connection: HTTP {status}")
        headers: dict[str, list[str]] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise WsError(CLOSE_PROTOCOL, "did not receive a valid HTTP response header")
            headers.setdefault(name.strip().lower(), []).append(value.strip())

        def tokens(name: str) -> set[str]:
            return {t.strip().lower() for v in headers.get(name, []) for t in v.split(",")}

        if "websocket" not in tokens("upgrade") or "upgrade" not in tokens("connection"):
            raise WsError(CLOSE_PROTOCOL, "the server did not upgrade the connection to WebSocket")
        if headers.get("sec-websocket-accept") != [accept_key(self.key)]:
            raise WsError(CLOSE_PROTOCOL, "the server's Sec-WebSocket-Accept does not match our key")
        if "sec-websocket-extensions" in headers or "sec-websocket-protocol" in headers:
            raise WsError(CLOSE_PROTOCOL, "the server negotiated an extension or subprotocol that was not offered")
        self.state = "open"

    def _parse_frames(self) -> None:
        buf = self._buf
        while self.state != "closed" and len(buf) >= 2:
            b0, b1 = buf[0], buf[1]
            fin, op = b0 & 0x80, b0 & 0x0F
            if b0 & 0x70:
                raise WsError(CLOSE_PROTOCOL, "reserved bits must be 0 (no extension was negotiated)")
            if b1 & 0x80:
                raise WsError(CLOSE_PROTOCOL, "frames from the server must not be masked")
            n, pos = b1 & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    return
                n, pos = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    return
                n, pos = int.from_bytes(buf[2:10], "big"), 10
            if op >= 8:
                if op not in (OP_CLOSE, OP_PING, OP_PONG):
                    raise WsError(CLOSE_PROTOCOL, f"invalid opcode {op}")
                if not fin or n > 125:
                    raise WsError(CLOSE_PROTOCOL, "control frames must be final and at most 125 bytes")
            elif op in (OP_TEXT, OP_BINARY):
                if self._frag_op is not None:
                    raise WsError(CLOSE_PROTOCOL, "a new message began inside a fragmented one")
            elif op == OP_CONT:
                if self._frag_op is None:
                    raise WsError(CLOSE_PROTOCOL, "a continuation frame without a message to continue")
            else:
                raise WsError(CLOSE_PROTOCOL, f"invalid opcode {op}")
            if op < 8 and len(self._frag) + n > self.max_size:
                raise WsError(CLOSE_TOO_BIG, f"a message over the limit of {self.max_size} bytes")
            if len(buf) < pos + n:
                if n >= WHOLE_MIN and fin and op in (OP_TEXT, OP_BINARY):
                    self._gather(op, n, pos)
                return
            with memoryview(buf) as view:  # one copy: a slice of the bytearray would be another
                payload = bytes(view[pos : pos + n])
            del buf[: pos + n]
            if op < 8:
                self._data(op, payload, bool(fin))
            elif op == OP_CLOSE:
                self._on_close(payload)
            elif op == OP_PING:
                if not self._close_sent:
                    self._frame(OP_PONG, payload)
            else:
                self._events.append((PONG, payload))

    def _gather(self, op: int, n: int, pos: int) -> None:
        """Begin gathering a large whole message: what is read of it so far moves to its own buffer.
        The buffer of the last one is used again when it is the same size and nothing holds it any
        more (its consumer let go of it and of every view of it: only this object refers to it),
        so a stream's chunks do not each cost new pages."""
        spare, self._spare = self._spare, None
        whole = spare if spare is not None and len(spare) == n and sys.getrefcount(spare) <= 2 else bytearray(n)
        del spare
        have = len(self._buf) - pos
        with memoryview(self._buf) as view:
            whole[:have] = view[pos:]
        self._buf.clear()
        self._whole, self._whole_op, self._filled = whole, op, have

    def _whole_done(self) -> None:
        whole, self._whole = self._whole, None
        assert whole is not None
        self._data(self._whole_op, whole, True)
        self._spare = whole  # (the read buffer stayed empty meanwhile: what follows is read after this)

    def _data(self, op: int, payload: bytes | bytearray, fin: bool) -> None:
        kind: int | None
        if fin and op != OP_CONT:  # a whole message in one frame (the Mind never fragments): as it is
            data, kind = payload, op
        else:
            if op != OP_CONT:
                self._frag_op = op
            self._frag += payload
            if not fin:
                return
            data, kind = bytes(self._frag), self._frag_op
            self._frag_op, self._frag = None, bytearray()
        if kind == OP_TEXT:
            try:
                self._events.append((MESSAGE, data.decode()))
            except UnicodeDecodeError:
                raise WsError(CLOSE_BAD_DATA, "a text message that is not UTF-8") from None
        else:
            self._events.append((MESSAGE, data))

    def _on_close(self, payload: bytes) -> None:
        if len(payload) == 1:
            raise WsError(CLOSE_PROTOCOL, "a close frame with a 1-byte payload")
        code = int.from_bytes(payload[:2], "big") if payload else CLOSE_NO_STATUS
        try:
            reason = payload[2:].decode()
        except UnicodeDecodeError:
            raise WsError(CLOSE_BAD_DATA, "a close reason that is not UTF-8") from None
        if not self._close_sent:  # echo it, then wait for the server to close the TCP connection
            self._close_sent = True
            self._frame(OP_CLOSE, payload[:2])
        self._closed(code, reason)

    def _closed(self, code: int, reason: str) -> None:
        self.state = "closed"
        self.close_code, self.close_reason = code, reason
        self._buf.clear()
        self._events.append((CLOSED, code, reason))

    def _frame_parts(self, head: bytes, payload: bytes | memoryview) -> None:
        n = len(head) + len(payload)
        if n < SCATTER_MIN:
            self._frame(OP_BINARY, head + bytes(payload))
            return
        mask = os.urandom(4)
        ws_head = self._head(OP_BINARY, n)
        self._out += (ws_head + mask + apply_mask(head, mask), apply_mask(payload, turned(mask, len(head))))

    @staticmethod
    def _head(op: int, n: int) -> bytes:
        if n < 126:
            return bytes((0x80 | op, 0x80 | n))
        if n < 1 << 16:
            return bytes((0x80 | op, 0x80 | 126)) + n.to_bytes(2, "big")
        return bytes((0x80 | op, 0x80 | 127)) + n.to_bytes(8, "big")

    def _frame(self, op: int, payload: bytes) -> None:
        n = len(payload)
        head = self._head(op, n)
        mask = os.urandom(4)
        if n < SCATTER_MIN:
            self._out.append(head + mask + apply_mask(payload, mask))
        else:
            self._out += (head + mask, apply_mask(payload, mask))
