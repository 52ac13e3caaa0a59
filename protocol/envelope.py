"""The envelope codec: one msgpack map `{v, t, id, seq, gen, p}` per binary WebSocket message.

`decode` takes untrusted bytes and returns an `Envelope` or raises `ProtocolError`; nothing else
escapes it (a hypothesis test feeds it arbitrary bytes and arbitrary msgpack values).

The framing (`unpack`, `check`, `encode`, `Channel`) needs no pydantic: the models and pydantic are
imported on the first `decode`, so the CLI's fast path (`mind/client/wire.py`) shares these checks without
paying for them.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgpack

from protocol import PROTOCOL_VERSION, frames, limits
from protocol.codes import ErrorCode
from protocol.errors import MindhandError, ProtocolError
from protocol.record import Frozen

if TYPE_CHECKING:
    import pydantic

    from protocol.messages import Message

M = TypeVar("M", bound="Message")

_KEYS = frozenset({"v", "t", "id", "seq", "gen", "p"})


class Envelope(Frozen, Generic[M]):
    """One frame: the message and its envelope fields (immutable; see protocol/record.py)."""

    __slots__ = ("msg", "seq", "id", "gen")
    msg: M
    seq: int
    id: str | None
    gen: int | None

    def __init__(self, msg: M, seq: int, id: str | None = None, gen: int | None = None) -> None:
        object.__setattr__(self, "msg", msg)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "gen", gen)

    @property
    def t(self) -> str:
        return self.msg.TYPE


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"msgpack extension type {code} is not allowed")


def encode(env: Envelope[Any]) -> bytes:
    return encode_raw(env.msg.TYPE, env.id, env.seq, env.gen, env.msg.model_dump(mode="python"))


def encode_raw(t: str, id: str | None, seq: int, gen: int | None, p: dict[str, Any]) -> bytes:
    """A frame of payload map `p` as it is: for a payload that was never a model here (a node
    forwarding another node's answer, DESIGN §16), or one already dumped (`encode`)."""
    frame = {"v": PROTOCOL_VERSION, "t": t, "id": id, "seq": seq, "gen": gen, "p": p}
    data = msgpack.packb(frame, use_bin_type=True, datetime=False)
    if len(data) > limits.MAX_FRAME_BYTES:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"a {t} frame of {len(data)} bytes exceeds the limit of {limits.MAX_FRAME_BYTES}",
        )
    return data


def payload_size(msg: Message) -> int:
    """The encoded bytes `msg` adds to a frame as one item of a list: what a sender measures to
    keep a reply under the frame limit before building it (`mind/core/paging.py`)."""
    return len(msgpack.packb(msg.model_dump(mode="python"), use_bin_type=True, datetime=False))


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def peek_version(raw: object) -> int | None:
    if isinstance(raw, dict) and _is_int(raw.get("v")):
        return raw["v"]
    return None


class _TooManyContainers(MindhandError):
    """Raised inside the decoder's hook to stop it; never leaves `unpack`."""


class PayloadRefused(ProtocolError):
    """A frame whose envelope was read (its id, seq and generation) and whose payload was refused
    before it was built: it is answered under its id and the connection goes on, as for any
    request refused for its arguments."""

    def __init__(self, code: ErrorCode, message: str, header: dict[str, Any]) -> None:
        super().__init__(code, message)
        self.header = header


def _unpack_counted(data: bytes, bound: int, bounds: dict[str, Any]) -> Any:
    """`msgpack.unpackb`, refusing a frame with more than `bound` lists and maps while they are
    built. The envelope map is read key by key, so a payload refused this way still has the
    header read before it (its encoder writes v, t, id, seq, gen, then p)."""
    count = _counting(bound)
    up = msgpack.Unpacker(list_hook=count, object_hook=count, max_buffer_size=len(data) or 1, **bounds)
    up.feed(data)
    try:
        n = up.read_map_header()
    except Exception:
        return msgpack.unpackb(data, **bounds)  # not a map: the usual decode says what it is
    raw: dict[Any, Any] = {}
    for _ in range(n):
        key = up.unpack()
        try:
            raw[key] = up.unpack()
        except _TooManyContainers:
            why = f"frame holds more than {bound} lists and maps: refused before decoding it"
            raise PayloadRefused(ErrorCode.INVALID_PAYLOAD, why, raw) from None
    if up.tell() != len(data):
        raise msgpack.ExtraData(raw, b"")
    return raw


