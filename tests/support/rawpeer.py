"""A peer written by hand, for the tests that play an attacker or a broken client: the local admin
credential of a test cluster, a client's handshake done frame by frame (so a test can then send
what no real client would), and reading until the Mind closes the connection. Every wait is
bounded."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from mind.client.credentials import load_credential
from protocol.auth import ClientHandshake, Credential
from protocol.envelope import Channel, decode
from protocol.messages import Error


def admin(cl: Any) -> Credential:
    """The cluster's local admin credential (`admin.cred` in the Mind's home)."""
    return load_credential(cl.home / "admin.cred")


async def handshake(url: str, cred: Credential, timeout: float = 15, **kw: Any) -> tuple[ClientConnection, Channel]:
    """A client's handshake by hand: `(ws, channel)` once welcomed."""
    ws = await connect(url, compression=None, max_size=None, open_timeout=timeout, **kw)
    ch = Channel()
    hs = ClientHandshake(cred, os.urandom(32))
    async with asyncio.timeout(timeout):
        await ws.send(ch.stamp(hs.hello()))
        await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
        ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)
    return ws, ch


async def closed_with(ws: ClientConnection, timeout: float = 15) -> tuple[str | None, int | None]:
    """Read until the Mind closes us: the error code it sent (if any) and the close code."""
    code = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                env = decode(await ws.recv())
                if isinstance(env.msg, Error):
                    code = env.msg.code.value
    except ConnectionClosed as exc:
        return code, exc.rcvd.code if exc.rcvd else None
    raise AssertionError("the Mind did not close the connection")
