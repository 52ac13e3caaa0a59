"""WebSocket framing for the fault proxy: one direction's bytes cut into whole units (the HTTP
upgrade head, then one unit per WebSocket message or control frame), each named by what it carries,
so a rule can hold, drop, duplicate, delay or cut at "the k-th `result` going up".

Sans-I/O (bytes in, units out). Frames are forwarded exactly as they came (a client's frames stay
masked with their own key); the payload is unmasked only to read the envelope's `t`. A stream that
does not start with an HTTP upgrade (TLS, or anything not WebSocket) stays `raw`: its bytes pass in
chunks and no frame rule can match them, which is why frame faults need plain `ws://`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.envelope import unpack
from protocol.errors import ProtocolError
from protocol.frames import is_frame as is_data_frame

CONTROL = {8: "close", 9: "ping", 10: "pong"}
HEAD_LIMIT = 64 << 10


@dataclass(frozen=True, slots=True)
class Unit:
    """Bytes forwarded as one piece: `kind` is a message type (`rpc`, `result`, ...), `ping`, `pong`,
    `close`, `http` (the upgrade head), `?` (a payload that is not our envelope) or `bytes` (raw)."""

    raw: bytes
    kind: str

    @property
    def control(self) -> bool:
        return self.kind in ("ping", "pong")


def message_type(payload: bytes) -> str:
    if is_data_frame(payload):  # a stream's bytes (protocol/frames.py): rules name them `stream_data`
        return "stream_data"
    try:
        t = unpack(payload).get("t")
    except ProtocolError:
        return "?"
    return t if isinstance(t, str) else "?"


class Framer:
    """Detects WebSocket on the first bytes, then splits frames. Never raises on bad bytes: what it
    cannot frame passes through as `bytes` (the proxy is a test tool, not a validator)."""

    def __init__(self) -> None:
        self.mode = "detect"  # -> "ws" or "raw"
        self._buf = bytearray()
        self._fragments: list[bytes] = []
        self._payload = bytearray()

    def feed(self, data: bytes) -> list[Unit]:
        if self.mode == "raw":
            return [Unit(data, "bytes")] if data else []
        self._buf += data
        out: list[Unit] = []
        if self.mode == "detect":
            if len(self._buf) < 4:
                # a short first message that cannot begin an HTTP head (PostgreSQL's one-byte
                # answer to an SSL request) goes raw now: waiting for more would wait forever
                head = bytes(self._buf)
                return out if b"GET ".startswith(head) or b"HTTP".startswith(head) else self._go_raw(out)
            if not (self._buf.startswith(b"GET ") or self._buf.startswith(b"HTTP")):
                return self._go_raw(out)
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return out if len(self._buf) < HEAD_LIMIT else self._go_raw(out)
            head = bytes(self._buf[: end + 4])
            del self._buf[: end + 4]
            out.append(Unit(head, "http"))
            if head.startswith(b"HTTP") and b" 101 " not in head.split(b"\r\n", 1)[0] + b" ":
                return self._go_raw(out)
            self.mode = "ws"
        while (frame := self._frame()) is not None:
            raw, fin, op, payload = frame
            if op in CONTROL:
                out.append(Unit(raw, CONTROL[op]))
                continue
            self._fragments.append(raw)
            self._payload += payload
            if fin:
                kind = message_type(bytes(self._payload)) if op in (0, 2) else "?"
                out.append(Unit(b"".join(self._fragments), kind))
                self._fragments, self._payload = [], bytearray()
        return out

    def _go_raw(self, out: list[Unit]) -> list[Unit]:
        self.mode = "raw"
        if self._buf:
            out.append(Unit(bytes(self._buf), "bytes"))
            self._buf.clear()
        return out

    def _frame(self) -> tuple[bytes, bool, int, bytes] | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        fin, op, masked, n, off = bool(buf[0] & 0x80), buf[0] & 0x0F, buf[1] & 0x80, buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, off = struct.unpack_from("!H", buf, 2)[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, off = struct.unpack_from("!Q", buf, 2)[0], 10
        key = b""
        if masked:
            if len(buf) < off + 4:
                return None
            key, off = bytes(buf[off : off + 4]), off + 4
        if len(buf) < off + n:
            return None
        raw = bytes(buf[: off + n])
        payload = raw[off:]
        del buf[: off + n]
        if key:
            payload = bytes(b ^ key[i & 3] for i, b in enumerate(payload)) if n < 256 else _unmask(payload, key)
        return raw, fin, op, payload


def _unmask(payload: bytes, key: bytes) -> bytes:
    """XOR with the repeated key, as one big integer (fast for large frames, no numpy)."""
    n = len(payload)
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ k).to_bytes(n, "big")
