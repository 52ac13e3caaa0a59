"""The Hand's local HTTP port, its pure half: parsing a request head (`examine`), routing
(`route`), and the small address helpers. Plain functions over bytes and strings, so hostile
requests are unit-tested without a socket; `hand.aio.health.HealthServer` only moves the bytes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format's type (what `prometheus_client` serves)."""

MAX_HEAD_BYTES = 8192
MAX_HEADERS = 64

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    500: "Internal Server Error",
}
_METHOD = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,20}$")
_HEADER_NAME = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port); port 0 means any free port."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9470; port 0 = any free port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9470")
    return host, int(port)


def show_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    """Without the query string."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, '')}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + self.body


def error(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def examine(buf: bytes) -> Request | Response | None:
    """What the bytes received so far amount to: a complete request, an error to answer with, or
    None (need more). A bad request line is refused as soon as it is complete, without waiting for
    the rest of the head."""
    end = buf.find(b"\r\n\r\n")
    if end < 0 and len(buf) > MAX_HEAD_BYTES:
        return error(400, f"request head larger than {MAX_HEAD_BYTES} bytes")
    if end > MAX_HEAD_BYTES:
        return error(400, f"request head larger than {MAX_HEAD_BYTES} bytes")
    first_end = buf.find(b"\r\n")
    if first_end < 0:
        return None
    bad = _bad_request_line(buf[:first_end])
    if bad is not None:
        return bad
    if end < 0:
        return None
    lines = buf[first_end + 2 : end].split(b"\r\n") if end > first_end else []
    if len(lines) > MAX_HEADERS:
        return error(400, f"more than {MAX_HEADERS} header lines")
    for line in lines:
        name, sep, _ = line.partition(b":")
        if not sep or not _HEADER_NAME.match(name):
            return error(400, "malformed header line")
    method, target, _ = buf[:first_end].split(b" ")
    return Request(method.decode("ascii"), target.decode("ascii").split("?", 1)[0])


def _bad_request_line(line: bytes) -> Response | None:
    parts = line.split(b" ")
    if len(parts) != 3:
        return error(400, "malformed request line")
    method, target, version = parts
    if not _METHOD.match(method) or version not in (b"HTTP/1.0", b"HTTP/1.1"):
        return error(400, "malformed request line")
    if not target.startswith(b"/") or not all(0x21 <= b < 0x7F for b in target):
        return error(400, "malformed request target")
    return None


def route(req: Request, health: Callable[[], dict[str, Any]], metrics: Callable[[], bytes]) -> Response:
    if req.method != "GET":
        return Response(405, b"only GET is served here\n", headers=(("Allow", "GET"),))
    if req.path == "/healthz":
        return Response(200, json.dumps(health()).encode(), "application/json")
    if req.path == "/metrics":
        return Response(200, metrics(), METRICS_CONTENT_TYPE)
    return error(404, "not found: try /healthz or /metrics")


def shown_url(url: str) -> str:
    """A URL as `/healthz` may show it: scheme, host, port and path only. Userinfo, query and
    fragment are where a token could hide, and this port is unauthenticated."""
    u = urlsplit(url)
    host = u.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = u.port
    except ValueError:
        port = None
    return urlunsplit((u.scheme, f"{host}:{port}" if port is not None else host, u.path, "", ""))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
