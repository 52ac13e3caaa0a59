"""One authenticated connection to the Mind for one CLI command: blocking, no asyncio, no pydantic.

Why it exists: a `mind exec` used to spend four fifths of its wall time importing asyncio,
websockets, pydantic and building every message model, to exchange a dozen small frames. This thin
shell around `mind/client/ws.py` (framing) and `mind/client/wire.py` (payload checks) keeps every check the full
client (`mind/client/aio.py`) makes:
- TLS: the same `protocol.tls.client_context` (system trust or `--ca`, TLS >= 1.2, hostname) and
  `check_pin`, done right after the TLS handshake, before a byte of ours is sent;
- the handshake: `protocol.auth.ClientHandshake` itself (the same transcript, our MAC, and the
  check of the Mind's MAC); only its two outgoing messages are built by `wire` instead of pydantic;
- every frame received: `protocol.envelope`'s checks (version, keys, seq, gen) and `wire`'s payload
  checks (types, bounds, states) before anything reads it; a bad frame ends the connection;
- keepalive like the full client's: a ping every 20 s, the connection is dead if no pong in 20 s.

The shell waits in one `select` on the socket and, optionally, a wakeup fd (a signal arrived), so a
caller's loop can react to Ctrl-C and to its own timers without threads.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from mind.client import wire
from mind.errors import ClientError
from mind.client.ws import CLOSED, MESSAGE, PONG, WsClient, WsError
from protocol import limits
from protocol.auth import ClientHandshake, Credential
from protocol.envelope import Channel, Envelope
from protocol.errors import ProtocolError

PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
WRITE_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 2.0


class _Handshake(ClientHandshake):
    """`ClientHandshake` with its two messages built without pydantic (see protocol/auth.py)."""

    _hello_msg = staticmethod(wire.hello)  # type: ignore[assignment]
    _proof_msg = staticmethod(wire.proof)  # type: ignore[assignment]


def _raise_if_error(msg: Any) -> None:
    if msg.TYPE == "error":
        raise ClientError(msg.code.value, msg.message)


def _parse_url(url: str) -> tuple[bool, str, int, str, str]:
    """`(tls, host, port, host header, path)`; ValueError with the reason for a bad URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError("scheme isn't ws or wss")
    if not parts.hostname:
        raise ValueError("hostname isn't provided")
    if parts.fragment:
        raise ValueError("fragment identifier is meaningless")
    if parts.username is not None or parts.password is not None:
        raise ValueError("user information is not supported")
    tls = parts.scheme == "wss"
    port = parts.port or (443 if tls else 80)  # .port raises ValueError for a bad one
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    header = shown if port == (443 if tls else 80) else f"{shown}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return tls, host, port, header, path