def _counting(bound: int) -> Any:
    """A list/map hook that stops the decode once `bound` containers were built: what a frame of a
    million empty lists costs is the building of them (100-190 ms of the loop for 1 MiB), so the
    count is kept while they are built, not after."""
    built = 0

    def hook(x: Any) -> Any:
        nonlocal built
        built += 1
        if built > bound:
            raise _TooManyContainers
        return x

    return hook


def unpack(data: object, max_containers: int | None = None) -> dict[str, Any]:
    """Bytes -> the raw envelope map, checked for shape but not for version or payload.
    `max_containers`: refuse a frame holding more lists and maps than that, before the rest of it
    is built (a client's frames: `limits.ARGS_MAX_ITEMS`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frames must be binary WebSocket messages")
    if len(data) > limits.MAX_FRAME_BYTES:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {len(data)} bytes exceeds the limit of {limits.MAX_FRAME_BYTES}",
        )
    # The cyclic collector would run over and over while a frame of a million small containers is
    # built (measured: 0.39 s instead of 0.06 s for 1 MiB of empty lists); nothing built here can
    # form a cycle, so it is paused for the decode (issue 13, items 4 and 5).
    paused = gc.isenabled()
    gc.disable()
    bounds: dict[str, Any] = dict(
        raw=False,
        strict_map_key=True,
        ext_hook=_refuse_ext,
        timestamp=0,
        max_str_len=limits.MAX_FRAME_BYTES,
        max_bin_len=limits.MAX_FRAME_BYTES,
        max_array_len=limits.MAX_CONTAINER_ITEMS,
        max_map_len=limits.MAX_CONTAINER_ITEMS,
        max_ext_len=0,
    )
    try:
        if max_containers is None:
            raw = msgpack.unpackb(bytes(data), **bounds)
        else:
            raw = _unpack_counted(bytes(data), max_containers, bounds)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types: ExtraData, ValueError, StackError, ...
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, f"frame is not a single msgpack value ({type(exc).__name__})"
        ) from None
    finally:
        if paused:
            gc.enable()
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frame must be a msgpack map")
    if set(raw) != _KEYS:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frame must have exactly the keys v, t, id, seq, gen, p")
    return raw


_registry: tuple[dict[str, Any], type[pydantic.ValidationError]] | None = None


def _models() -> tuple[dict[str, Any], type[pydantic.ValidationError]]:
    """MESSAGE_TYPES and pydantic's ValidationError, imported once, on the first decode."""
    global _registry
    if _registry is None:
        import pydantic

        from protocol.messages import MESSAGE_TYPES

        _registry = (MESSAGE_TYPES, pydantic.ValidationError)
    return _registry


def check(
    raw: dict[str, Any], expected_version: int = PROTOCOL_VERSION
) -> tuple[str, str | None, int, int | None, dict[str, Any]]:
    """The envelope fields of an unpacked frame, checked: `(t, id, seq, gen, p)`. The payload is
    not looked at: that is the model's job."""
    v = raw["v"]
    if not _is_int(v):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field v must be an integer")
    if v != expected_version:
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"peer speaks protocol version {v}; this side speaks version {expected_version}",
        )
    t, id_, seq, gen, p = raw["t"], raw["id"], raw["seq"], raw["gen"], raw["p"]
    if not isinstance(t, str):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field t must be a string")
    if id_ is not None and (not isinstance(id_, str) or not limits.ID_RE.match(id_)):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field id must be a short id or nil")
    if not _is_int(seq) or seq < 1:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field seq must be an integer >= 1")
    if gen is not None and (not _is_int(gen) or gen < 1):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field gen must be an integer >= 1 or nil")
    if not isinstance(p, dict):
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "envelope field p must be a map")
    return t, id_, seq, gen, p


def unknown_type(t: str) -> ProtocolError:
    shown = t if len(t) <= 40 and t.isprintable() else "(unprintable)"
    return ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {shown!r}")


def decode(
    data: object, expected_version: int = PROTOCOL_VERSION, max_containers: int | None = None
) -> Envelope[Message]:
    t, id_, seq, gen, p = check(unpack(data, max_containers), expected_version)
    return Envelope(msg=validate(t, p), seq=seq, id=id_, gen=gen)


