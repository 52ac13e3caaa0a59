"""mind/mcp/cancels.py: `notifications/cancelled` for a waiting call cancels its run, in either order
against the call's own unwinding; a call that answered, or one ended by a closed stream (no
notification), leaves its run alone; another connection's request id is not ours."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.server.context import ServerRequestContext

from mind.mcp.cancels import PeerCancels, key_of

OWNER = object()


class Request:
    def __init__(self, session: str | None) -> None:
        self.headers = {"mcp-session-id": session} if session else {}


def cancelled(request_id: Any, session: str | None = None) -> ServerRequestContext[Any, Any]:
    return ServerRequestContext(
        session=None,  # type: ignore[arg-type]  # (the middleware reads no session)
        lifespan_context={},
        protocol_version="2025-11-25",
        method="notifications/cancelled",
        params={"requestId": request_id, "reason": "the user gave up"},
        request=Request(session),
    )


async def passed(ctx: ServerRequestContext[Any, Any]) -> None:
    return None


def test_a_notification_while_the_call_waits_cancels_its_run() -> None:
    async def go() -> list[str]:
        pc, acted = PeerCancels(lambda: OWNER), []

        async def call() -> None:
            with pc.watching(key_of(OWNER, Request(None), 7), lambda: acted.append("cancel")):
                await asyncio.sleep(30)

        t = asyncio.create_task(call())
        await asyncio.sleep(0)
        await pc.middleware(cancelled(7), passed)  # as the SDK: notification seen, then the scope cancelled
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        return acted

    assert asyncio.run(go()) == ["cancel"]


def test_the_call_unwinding_first_still_answers_the_notification_within_the_grace() -> None:
    async def go() -> tuple[list[str], list[str]]:
        pc, acted, late = PeerCancels(lambda: OWNER, grace_s=0.3), [], []

        async def call(rid: int, into: list[str]) -> None:
            with pc.watching(key_of(OWNER, None, rid), lambda: into.append("cancel")):
                await asyncio.sleep(30)

        t = asyncio.create_task(call(1, acted))
        await asyncio.sleep(0)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        await pc.middleware(cancelled(1), passed)  # came after the handler unwound
        u = asyncio.create_task(call(2, late))  # a closed stream: cancelled, no notification...
        await asyncio.sleep(0)
        u.cancel()
        await asyncio.gather(u, return_exceptions=True)
        await asyncio.sleep(0.3 + 0.2)
        await pc.middleware(cancelled(2), passed)  # ...one past the grace does nothing
        return acted, late

    assert asyncio.run(go()) == (["cancel"], [])


def test_an_answered_call_or_another_connections_id_is_left_alone() -> None:
    async def go() -> list[str]:
        pc, acted = PeerCancels(lambda: OWNER), []
        with pc.watching(key_of(OWNER, Request("s1"), 3), lambda: acted.append("answered")):
            await asyncio.sleep(0)
        await pc.middleware(cancelled(3, "s1"), passed)

        async def call() -> None:
            with pc.watching(key_of(OWNER, Request("s1"), 4), lambda: acted.append("other session")):
                await asyncio.sleep(30)

        t = asyncio.create_task(call())
        await asyncio.sleep(0)
        await pc.middleware(cancelled(4, "s2"), passed)  # the same id on another HTTP session
        await pc.middleware(cancelled(5, "s1"), passed)  # another id on the same session
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        return acted

    assert asyncio.run(go()) == []
