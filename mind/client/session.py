"""A client's session with the Mind, sans-I/O: the part of a client both shells share.

Two shells talk to the Mind: `MindClient` (mind/client/aio.py: asyncio, `websockets`, the pydantic
models) and `Link` (mind/client/blocking.py: one blocking socket, for `mind exec`'s fast path). What
they must agree on is written once, here, and tested without a socket (tests/mind/test_session.py):
- the handshake's order: our `hello`, the Mind's `challenge`, our `proof`, the Mind's `welcome`,
  whose MAC proves it holds the same secret (`protocol.auth.ClientHandshake`); anything else in
  between ends the session;
- the envelope's checks on every frame (`protocol.envelope.Channel`: seq, generation);
- request ids, the routing of each reply to the request that asked for it, and of each run event
  (`run_update`, `run_output`, `run_end`) to the run it belongs to, with the check that one run's
  events name one run id;
- what becomes of `error` frames, bad frames and an ended connection: `ClientError(code, message)`.

It does no I/O and reads no clock. A shell writes each frame `data_to_send` returns (in order),
feeds each message it reads to `receive_data` (or `connection_lost` when the transport ends, or
`handshake_timed_out` when its deadline passes), and acts on the events those return. Every run and
request it was told about gets exactly one last event (`Reply`, `RunEnded` or `Failed`), in
whatever order frames arrive and however the connection ends; `Closed` comes last of all.

The message types are the caller's choice: `decode` and `handshake` are the pydantic ones by
default (`protocol.envelope.decode`, `ClientHandshake`); the fast path passes `mind.client.wire`'s,
which read the same frames without pydantic. Either way, this code only reads `TYPE` and fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mind.errors import ClientCode, ClientError
from protocol import frames, limits
from protocol.auth import ClientHandshake, Credential
from protocol.codes import ErrorCode
from protocol.envelope import Channel, Envelope, MakeChunk, chunk_model
from protocol.envelope import decode as decode_envelope
from protocol.errors import ProtocolError
from protocol.ids import named_run, new_id
from protocol.record import Frozen

CLOSE_PROTOCOL_ERROR = 1002  # the WebSocket close code for a peer that broke the protocol

AWAIT_CHALLENGE, AWAIT_WELCOME, OPEN, CLOSED = "await_challenge", "await_welcome", "open", "closed"
RUN_EVENTS = frozenset(
    {
        "run_update",
        "run_output",
        "stream_numbers",
        "stream_data",
        "stream_ack",
        "stream_resume",
        "attached",
        "replaced",
        "run_end",
    }
)
"""A run's events, under the id of the request that holds the run: its `exec` (a streamed run's
`stream_numbers` first: it was admitted, and its stdin may go), or the `attach` that took it over
(whose answer, `attached`, comes first; `replaced` ends it: a newer attachment won)."""


# --- what happened (returned by the session's inputs) -----------------------------------------


class Event(Frozen):
    __slots__ = ()


class Opened(Event):
    """The handshake is done: requests and runs may be sent."""

    __slots__ = ("gen",)
    gen: int

    def __init__(self, gen: int) -> None:
        object.__setattr__(self, "gen", gen)


class Reply(Event):
    """The answer to request `id`, of the type it expects."""

    __slots__ = ("id", "msg")
    id: str
    msg: Any

    def __init__(self, id: str, msg: Any) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "msg", msg)


class RunEvent(Event):
    """A `run_update`, `run_output`, `stream_data`, `stream_ack`, `stream_resume` or `attached` of
    run `id` (more follow)."""

    __slots__ = ("id", "msg")
    id: str
    msg: Any

    def __init__(self, id: str, msg: Any) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "msg", msg)


class RunEnded(Event):
    """The `run_end` of run `id`: its last event."""

    __slots__ = ("id", "msg")
    id: str
    msg: Any

    def __init__(self, id: str, msg: Any) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "msg", msg)


class Failed(Event):
    """Request or run `id` ended without its answer: the Mind refused it (an `error` frame) or
    broke its rules (`protocol`), or, when `lost`, the connection ended first, so nobody here can
    know what became of it."""

    __slots__ = ("id", "error", "lost")
    id: str
    error: ClientError
    lost: bool

    def __init__(self, id: str, error: ClientError, lost: bool = False) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "lost", lost)


class Closed(Event):
    """The session is over: `error` says why. With a `close_code`, the shell closes the WebSocket
    with it (and `close_reason`): the Mind sent a frame that cannot be trusted."""

    __slots__ = ("error", "close_code", "close_reason")
    error: ClientError
    close_code: int | None
    close_reason: str

    def __init__(self, error: ClientError, close_code: int | None = None, close_reason: str = "") -> None:
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "close_code", close_code)
        object.__setattr__(self, "close_reason", close_reason)


Routed = Reply | RunEvent | RunEnded | Failed  # the events about one request or run (`.id`)


class _Waiting:
    """What the session knows of one request or run in flight."""

    __slots__ = ("sent", "reply", "run_id")

    def __init__(self, sent: str, reply: str | None) -> None:
        self.sent = sent  # the request's type
        self.reply = reply  # the reply type it expects; None for a run
        self.run_id: str | None = None  # a run's id, from its first event


# --- the session ---------------------------------------------------------------------------------


class ClientSession:
    def __init__(
        self,
        credential: Credential,
        nonce: bytes,
        *,
        decode: Callable[[object], Envelope[Any]] = decode_envelope,
        handshake: type[ClientHandshake] = ClientHandshake,
        chunk: MakeChunk = chunk_model,
    ) -> None:
        """The `hello` is ready to send at once (`data_to_send`). Raises `ClientError` for a
        credential no client may use, before anything is sent."""
        if credential.role != "client":
            raise ClientError(ErrorCode.AUTH_FAILED, f"a {credential.role} credential cannot be used by a client")
        self.label = credential.label
        self.state = AWAIT_CHALLENGE
        self.gen: int | None = None
        self.resume_window_s = 0.0
        """The Mind's resume window (its `welcome`): how long a run waits for this client to come
        back after a cut (DESIGN §15). 0: a cut ends the runs."""
        self.ping_interval_s: float | None = None
        self.tools: tuple[str, ...] | None = None
        """The tool patterns this credential may call, as the Mind's `welcome` said (None: not said)."""
        self.run_ids: str | None = None
        """The prefix of the run ids this connection may name (its `welcome`'s; None: not offered)."""
        self._named = 0
        self.error: ClientError | None = None  # set once the session is over
        self._decode = decode
        self._chunk = chunk
        """How a received data frame becomes the run's `stream_data` event (the model, or the fast
        path's `Msg`)."""
        self._hs = handshake(credential, nonce)
        self._channel = Channel(max_out=limits.CLIENT_MAX_FRAME_BYTES)
        self._out: list[bytes | tuple[bytes, bytes | memoryview]] = [self._channel.stamp(self._hs.hello())]
        self._waiting: dict[str, _Waiting] = {}
        self._reason: ClientError | None = None  # an id-less `error`: why the Mind is about to close

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    # --- the shell's side: output ---

    def data_to_send(self) -> list[bytes]:
        """The frames to write, in this order (each one binary WebSocket message)."""
        return [f if isinstance(f, bytes) else f[0] + f[1] for f in self.frames_to_send()]

    def frames_to_send(self) -> list[bytes | tuple[bytes, bytes | memoryview]]:
        """`data_to_send` with each stream chunk as its header and payload, unjoined: a writer
        that frames them itself (the blocking client's) copies the payload once."""
        out, self._out = self._out, []
        return out

    def expect_run(self, id: str | None = None) -> str:
        """Route the events sent under `id` (a new one if None) to a run; send its `exec` next."""
        self._require_open()
        id = id or new_id("x")
        self._waiting[id] = _Waiting("exec", None)
        return id

    def expect_reply(self, sent: str, reply: str, id: str | None = None) -> str:
        """Route the answer to request `id` (a new one if None), which must be a `reply` (or an
        `error`); send the `sent` request next."""
        self._require_open()
        id = id or new_id("q")
        self._waiting[id] = _Waiting(sent, reply)
        return id

    def send(self, msg: Any, id: str | None = None) -> None:
        """Queue `msg` under envelope `id`. `ClientError` if the session is over or the message
        cannot be sent (too large: nothing is queued and no sequence number is spent)."""
        self._require_open()
        try:
            if msg.TYPE == "stream_data":  # a data frame; none for a run that has ended (dropped)
                if (parts := self._channel.stamp_parts(msg)) is not None:
                    self._out.append(parts)
                return
            self._out.append(self._channel.stamp(msg, id))
        except ProtocolError as exc:
            raise ClientError(exc.code, exc.message) from None

    def start_run(self, msg: Any) -> str:
        """`expect_run` and `send` in one: the id whose events will be the run's."""
        id = self.expect_run()
        try:
            self.send(msg, id)
        except ClientError:
            self.forget(id)
            raise
        return id

    def request(self, msg: Any, reply: str) -> str:
        """`expect_reply` and `send` in one: the id whose answer will be the request's."""
        id = self.expect_reply(msg.TYPE, reply)
        try:
            self.send(msg, id)
        except ClientError:
            self.forget(id)
            raise
        return id

    def name_run(self) -> str | None:
        """A fresh run id for an `exec` on this connection (`Exec.run_id`), known before the Mind
        answers: a call that names it and neither watches nor streams is answered by its `run_end`
        alone. None where the Mind offered no prefix (an older Mind)."""
        if self.run_ids is None:
            return None
        self._named += 1
        return named_run(self.run_ids, self._named)

    def forget(self, id: str) -> None:
        """Nobody waits for `id` any more (given up on, or never sent): what still comes for it is
        dropped, and it gets no last event."""
        self._waiting.pop(id, None)

    def _require_open(self) -> None:
        if self.error is not None:
            raise self.error
        if self.state != OPEN:
            raise ClientError(ClientCode.PROTOCOL, "the handshake with the Mind is not complete")

    # --- the shell's side: input ---

    def receive_data(self, data: object) -> list[Event]:
        """One WebSocket message from the Mind."""
        if self.state == CLOSED:
            return []
        try:
            if frames.is_frame(data):  # a run's bytes (DESIGN §11b): no seq, named by its stream number
                chunk = self._channel.receive_chunk(data, self._chunk)  # type: ignore[arg-type]
                if chunk is None or self.state != OPEN:
                    return []
                waiting = self._waiting.get(chunk.id) if chunk.id is not None else None
                return self._run_event(chunk.id, waiting, chunk.msg) if waiting is not None else []  # type: ignore[arg-type]
            env = self._decode(data)
        except ProtocolError as exc:
            return self._bad_frame(exc)
        return self.receive_frame(env)

    def chunk(self, data: object) -> Envelope[Any] | None:
        """A data frame as its run's `stream_data` under the run's envelope id, for a shell that
        routes a run's messages itself (`MindClient`); None: a stream that has died, or before the
        session is open. `ProtocolError` for a bad frame (then `receive_data` ends the session)."""
        if self.state != OPEN:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a data frame before the handshake ended")
        return self._channel.receive_chunk(data, self._chunk)  # type: ignore[arg-type]

    def receive_frame(self, env: Envelope[Any]) -> list[Event]:
        """One decoded frame (what `receive_data` does after decoding)."""
        if self.state == CLOSED:
            return []
        try:
            self._channel.accept(env)
        except ProtocolError as exc:
            return self._bad_frame(exc)
        if self.state != OPEN:
            return self._handshake(env.msg)
        msg = env.msg
        if msg.TYPE == "stream_numbers":  # the channel took them: the run's data frames name streams by them
            waiting = self._waiting.get(env.id) if env.id is not None else None
            if env.id is None or waiting is None or waiting.reply is not None:  # (an `attach`: `attached` follows)
                return []
            # a run's: it was admitted, and its stdin may go now (a named run hears nothing else first)
            return self._run_event(env.id, waiting, msg)
        if env.id is None:  # about the connection
            if msg.TYPE == "error":
                self._reason = ClientError(msg.code, msg.message)
            return []
        waiting = self._waiting.get(env.id)
        if waiting is None:
            return []  # a late answer to something given up on, or nothing we asked for
        if msg.TYPE == "error":
            del self._waiting[env.id]
            return [Failed(env.id, ClientError(msg.code, msg.message))]
        if waiting.reply is not None:
            del self._waiting[env.id]
            if msg.TYPE != waiting.reply:
                why = f"expected {waiting.reply} in reply to {waiting.sent}, got {msg.TYPE}"
                return [Failed(env.id, ClientError(ClientCode.PROTOCOL, why))]
            return [Reply(env.id, msg)]
        return self._run_event(env.id, waiting, msg)

    def accept_forwarded(self, seq: int, gen: int | None) -> None:
        """The envelope checks `receive_frame` makes (seq, generation), for a frame whose payload
        is forwarded unread: a Mind node relaying another node's answers (mind/daemon/route.py),
        whose client reads them. A bad one ends the session as a bad frame does, and raises."""
        if self.state != OPEN:
            raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a frame to forward before the handshake ended")
        try:
            self._channel.accept_header(seq, gen)
        except ProtocolError as exc:
            self._bad_frame(exc)
            raise

    def connection_lost(self, error: ClientError | None = None) -> list[Event]:
        """The transport ended (or the shell ended it). `error` says how, when the shell knows
        better than "closed" (a keepalive timeout, a socket error); a reason the Mind gave first
        wins over it."""
        if self.state == CLOSED:
            return []
        if self.state != OPEN:
            why = error.message if error is not None else "connection closed"
            return self._end(
                ClientError(ClientCode.CLOSED, f"the Mind closed the connection during the handshake ({why})")
            )
        return self._end(self._reason or error or ClientError(ClientCode.CLOSED, "connection to the Mind closed"))

    def handshake_timed_out(self) -> list[Event]:
        """The shell's handshake deadline (`limits.HANDSHAKE_TIMEOUT_S`) passed."""
        if self.state in (OPEN, CLOSED):
            return []
        return self._end(ClientError(ErrorCode.HANDSHAKE_TIMEOUT, "the Mind did not complete the handshake in time"))

    # --- the rules ---

    def _handshake(self, msg: Any) -> list[Event]:
        if msg.TYPE == "error":  # refused: busy, rate limited, wrong credential
            return self._end(ClientError(msg.code, msg.message))
        want = "challenge" if self.state == AWAIT_CHALLENGE else "welcome"
        if msg.TYPE != want:
            return self._end(ClientError(ClientCode.PROTOCOL, f"expected {want}, got {msg.TYPE}"))
        try:
            if want == "challenge":
                self._out.append(self._channel.stamp(self._hs.on_challenge(msg)))
                self.state = AWAIT_WELCOME
                return []
            self.gen = self._channel.gen = self._hs.on_welcome(msg)  # checks the Mind's MAC
        except ProtocolError as exc:
            return self._end(ClientError(exc.code, exc.message))
        self.resume_window_s = float(getattr(msg, "resume_window_s", 0.0) or 0.0)
        tools = getattr(msg, "tools", None)
        self.tools = tuple(tools) if tools is not None else None
        self.ping_interval_s = getattr(msg, "ping_interval_s", None)
        self.run_ids = getattr(msg, "run_ids", None)
        self._named = 0
        self.state = OPEN
        return [Opened(self.gen)]

    def _run_event(self, id: str, waiting: _Waiting, msg: Any) -> list[Event]:
        if msg.TYPE not in RUN_EVENTS:
            del self._waiting[id]
            return [Failed(id, ClientError(ClientCode.PROTOCOL, f"the Mind answered a run with {msg.TYPE}"))]
        if waiting.run_id is None:
            waiting.run_id = msg.run_id
        elif msg.run_id != waiting.run_id:
            del self._waiting[id]
            why = f"the Mind sent events of run {msg.run_id} for run {waiting.run_id}"
            return [Failed(id, ClientError(ClientCode.PROTOCOL, why))]
        if msg.TYPE == "run_end":
            del self._waiting[id]
            return [RunEnded(id, msg)]
        if msg.TYPE == "replaced":
            del self._waiting[id]
            why = f"another attachment took run {msg.run_id} over (mind attach): this one gets nothing more of it"
            return [Failed(id, ClientError(ErrorCode.REPLACED, why))]
        return [RunEvent(id, msg)]

    def _bad_frame(self, exc: ProtocolError) -> list[Event]:
        """Nothing after a frame that breaks the rules can be trusted to mean what the Mind meant."""
        error = ClientError(exc.code, f"the Mind sent a bad frame: {exc.message}")
        return self._end(error, CLOSE_PROTOCOL_ERROR, exc.code.value)

    def _end(self, error: ClientError, close_code: int | None = None, close_reason: str = "") -> list[Event]:
        self.state = CLOSED
        self.error = error
        self._out.clear()
        events: list[Event] = [Failed(id, error, lost=True) for id in self._waiting]
        self._waiting.clear()
        events.append(Closed(error, close_code, close_reason))
        return events
