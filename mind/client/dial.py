"""Opening one authenticated connection to the Mind, for the asyncio client (mind/client/aio.py).

`MindClient` opens a connection when it is made and again after every cut it rides out (DESIGN
§15), so the steps live here once: the URL and TLS checks of mind/client/endpoint.py, the
WebSocket, the pin, and the handshake fed through the session core until it is open, within its
deadline. The handshake also reads what the Mind's `welcome` announced that the client acts on:
the resume window (how long a cut may last before the runs on it end).
"""

from __future__ import annotations

import asyncio
import os
import ssl

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from mind.client import session as core
from mind.client.endpoint import check_pin, parse_url, tls_context, unreachable, verification_failed
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.envelope import decode as decode_envelope
from protocol.errors import ProtocolError
from protocol.io.batching import BatchedWrites
from protocol.io.framereader import FrameReader
from protocol.messages import Welcome
from protocol.urls import Rotation, split_urls


class Dial:
    """How a client reached the Mind, kept to reach it again after a cut. `url` may name several
    Mind nodes (a comma list, DESIGN §16): `rotation` says which one to dial now."""

    __slots__ = ("url", "credential", "open_timeout", "ca", "pin", "rotation")

    def __init__(self, url: str, credential: Credential, open_timeout: float, ca: str | None, pin: str | None) -> None:
        self.url, self.credential, self.open_timeout, self.ca, self.pin = url, credential, open_timeout, ca, pin
        self.rotation = Rotation(split_urls(url) or [url])


class ReadingConnection(BatchedWrites, FrameReader, ClientConnection):
    """A client's connection: binary frames read by our own reader (`protocol.io.framereader`),
    frames queued together written at once, a stream chunk framed unjoined (`protocol.io.batching`)."""


MOVE_ON = frozenset({ClientCode.UNREACHABLE, ClientCode.CLOSED, ErrorCode.BUSY, ErrorCode.INTERNAL_ERROR})
"""Failures of one node that another node may not share: the next URL is tried at once."""


async def open_connection(dial: Dial, open_timeout: float) -> tuple[ClientConnection, core.ClientSession, float]:
    """A new authenticated connection to one of the dial's Mind URLs: the current one, and the
    next ones in turn while a node refuses the connection (`MOVE_ON`); the last refusal if all
    do. A refusal of the credential or the Mind's identity is raised at once."""
    rotation = dial.rotation
    while True:
        try:
            opened = await _open_one(dial, rotation.current, open_timeout)
        except ClientError as exc:
            if exc.code not in MOVE_ON or not rotation.failed():
                raise
            continue
        rotation.worked()
        return opened


async def _open_one(dial: Dial, url: str, open_timeout: float) -> tuple[ClientConnection, core.ClientSession, float]:
    """A new authenticated connection: the WebSocket, its open session, and the resume window the
    Mind announced. `wss://` URLs are verified (system trust or the CA), and the certificate must
    match the pin if given, before the credential is used at all. `ClientError` says why not."""
    session = core.ClientSession(dial.credential, os.urandom(limits.NONCE_BYTES))
    parse_url(url)  # refused as the fast path refuses it, before websockets reads it
    ssl_ctx = tls_context(url, dial.ca, dial.pin)
    try:
        ws = await connect(
            url,
            create_connection=ReadingConnection,
            compression=None,
            max_size=limits.MAX_FRAME_BYTES,
            open_timeout=open_timeout,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=2,
            ssl=ssl_ctx,
        )
    except ssl.SSLCertVerificationError as exc:
        raise verification_failed(url, exc) from None
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ValueError) as exc:  # ValueError: a bad port
        raise unreachable(url, exc) from None
    try:
        check_pin(ws.transport.get_extra_info("ssl_object"), dial.pin)
        window = await handshake(ws, session)
    except BaseException:
        await ws.close()
        raise
    return ws, session, window


async def handshake(ws: ClientConnection, session: core.ClientSession) -> float:
    """Feed the session until it is open (or raise why not), within the handshake deadline.
    Returns the resume window the Mind's `welcome` announced."""
    window = 0.0
    try:
        async with asyncio.timeout(limits.HANDSHAKE_TIMEOUT_S):
            while True:
                try:
                    for frame in session.data_to_send():
                        await ws.send(frame)
                except ConnectionClosed:
                    pass  # refused before it read ours (busy, rate limited): its reason is queued
                try:
                    data = await ws.recv()
                except ConnectionClosed as exc:
                    events = session.connection_lost(ClientError(ClientCode.CLOSED, str(exc)))
                else:
                    try:
                        env = decode_envelope(data)
                    except ProtocolError:
                        events = session.receive_data(data)  # the session says what is wrong with it
                    else:
                        events = session.receive_frame(env)
                        if isinstance(env.msg, Welcome):
                            window = env.msg.resume_window_s
                for ev in events:
                    if isinstance(ev, core.Closed):
                        raise ev.error
                    if isinstance(ev, core.Opened):
                        return window
    except TimeoutError:
        session.handshake_timed_out()
        assert session.error is not None
        raise session.error from None