def known_type(t: str) -> None:
    """`ProtocolError` for a type no message has: what a reader that forwards payloads unread
    still refuses (a frame nobody downstream could read is the sender's fault, not the reader's)."""
    if t not in _models()[0]:
        raise unknown_type(t)


def validate(t: str, p: dict[str, Any]) -> Message:
    """The model of payload `p` of type `t` (checked by `check`), or `ProtocolError`."""
    types, validation_error = _models()
    model = types.get(t)
    if model is None:
        raise unknown_type(t)
    try:
        return model.model_validate(p)
    except validation_error as exc:
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"invalid {t} payload: {_describe(exc)}") from None
    except RecursionError:
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"invalid {t} payload: nested too deeply") from None


def _describe(exc: pydantic.ValidationError) -> str:
    """First error location and message, never the input value (it may be a secret or huge)."""
    errs = exc.errors(include_input=False, include_url=False, include_context=False)
    if not errs:
        return "validation failed"
    first = errs[0]
    loc = ".".join(_short(x) for x in first.get("loc", ())) or "(payload)"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {first.get('msg', 'invalid')}{more}"[:300]


def _short(part: object) -> str:
    text = str(part)
    if len(text) > 32 or not text.isprintable():
        return "(field)"
    return text


def chunk_model(run_id: str, stream: str, offset: int, data: memoryview, eof: bool) -> Any:
    """A received chunk as the ends' code reads it: the model, built without validation (the data
    frame's header was checked by `frames.decode`, the names come from our own number table)."""
    from protocol.messages import StreamData

    return StreamData.model_construct(run_id=run_id, stream=stream, offset=offset, data=bytes(data), eof=eof)


MakeChunk = Any
"""`(run_id, stream, offset, payload, eof) -> message`: how an end builds a received chunk."""


