"""Which tool calls the agent cancelled: `notifications/cancelled`, a cancel its user meant, told
apart from a transport going away (a closed HTTP response stream), which must leave the run going.

Both end the call's handler the same way (its scope is cancelled), so the handler alone cannot tell
them apart. The SDK's public way to see the notification is a server middleware: it observes every
inbound message, `notifications/cancelled` included, after the dispatcher has cancelled the call it
names. So a waiting call registers what a cancel means for it (cancel its run) under its request id,
the middleware acts on a notification naming that id, and a call that ends cancelled keeps its entry
for `GRACE_S` (the notification and the handler's unwinding race: either may come first) while a
call that answers removes it at once. No private attribute of the SDK is read.

Request ids are the client's and only unique on one connection: the key adds the credential this
call acts as (one `Runs` each) and, over HTTP, the MCP session's id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

GRACE_S = 2.0
"""How long a call ended by a cancel still answers to its `notifications/cancelled`."""

Key = tuple[int, str, str]


def key_of(owner: object, request: Any, request_id: object) -> Key:
    headers: Mapping[str, str] | None = getattr(request, "headers", None)
    session = (headers.get("mcp-session-id") if headers is not None else None) or ""
    return (id(owner), session, str(request_id))


class PeerCancels:
    """The calls waiting on runs, by key, and what a cancel from the agent does to each."""

    def __init__(self, owner: Callable[[], object], grace_s: float = GRACE_S) -> None:
        self._owner = owner
        """The credential's `Runs` of the message being handled (a contextvar's getter)."""
        self._grace_s = grace_s
        self._calls: dict[Key, Callable[[], None]] = {}

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A server middleware (`MCPServer(middleware=[...])`): acts on `notifications/cancelled`."""
        if ctx.request_id is None and ctx.method == "notifications/cancelled" and ctx.params:
            request_id = ctx.params.get("requestId")
            with contextlib.suppress(LookupError):  # no credential bound: not one of our calls
                act = self._calls.pop(key_of(self._owner(), ctx.request, request_id), None)
                if act is not None:
                    act()
        return await call_next(ctx)

    @contextlib.contextmanager
    def watching(self, key: Key, on_cancel: Callable[[], None]) -> Iterator[None]:
        """While the call waits (and `GRACE_S` after it ended cancelled), a cancel of it calls
        `on_cancel`."""
        self._calls[key] = on_cancel
        try:
            yield
        except asyncio.CancelledError:
            asyncio.get_running_loop().call_later(self._grace_s, self._drop, key, on_cancel)
            raise
        except BaseException:
            self._drop(key, on_cancel)
            raise
        self._drop(key, on_cancel)

    def _drop(self, key: Key, on_cancel: Callable[[], None]) -> None:
        if self._calls.get(key) is on_cancel:
            del self._calls[key]