class Link:
    """`connect` (TCP, TLS and pin, upgrade, handshake), then `send` and `poll`, then `close`."""

    def __init__(self, sock: socket.socket, ws: WsClient, tls: bool) -> None:
        self._sock = sock
        self._ws = ws
        self._channel = Channel()
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ)
        self._wakeups: list[int] = []
        self._would_block: tuple[type[BaseException], ...] = (BlockingIOError, InterruptedError)
        if tls:
            import ssl

            self._would_block += (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        self._tls = tls
        self._inbox: list[Envelope[Any]] = []
        self._error: ClientError | None = None  # the connection is over: raised by poll and send
        self._write_error: ClientError | None = None  # writing failed; what the Mind sent may still be read
        self._aborted = False
        self._reason: ClientError | None = None  # an id-less `error` from the Mind: why it closes
        now = time.monotonic()
        self._ping_due = now + PING_INTERVAL_S
        self._ping: tuple[bytes, float] | None = None
        self.label = ""

    # --- connecting ---

    @classmethod
    def connect(
        cls,
        url: str,
        credential: Credential,
        *,
        ca: str | None = None,
        pin: str | None = None,
        open_timeout: float = 10.0,
    ) -> "Link":
        """Connect and authenticate, as `MindClient.connect` does (same checks, same errors)."""
        if credential.role != "client":
            raise ClientError("auth_failed", f"a {credential.role} credential cannot be used by a client")
        try:
            tls, host, port, header, path = _parse_url(url)
        except ValueError as exc:
            raise ClientError(
                "unreachable", f"cannot reach the Mind at {url}: {url} isn't a valid URI: {exc}"
            ) from None
        ctx = None
        if tls or ca or pin:
            from protocol.io.tls import TLSConfigError, client_context

            try:
                ctx = client_context(url, ca, pin)
            except TLSConfigError as exc:
                raise ClientError("config", str(exc)) from None
        link = cls._open(url, host, port, header, path, ctx, pin, open_timeout)
        try:
            link._handshake(credential)
        except BaseException:
            link.abort()
            raise
        return link

    @classmethod
    def _open(
        cls, url: str, host: str, port: int, header: str, path: str, ctx: Any, pin: str | None, timeout: float
    ) -> "Link":
        deadline = time.monotonic() + timeout
        sock: socket.socket | None = None
        try:
            # an ASCII host as bytes: a str would load the idna codec just to encode it
            sock = socket.create_connection((host.encode() if host.isascii() else host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ctx is not None:
                import ssl

                from protocol.io.tls import TLSConfigError, check_pin

                sock.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    sock = ctx.wrap_socket(sock, server_hostname=host)
                except ssl.SSLCertVerificationError as exc:
                    raise ClientError(
                        "tls", f"the Mind at {url} failed certificate verification: {exc.verify_message}"
                    ) from None
                try:
                    check_pin(sock, pin)  # type: ignore[arg-type]
                except TLSConfigError as exc:
                    raise ClientError("tls", str(exc)) from None
            ws = WsClient(header, path, limits.MAX_FRAME_BYTES)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(ws.data_to_send())
            while ws.state == "connecting":
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(1 << 16)
                if data:
                    ws.receive_data(data)
                else:
                    ws.receive_eof()
            sock.setblocking(False)
            link = cls(sock, ws, ctx is not None)
            leftover = ws.events()
            if leftover:
                link._on_events(leftover)
            return link
        except ClientError:
            if sock is not None:
                sock.close()
            raise
        except (OSError, WsError) as exc:
            if sock is not None:
                sock.close()
            why = (
                "timed out during opening handshake"
                if isinstance(exc, TimeoutError)
                else (exc.message if isinstance(exc, WsError) else str(exc))
            )
            raise ClientError("unreachable", f"cannot reach the Mind at {url}: {why}") from None

    def _handshake(self, credential: Credential) -> None:
        hs = _Handshake(credential, os.urandom(limits.NONCE_BYTES))
        deadline = time.monotonic() + limits.HANDSHAKE_TIMEOUT_S
        try:
            try:
                self.send(hs.hello())
            except ClientError:
                pass  # refused before it read our hello (busy, rate limited): its reason is queued
            msg = self._next(deadline)
            _raise_if_error(msg)
            if msg.TYPE != "challenge":
                raise ClientError("protocol", f"expected challenge, got {msg.TYPE}")
            self.send(hs.on_challenge(msg))
            msg = self._next(deadline)
            _raise_if_error(msg)
            if msg.TYPE != "welcome":
                raise ClientError("protocol", f"expected welcome, got {msg.TYPE}")
            self._channel.gen = hs.on_welcome(msg)
        except ProtocolError as exc:
            raise ClientError(exc.code.value, exc.message) from None
        self.label = credential.label

    def _next(self, deadline: float) -> Any:
        """The next frame of the handshake (all of them have no id), within the deadline."""
        while not self._inbox:
            if self._error is not None:
                why = self._error.message
                raise ClientError("closed", f"the Mind closed the connection during the handshake ({why})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientError("handshake_timeout", "the Mind did not complete the handshake in time")
            self._wait(left)
        return self._inbox.pop(0).msg

    # --- after the handshake ---

    def add_wakeup(self, fd: int) -> None:
        """`poll` also returns (early, with nothing) when `fd` becomes readable; it drains it."""
        self._sel.register(fd, selectors.EVENT_READ)
        self._wakeups.append(fd)

    def remove_wakeup(self, fd: int) -> None:
        if fd in self._wakeups:
            self._wakeups.remove(fd)
            if not self._aborted:
                self._sel.unregister(fd)

    def send(self, msg: Any, id_: str | None = None) -> None:
        if self._error is not None:
            raise self._error
        try:
            self._ws.send_binary(self._channel.stamp(msg, id_))
        except WsError:
            raise ClientError("closed", "connection to the Mind closed") from None
        self._flush()
        if self._write_error is not None:
            raise self._write_error

    def poll(self, timeout: float | None) -> list[Envelope[Any]]:
        """Frames with an id that arrived, validated and in order. `[]` when `timeout` passed or a
        wakeup fd fired. Raises `ClientError` once the connection is gone (after the frames that
        came before the end were returned)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._inbox:
                out, self._inbox = self._inbox, []
                return out
            if self._error is not None:
                raise self._error
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            if self._wait(left):
                return []

    def close(self) -> None:
        """The closing handshake, bounded: close frame, then wait for the Mind to end the TCP
        connection (it answers in one round trip), then the socket."""
        if self._error is None and self._ws.state == "open":
            self._ws.send_close()
            self._flush()
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while self._error is None and (left := deadline - time.monotonic()) > 0:
                self._wait(left, keepalive=False)
        self.abort()

    def abort(self) -> None:
        if not self._aborted:
            self._aborted = True
            self._sel.close()
            self._sock.close()
        if self._error is None:
            self._error = ClientError("closed", "connection to the Mind closed")

    # --- the loop ---

    def _wait(self, timeout: float | None, keepalive: bool = True) -> bool:
        """Wait for data (or a wakeup) once; handle what came. True if a wakeup fd fired."""
        if keepalive:
            timeout = self._keepalive(timeout)
        if self._tls and self._sock.pending():  # type: ignore[attr-defined]
            ready = [(selectors.SelectorKey(self._sock, self._sock.fileno(), selectors.EVENT_READ, None), 0)]
        else:
            ready = self._sel.select(timeout)
        woke = False
        for key, _ in ready:
            if key.fileobj is self._sock:
                self._read()
            else:
                woke = True
                try:
                    while os.read(key.fd, 512):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
        self._flush()
        return woke

    def _keepalive(self, timeout: float | None) -> float | None:
        now = time.monotonic()
        if self._ping is not None and now >= self._ping[1]:
            self._fail(ClientError("closed", "the Mind stopped answering (keepalive ping timed out)"))
            return 0
        if self._ping is None and now >= self._ping_due and self._error is None and self._ws.state == "open":
            payload = os.urandom(4)
            self._ws.send_ping(payload)
            self._ping = (payload, now + PING_TIMEOUT_S)
        due = self._ping[1] if self._ping is not None else self._ping_due
        wait = max(0.0, due - now)
        return wait if timeout is None else min(timeout, wait)

    def _read(self) -> None:
        for _ in range(32):  # at most ~2 MiB per wakeup, so the caller's loop keeps its turn
            if self._error is not None:
                return
            try:
                data = self._sock.recv(1 << 16)
            except self._would_block:
                return
            except OSError as exc:
                self._fail(ClientError("closed", f"connection to the Mind failed: {exc}"))
                return
            try:
                if data:
                    self._ws.receive_data(data)
                else:
                    self._ws.receive_eof()
            except WsError as exc:
                self._ws.send_close(exc.code, exc.message)
                self._fail(ClientError("closed", f"the Mind broke the WebSocket protocol: {exc.message}"))
                return
            self._on_events(self._ws.events())
            if not data:
                return

    def _on_events(self, events: list[tuple]) -> None:
        for ev in events:
            if self._error is not None:
                return
            if ev[0] == MESSAGE:
                self._on_frame(ev[1])
            elif ev[0] == PONG:
                if self._ping is not None and ev[1] == self._ping[0]:
                    self._ping = None
                    self._ping_due = time.monotonic() + PING_INTERVAL_S
            elif ev[0] == CLOSED:
                self._fail(self._reason or ClientError("closed", "connection to the Mind closed"))

    def _on_frame(self, data: bytes | str) -> None:
        try:
            env = wire.decode(data)
            self._channel.accept(env)
        except ProtocolError as exc:
            self._ws.send_close(1002, exc.code.value)
            self._fail(ClientError(exc.code.value, f"the Mind sent a bad frame: {exc.message}"))
            return
        if env.id is None and self._channel.gen is not None:
            if env.msg.TYPE == "error":  # about the connection: the reason it is about to close
                self._reason = ClientError(env.msg.code.value, env.msg.message)
            return
        self._inbox.append(env)

    def _flush(self) -> None:
        data = self._ws.data_to_send()
        if not data or self._write_error is not None or self._aborted:
            return
        try:
            self._sock.settimeout(WRITE_TIMEOUT_S)
            try:
                self._sock.sendall(data)
            finally:
                self._sock.setblocking(False)
        except OSError as exc:
            self._write_error = ClientError("closed", f"connection to the Mind failed: {exc}")

    def _fail(self, err: ClientError) -> None:
        if self._error is None:
            self._error = err