class Channel:
    """Per-connection framing state: outbound seq counter, inbound seq and gen checks, and the
    connection's stream numbers (`protocol.frames`).

    Sans-I/O: the shell calls `stamp` before writing and `accept` after reading. A gap, repeat or
    reordering of `seq`, or a frame for another generation, is a `ProtocolError` that closes the
    connection, because nothing after it can be trusted to mean what the peer intended. Data frames
    carry no `seq`: they are ordered by the connection like everything else, and each names its
    stream by a number only this connection gave (`numbers`), which also fences them by generation.
    """

    def __init__(self, max_out: int = limits.MAX_FRAME_BYTES) -> None:
        self._out = 0
        self._in = 0
        self.gen: int | None = None
        self.numbers = frames.Numbers()
        """This connection's stream numbers as the Mind announced them (`stream_numbers`)."""
        self.max_out = max_out
        """The largest frame this side may send: a client's are read by the Mind only up to
        `limits.CLIENT_MAX_FRAME_BYTES`, so a client refuses a larger one itself, with a sentence,
        instead of having its connection closed."""
        self.max_containers: int | None = None
        """The most lists and maps a received frame may hold (the Mind sets it for its clients)."""

    def stamp(self, msg: Message, id: str | None = None) -> bytes:
        """Encode with the next seq. The counter moves only if encoding succeeded, so a frame
        refused as too large leaves no gap for the peer to see. A `stream_data` becomes a data
        frame under its stream's number (no seq)."""
        t = msg.TYPE
        m: Any = msg  # the model or the fast path's `Msg`: read by field name
        if t == "stream_data":
            frame = self.stamp_chunk(m)
            if frame is None:
                raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"run {m.run_id} has ended: its streams are closed")
            return frame
        if t == "result":  # nothing of the run's streams is sent after it; stdin still in flight is dropped
            self.numbers.drop_run(m.run_id)
        return self._stamp_envelope(msg, id)

    def stamp_chunk(self, m: Any) -> bytes | None:
        """A `stream_data` as its data frame; None for a run whose streams died on this connection
        (it ended: what is still sent for it is dropped here, as the Mind would drop it). A stream
        that was never given a number is a bug of the caller: `ProtocolError`."""
        parts = self.stamp_parts(m)
        return None if parts is None else parts[0] + parts[1]

    def stamp_parts(self, m: Any) -> tuple[bytes, bytes | memoryview] | None:
        """`stamp_chunk`, its header and payload unjoined (`frames.parts`)."""
        n = self.numbers.number(m.run_id, m.stream)
        if n is None:
            if self.numbers.ended(m.run_id):
                return None
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD,
                f"no stream number for {m.stream} of run {m.run_id} on this connection",
            )
        return frames.parts(n, m.offset, m.data, m.eof)

    def _stamp_envelope(self, msg: Message, id: str | None) -> bytes:
        return self._counted(msg.TYPE, encode(Envelope(msg=msg, seq=self._out + 1, id=id, gen=self.gen)))

    def stamp_raw(self, t: str, p: dict[str, Any], id: str | None = None) -> bytes:
        """Encode payload map `p` (never a model here) as a `t` envelope with the next seq: a Mind
        node forwarding another node's answer to its client (DESIGN §16, `Outbox.put_raw`). The
        caller checked `t` names a message and is not a `stream_data` (those are data frames)."""
        return self._counted(t, encode_raw(t, id, self._out + 1, self.gen, p))

    def _counted(self, t: str, data: bytes) -> bytes:
        if len(data) > self.max_out:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"a {t} frame of {len(data)} bytes exceeds the {self.max_out} bytes the Mind reads "
                "from a client (large inputs go as stdin: `mind exec` forwards its standard input)",
            )
        self._out += 1
        return data

    def receive(self, data: object) -> Envelope[Message]:
        """One envelope, or a data frame as a `StreamData`, for a strict reader (the handshake, a
        test's raw peer): a frame of a stream that has died is refused here (`receive_any` drops
        it, as a long-lived peer must: a run may end while its last chunks fly)."""
        if frames.is_frame(data):
            env = self.receive_chunk(data, chunk_model)  # type: ignore[arg-type]
            if env is None:
                raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a data frame of a stream that has ended")
            return env
        env = decode(data, max_containers=self.max_containers)
        self.accept(env)
        return env

    def receive_any(self, data: object) -> Envelope[Message] | None:
        """One WebSocket message: an envelope, or a data frame as a `StreamData` (None: a chunk of
        a stream that has died, a late frame of an ended run, dropped)."""
        if frames.is_frame(data):
            return self.receive_chunk(data, chunk_model)  # type: ignore[arg-type]
        try:
            env = decode(data, max_containers=self.max_containers)
        except PayloadRefused as exc:  # answered under its id: its header must be in order too
            if not set(exc.header) >= _KEYS - {"p"}:
                raise ProtocolError(exc.code, exc.message) from None
            t, id_, seq, gen, _ = check({**exc.header, "p": {}})
            self.accept_header(seq, gen)
            exc.header = {"t": t, "id": id_}
            raise
        self.accept(env)
        return env

    def receive_chunk(self, data: bytes | bytearray | memoryview, make: MakeChunk) -> Envelope[Any] | None:
        """A data frame as the chunk `make` builds, under the envelope id its stream's run travels
        under; None for a number that has died; `ProtocolError` for a bad header or a number this
        connection never gave."""
        number, offset, eof, payload = frames.decode(data)
        entry = self.numbers.lookup(number)
        if entry is None:
            return None
        if self.gen is None:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a data frame before the handshake ended")
        msg = make(entry.run_id, entry.stream, offset, payload, eof)
        return Envelope(msg=msg, seq=self._in, id=entry.env_id, gen=self.gen)

    def accept(self, env: Envelope[Message]) -> None:
        self.accept_header(env.seq, env.gen)
        got: Any = env.msg
        t = got.TYPE
        if t == "stream_numbers":
            self.numbers.bind(got.run_id, frames.announced(got), env.id)
        elif t == "run_end":
            self.numbers.drop_run(got.run_id)

    def accept_header(self, seq: int, gen: int | None) -> None:
        """The envelope's own checks (seq, generation), for a frame whose payload this side
        forwards unread (a node relaying answers, DESIGN §16: it binds none of their stream
        numbers here, it renumbers them itself)."""
        if seq != self._in + 1:
            raise ProtocolError(ErrorCode.SEQ_VIOLATION, f"expected frame seq {self._in + 1}, got {seq}")
        self._in = seq
        if self.gen is not None and gen != self.gen:
            raise ProtocolError(ErrorCode.GEN_MISMATCH, f"frame for generation {gen} on generation {self.gen}")
