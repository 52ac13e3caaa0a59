"""Plain HTTP on the Mind's own port: `GET /healthz` (JSON) and `GET /metrics` (Prometheus text).

Answered before the WebSocket upgrade (websockets' `process_request`), from values already in
memory: a scrape never waits on the database or the event loop's other work (`metrics`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.asyncio.server import ServerConnection

from mind.daemon.host import VERSION, Host


def typed(resp: Any, content_type: str) -> Any:
    del resp.headers["Content-Type"]  # websockets' Headers appends on assignment
    resp.headers["Content-Type"] = content_type
    return resp


def respond(mind: Host, connection: ServerConnection, request: Any) -> Any:
    """The response to `request`, or None: anything but these two paths goes on to the WebSocket
    handshake (which refuses a request that is not an upgrade)."""
    path = request.path.split("?", 1)[0]
    if path == "/healthz":
        body = json.dumps(
            {
                "status": "ok",
                "version": VERSION,
                "mind_id": mind.mind_id,
                "uptime_s": round(time.time() - mind.started, 3),
                "hands_connected": len(mind.hands),
                "clients_connected": len(mind.clients),
                "runs_active": len(mind.registry.active()),
            }
        )
        return typed(connection.respond(200, body), "application/json")
    if path == "/metrics":
        return typed(
            connection.respond(200, mind.metrics.render().decode()), "text/plain; version=0.0.4; charset=utf-8"
        )
    return None
