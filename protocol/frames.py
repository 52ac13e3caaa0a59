"""Stream bytes as opaque binary frames (DESIGN §11b, issue 25): a fixed header, then the raw payload.

Control stays one msgpack envelope per WebSocket message (`protocol/envelope.py`); a stream chunk is
a binary WebSocket message of its own:

    0      1      2            6                     14
    +------+------+------------+---------------------+-----------------
    | 0xC1 | flags| number u32 | offset u64          | payload ...
    +------+------+------------+---------------------+-----------------

- `0xC1` is the one byte msgpack never uses ("never used" in its spec), so a reader tells a data
  frame from an envelope by its first byte, and an old peer that tries to read one as msgpack
  gets a clean `malformed_frame`, never a misread value.
- `flags`: bit 0 is `eof` (the chunk closes its direction); every other bit must be 0, so a later
  flag is a version change, not something an old peer silently ignores.
- `number`: the stream's number on this connection, assigned by the Mind when a run's streams are
  bound to the connection and announced in `stream_numbers` before any frame uses it (to the Hand
  before the `rpc` or the `stream_resume` of a re-bind; to the client before the run's first
  `run_update` or its `attached`). It dies with the run or the connection. 32 bits: a client
  connection may live through millions of runs (three numbers each) without reusing one, which is
  what lets a frame for a dead stream be told from a number never given (16 bits would wrap after
  ~21,000 runs).
- `offset`: the chunk's byte offset in its stream. 64 bits: a stream has no size limit
  (`output_limit` goes to 2^50), and 32 would wrap at 4 GiB.
- the payload: the rest of the message, at most `limits.STREAM_CHUNK_MAX` bytes; empty only with
  `eof`. Its length is the WebSocket message's, so the header needs none.

Big-endian, 14 bytes: 0.005 % of a 256 KiB chunk. The Mind reads the header, checks it against the
stream's `Relay` and forwards the payload as the buffer it received (a `memoryview`): it never
decodes, validates or re-encodes stream bytes. The ends build what they need from the header and
the number's entry (`Numbers`).

Decoding untrusted bytes raises `ProtocolError` only, with the codes malformed msgpack gets:
`malformed_frame` (short header, unknown flags, an empty chunk without eof) and `frame_too_large`.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import ProtocolError

MAGIC = 0xC1
HEADER = struct.Struct(">BBIQ")
HEADER_SIZE = HEADER.size  # 14
FLAG_EOF = 0x01
NUMBER_MAX = (1 << 32) - 1
OFFSET_MAX = (1 << 64) - 1

STREAMS = ("stdin", "stdout", "stderr", "pty")
OUTPUT_STREAMS = frozenset({"stdout", "stderr", "pty"})
"""What a Hand sends; a client sends only `stdin`."""


def is_frame(data: object) -> bool:
    """A data frame, not an envelope: its first byte is the one msgpack never uses."""
    return isinstance(data, (bytes, bytearray, memoryview)) and len(data) > 0 and data[0] == MAGIC


def header(number: int, offset: int, eof: bool) -> bytes:
    """The 14 bytes before a chunk's payload."""
    if not 1 <= number <= NUMBER_MAX:
        raise ValueError(f"stream number {number} outside [1, {NUMBER_MAX}]")
    if not 0 <= offset <= OFFSET_MAX:
        raise ValueError(f"offset {offset} outside [0, 2^64)")
    return HEADER.pack(MAGIC, FLAG_EOF if eof else 0, number, offset)


def encode(number: int, offset: int, data: bytes | memoryview, eof: bool) -> bytes:
    """One whole frame (header + payload), for the ends; the Mind writes the two parts as they are."""
    head, data = parts(number, offset, data, eof)
    return head + data


def parts(number: int, offset: int, data: bytes | memoryview, eof: bool) -> tuple[bytes, bytes | memoryview]:
    """A frame as its header and its payload, unjoined: a writer that frames them itself
    (`protocol.io.batching`) copies the payload once, where joining them first is a copy more."""
    if len(data) > limits.STREAM_CHUNK_MAX:
        raise ValueError(f"a chunk of {len(data)} bytes exceeds {limits.STREAM_CHUNK_MAX}")
    if not data and not eof:
        raise ValueError("a chunk carries data or the end of the stream")
    return header(number, offset, eof), data


