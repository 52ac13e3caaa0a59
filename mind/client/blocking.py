"""One authenticated connection to the Mind for one CLI command: blocking, no asyncio, no pydantic.

Why it exists: a `mind exec` used to spend four fifths of its wall time importing asyncio,
websockets, pydantic and building every message model, to exchange a dozen small frames. This is
a thin shell: the rules are shared with the full client (`mind/client/aio.py`), only the I/O is its
own.
- URL, TLS and pin: `mind/client/endpoint.py`, as the full client (the pin is checked right after
  the TLS handshake, before a byte of ours is sent);
- the handshake, request ids, the routing of replies and run events, and what an `error` frame or
  a lost connection means: `mind/client/session.py`, the same session core as the full client's;
- framing: `mind/client/ws.py` (sans-I/O RFC 6455); payloads: `mind/client/wire.py` (checks
  generated from protocol/messages.py), so every frame is checked before anything reads it;
- keepalive like the full client's: a ping every 20 s, the connection is dead if no pong in 20 s;
  when the Mind keeps runs for a resume window (DESIGN §15), every quarter window (at most the
  Mind's own ping interval), so a silent link is noticed while there is still time to come back.

The shell waits in one `select` on the socket and, optionally, a wakeup fd (a signal arrived), so a
caller's loop can react to Ctrl-C and to its own timers without threads.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from mind.client import wire
from mind.client.endpoint import Endpoint, check_pin, parse_url, tls_context, unreachable, verification_failed
from mind.client.session import ClientSession, Closed, Event, Failed, Reply, Routed, RunEnded, RunEvent
from mind.client.ws import CLOSED, MESSAGE, PONG, WsClient, WsError
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.auth import Credential
from protocol.io.buffers import IOV_MAX, unsent
from protocol.urls import Rotation, split_urls

MOVE_ON = frozenset({ClientCode.UNREACHABLE, ClientCode.CLOSED, "busy", "internal_error"})
"""Failures of one Mind node another may not share: the next URL is tried at once (as mind.client.dial)."""
_ROTATIONS: dict[str, Rotation] = {}
"""Per URL list, for this process: a reconnection starts from the node that last worked."""

PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
WRITE_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 2.0


def send_buffers(sock: socket.socket, buffers: list[bytes]) -> None:
    """`sendall` of the buffers in order, with one `sendmsg` (scatter-gather) where it can, so a
    frame's header and its payload are never joined into a new object; a TLS socket has no
    `sendmsg`: joined, then. A partial send goes on from where it stopped."""
    if len(buffers) == 1 or not hasattr(sock, "sendmsg") or type(sock) is not socket.socket:
        sock.sendall(b"".join(buffers))
        return
    pending = [b for b in buffers if b]
    while pending:
        pending = unsent(pending, sock.sendmsg(pending[:IOV_MAX]))


class Link:
    """`connect` (TCP, TLS and pin, upgrade, handshake), then `start_run` / `request` and `poll`,
    then `close`."""

    def __init__(self, sock: socket.socket, ws: WsClient, tls: bool, session: ClientSession) -> None:
        self._sock = sock
        self._ws = ws
        self._session = session
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ)
        self._wakeups: list[int] = []
        self._watched: set[int] = set()
        self._readable: set[int] = set()
        self._would_block: tuple[type[BaseException], ...] = (BlockingIOError, InterruptedError)
        if tls:
            import ssl

            self._would_block += (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        self._tls = tls
        self._events: list[Routed] = []  # what the session said, for `poll`
        self._error: ClientError | None = None  # the connection is over: raised by poll and send
        self._write_error: ClientError | None = None  # writing failed; what the Mind sent may still be read
        self._aborted = False
        self._heap_kept = False
        """glibc's thresholds fixed (`heap.keep_large_buffers`): at the first large message, so a
        short run never pays for importing ctypes (~3 ms)."""
        now = time.monotonic()
        self._ping_every = PING_INTERVAL_S
        self._ping_due = now + PING_INTERVAL_S
        self._ping: tuple[bytes, float] | None = None
        self.label = session.label
        self.last_heard = now
        """When the Mind last sent us anything (a resume window counts from there)."""

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
        handshake_timeout: float = limits.HANDSHAKE_TIMEOUT_S,
        patience: Callable[[Exception, float], float | None] | None = None,
    ) -> Link:
        """Connect and authenticate, as `MindClient.connect` does (same checks, same errors).
        A reconnection within a resume window passes shorter timeouts: what is left of it.
        `url` may name several Mind nodes (a comma list): the rotation of `mind.client.dial`."""
        rotation = _ROTATIONS.get(url)
        if rotation is None:
            rotation = _ROTATIONS[url] = Rotation(split_urls(url) or [url])
        while True:
            try:
                link = cls._connect_one(rotation.current, credential, ca, pin, open_timeout, handshake_timeout)
            except ClientError as exc:
                if exc.code in MOVE_ON and rotation.failed():
                    continue
                pause = patience(exc, 0.0) if patience is not None else None
                if pause is None:
                    raise
                time.sleep(pause)  # every node tried: wait for one (`patience` says how long, or no more)
                continue
            rotation.worked()
            return link

    @classmethod
    def _connect_one(
        cls,
        url: str,
        credential: Credential,
        ca: str | None,
        pin: str | None,
        open_timeout: float,
        handshake_timeout: float,
    ) -> Link:
        session = ClientSession(
            credential, os.urandom(limits.NONCE_BYTES), decode=wire.decode, handshake=wire.Handshake, chunk=wire.chunk
        )
        where = parse_url(url)
        link = cls._open(where, tls_context(url, ca, pin), pin, open_timeout, session)
        try:
            link._handshake(handshake_timeout)
        except BaseException:
            link.abort()
            raise
        link._tune_keepalive()
        return link

    def name_run(self) -> str | None:
        """A fresh name for the next `exec` on this link (`ClientSession.name_run`; None: the Mind
        offered none)."""
        return self._session.name_run()

    @property
    def resume_window(self) -> float:
        """The Mind's resume window, from its `welcome` (0: a cut ends the runs)."""
        return self._session.resume_window_s

    def _tune_keepalive(self) -> None:
        window = self._session.resume_window_s
        if window > 0:
            every = min(PING_INTERVAL_S, max(0.25, window / 4))
            if self._session.ping_interval_s:
                every = min(every, max(0.25, float(self._session.ping_interval_s)))
            self._ping_every = every
            self._ping_due = min(self._ping_due, time.monotonic() + every)

    @classmethod
    def _open(cls, where: Endpoint, ctx: Any, pin: str | None, timeout: float, session: ClientSession) -> Link:
        deadline = time.monotonic() + timeout
        sock: socket.socket | None = None
        try:
            # an ASCII host as bytes: a str would load the idna codec just to encode it (getaddrinfo takes
            # bytes; typeshed's address type says str only)
            address = (where.host.encode() if where.host.isascii() else where.host, where.port)
            sock = socket.create_connection(address, timeout=timeout)  # type: ignore[arg-type]
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ctx is not None:
                import ssl

                sock.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    sock = ctx.wrap_socket(sock, server_hostname=where.host)
                except ssl.SSLCertVerificationError as exc:
                    raise verification_failed(where.url, exc) from None
                check_pin(sock, pin)
            ws = WsClient(where.header, where.path, limits.MAX_FRAME_BYTES)
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
            link = cls(sock, ws, ctx is not None, session)
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
            raise unreachable(where.url, why) from None

    def _handshake(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            self._write()  # our hello
        except ClientError:
            pass  # refused before it read our hello (busy, rate limited): its reason is queued
        while not self._session.is_open:
            if self._error is not None:
                raise self._error
            left = deadline - time.monotonic()
            if left <= 0:
                self._dispatch(self._session.handshake_timed_out())
                continue
            self._wait(left)

    # --- after the handshake ---

    def add_wakeup(self, fd: int) -> None:
        """`poll` also returns (early, with nothing) when `fd` becomes readable; it drains it."""
        self._sel.register(fd, selectors.EVENT_READ)
        self._wakeups.append(fd)

    def watch(self, fd: int) -> None:
        """`poll` also returns (early, with nothing) when `fd` becomes readable, and leaves its
        data for the caller (`ready(fd)` says whether it was readable): for a local stdin."""
        if fd not in self._watched:
            self._sel.register(fd, selectors.EVENT_READ, "watch")
            self._watched.add(fd)

    def unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            self._readable.discard(fd)
            if not self._aborted:
                self._sel.unregister(fd)

    def ready(self, fd: int) -> bool:
        """`fd` (watched) was seen readable by the last `poll`; cleared by asking."""
        if fd in self._readable:
            self._readable.discard(fd)
            return True
        return False

    def remove_wakeup(self, fd: int) -> None:
        if fd in self._wakeups:
            self._wakeups.remove(fd)
            if not self._aborted:
                self._sel.unregister(fd)

    def start_run(self, msg: Any) -> str:
        """Send an `exec`; its events come from `poll` under the id returned."""
        id_ = self._session.expect_run()
        try:
            self.send(msg, id_)
        except ClientError:
            self._session.forget(id_)
            raise
        return id_

    def request(self, msg: Any, reply: str) -> str:
        """Send a request; its `reply` (or why it failed) comes from `poll` under the id returned."""
        id_ = self._session.expect_reply(msg.TYPE, reply)
        try:
            self.send(msg, id_)
        except ClientError:
            self._session.forget(id_)
            raise
        return id_

    def send(self, msg: Any, id_: str | None = None) -> None:
        """Write one frame now (`start_run` and `request` send through here)."""
        if self._error is not None:
            raise self._error
        self._session.send(msg, id_)
        self._write()
        if self._write_error is not None:
            raise self._write_error

    def poll(self, timeout: float | None) -> list[Routed]:
        """What the session made of the frames that arrived (`Reply`, `RunEvent`, `RunEnded`,
        `Failed`), in order. `[]` when `timeout` passed or a wakeup fd fired. Raises `ClientError`
        once the connection is gone (after the events that came before the end were returned)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        looked = False
        while True:
            if self._events:
                out, self._events = self._events, []
                return out
            if self._error is not None:
                raise self._error
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0 and looked:
                return []
            # (a timeout of 0 looks at the socket once: it returned before reading anything, so a
            # loop that polled with 0, as `mind exec --wait` does once its time has passed, never
            # heard the `attached` of its re-attachment and gave the run up as unreachable)
            looked = True
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
            self._lost()

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
            elif key.data == "watch":
                self._readable.add(key.fd)
                woke = True
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
            self._lost(ClientError(ClientCode.CLOSED, "the Mind stopped answering (keepalive ping timed out)"))
            return 0
        if self._ping is None and now >= self._ping_due and self._error is None and self._ws.state == "open":
            payload = os.urandom(4)
            self._ws.send_ping(payload)
            self._ping = (payload, now + min(PING_TIMEOUT_S, self._ping_every))
            self._flush()  # now, not after the wait below: the pong's deadline runs from here
        due = self._ping[1] if self._ping is not None else self._ping_due
        wait = max(0.0, due - now)
        return wait if timeout is None else min(timeout, wait)

    def _keep_heap(self) -> None:
        """Large messages are coming (a stream): keep the heap's pages between their buffers
        instead of giving them back and faulting them in again for each (measured on `mind exec
        -- cat` of 1 GiB: 0.33-0.44 ns of system time a byte, 0.21-0.27 with them kept)."""
        from protocol.io import heap

        self._heap_kept = True
        heap.keep_large_buffers()

    def _read(self) -> None:
        for _ in range(8):  # at most ~2 MiB per wakeup, so the caller's loop keeps its turn
            if self._error is not None:
                return
            into = self._ws.buffer_to_fill()
            n = 0
            try:
                if into is not None:  # the rest of a large message, read where it is gathered
                    if not self._heap_kept:
                        self._keep_heap()
                    n = self._sock.recv_into(into)
                    data = b"" if n == 0 else None
                else:
                    data = self._sock.recv(1 << 18)  # a data frame's worth in few reads (issue 25)
            except self._would_block:
                return
            except OSError as exc:
                self._lost(ClientError(ClientCode.CLOSED, f"connection to the Mind failed: {exc}"))
                return
            if data is None or data:
                self.last_heard = time.monotonic()
            try:
                if data is None:
                    self._ws.filled(n)
                elif data:
                    self._ws.receive_data(data)
                else:
                    self._ws.receive_eof()
            except WsError as exc:
                self._ws.send_close(exc.code, exc.message)
                self._lost(ClientError(ClientCode.CLOSED, f"the Mind broke the WebSocket protocol: {exc.message}"))
                return
            self._on_events(self._ws.events())
            if data == b"":
                return

    def _on_events(self, events: list[tuple]) -> None:
        for ev in events:
            if self._error is not None:
                return
            if ev[0] == MESSAGE:
                self._dispatch(self._session.receive_data(ev[1]))
            elif ev[0] == PONG:
                if self._ping is not None and ev[1] == self._ping[0]:
                    self._ping = None
                    self._ping_due = time.monotonic() + self._ping_every
            elif ev[0] == CLOSED:
                self._lost()

    def _dispatch(self, events: list[Event]) -> None:
        """Keep the session's events for `poll`; act on its end; write what it has to send."""
        for ev in events:
            if isinstance(ev, Closed):
                if ev.close_code is not None:
                    self._ws.send_close(ev.close_code, ev.close_reason)
                if self._error is None:
                    self._error = ev.error
            elif isinstance(ev, (Reply, RunEvent, RunEnded, Failed)):
                self._events.append(ev)
        if self._error is None:
            try:
                self._write()
            except ClientError:
                pass  # the connection is closing: reading tells how it ended

    def _lost(self, error: ClientError | None = None) -> None:
        """The transport ended: the session fails what was in flight and says why."""
        self._dispatch(self._session.connection_lost(error))

    def _write(self) -> None:
        """Hand the session's frames to the WebSocket and write them."""
        for frame in self._session.frames_to_send():
            try:
                self._ws.send_binary(frame)
            except WsError:
                raise ClientError(ClientCode.CLOSED, "connection to the Mind closed") from None
        self._flush()

    def _flush(self) -> None:
        data = self._ws.buffers_to_send()
        if not data or self._write_error is not None or self._aborted:
            return
        try:
            self._sock.settimeout(WRITE_TIMEOUT_S)
            try:
                send_buffers(self._sock, data)
            finally:
                self._sock.setblocking(False)
        except OSError as exc:
            self._write_error = ClientError(ClientCode.CLOSED, f"connection to the Mind failed: {exc}")