def decode(data: bytes | bytearray | memoryview) -> tuple[int, int, bool, memoryview]:
    """Untrusted bytes -> `(number, offset, eof, payload)`; the payload is a view of `data`, not a
    copy. `ProtocolError` for anything else."""
    size = len(data)
    if size > limits.MAX_FRAME_BYTES or size - HEADER_SIZE > limits.STREAM_CHUNK_MAX:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"a data frame of {size} bytes exceeds the chunk limit of {limits.STREAM_CHUNK_MAX} bytes",
        )
    if size < HEADER_SIZE:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"a data frame of {size} bytes is shorter than its header")
    magic, flags, number, offset = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "a data frame starts with 0xC1")
    if flags & ~FLAG_EOF:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"unknown data frame flags 0x{flags:02x}")
    if number == 0:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "stream number 0 is never assigned")
    eof = bool(flags & FLAG_EOF)
    if size == HEADER_SIZE and not eof:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "a data frame carries data or the end of its stream")
    return number, offset, eof, memoryview(data)[HEADER_SIZE:]


def announced(msg: Any) -> dict[str, int]:
    """The numbers a `stream_numbers` message gives, by stream (the model, or the fast path's
    `Msg`: this module imports no pydantic)."""
    return {name: n for name in STREAMS if (n := getattr(msg, name, None)) is not None}


class Entry:
    """What a stream number stands for on one connection."""

    __slots__ = ("env_id", "run_id", "stream")

    def __init__(self, run_id: str, stream: str, env_id: str | None) -> None:
        self.run_id = run_id
        self.stream = stream
        self.env_id = env_id
        """The envelope id the run's messages travel under on this connection (a client's
        request id); None on a Hand's connection."""


class Numbers:
    """The stream numbers of one connection, as either side holds them.

    The Mind assigns (`assign`, counting up from 1 and never reusing a number on the connection);
    the peer learns them from `stream_numbers` (`bind`). A number dies with its run (`drop_run`).
    `lookup` tells the three cases a receiver must tell apart: a live stream (its entry), a number
    that was given and has died (None: a late frame of an ended run, dropped like a late envelope),
    and a number never given on this connection (`ProtocolError`: the peer made it up, or took it
    from another connection)."""

    __slots__ = ("_by_number", "_by_stream", "_ended", "top")

    ENDED_KEPT = 1024
    """Runs whose numbers died, remembered (the newest this many) so a chunk still sent for one
    (stdin a command never read, sent until its end arrived) is dropped, not taken for a bug."""

    def __init__(self) -> None:
        self._by_number: dict[int, Entry] = {}
        self._by_stream: dict[tuple[str, str], int] = {}
        self._ended: dict[str, None] = {}
        self.top = 0
        """The highest number given on this connection."""

    def __len__(self) -> int:
        return len(self._by_number)

    def assign(self, run_id: str, streams: Any, env_id: str | None = None) -> dict[str, int]:
        """Fresh numbers for `streams` of `run_id` (the Mind's side); a stream that already has one
        on this connection keeps it."""
        out: dict[str, int] = {}
        for name in streams:
            n = self._by_stream.get((run_id, name))
            if n is None:
                if self.top >= NUMBER_MAX:
                    raise ProtocolError(ErrorCode.INTERNAL_ERROR, "this connection used every stream number")
                self.top += 1
                n = self.top
                self._by_number[n] = Entry(run_id, name, env_id)
                self._by_stream[(run_id, name)] = n
            out[name] = n
        return out

    def bind(self, run_id: str, numbers: dict[str, int], env_id: str | None = None) -> None:
        """The peer's side: the Mind announced `numbers` for `run_id` (`stream_numbers`). Numbers
        the run had before on this connection die (a re-bind gives new ones)."""
        self.drop_run(run_id)
        self._ended.pop(run_id, None)
        for name, n in numbers.items():
            old = self._by_number.pop(n, None)
            if old is not None:
                self._by_stream.pop((old.run_id, old.stream), None)
            self._by_number[n] = Entry(run_id, name, env_id)
            self._by_stream[(run_id, name)] = n
            self.top = max(self.top, n)

    def number(self, run_id: str, stream: str) -> int | None:
        return self._by_stream.get((run_id, stream))

    def ended(self, run_id: str) -> bool:
        """The run's numbers died here (recently): what is still sent for it is dropped."""
        return run_id in self._ended

    def lookup(self, number: int) -> Entry | None:
        entry = self._by_number.get(number)
        if entry is None and number > self.top:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"stream number {number} was never given on this connection")
        return entry

    def drop_run(self, run_id: str) -> None:
        """The run's numbers die (it ended, or moved to another connection)."""
        for name in STREAMS:
            n = self._by_stream.pop((run_id, name), None)
            if n is not None:
                self._by_number.pop(n, None)
        self._ended[run_id] = None
        if len(self._ended) > self.ENDED_KEPT:
            del self._ended[next(iter(self._ended))]
