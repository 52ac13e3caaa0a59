"""Where a Hand lets a tunnel go (DESIGN §18, issue 37): the destinations of `forward` runs.

A `forward` run carries one TCP connection (or one to a Unix socket inside the root) from a client's
local port to a destination as seen from the Hand. The Hand decides where: `hand run
--forward-allow 'HOST:PORT,...'` (globs, as `fnmatch` reads them: `db*.internal:5432`, `10.0.*:*`),
default its loopback (`localhost`, `127.*`, `::1`) on any port. A destination is allowed when the
name as asked matches a pattern, or every address it resolves to does; the connection then goes to
those very addresses (no second lookup between the check and the connect). Pure: the resolution is
done by the caller and passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

DEFAULT_FORWARD_ALLOW: tuple[str, ...] = ("localhost:*", "127.*:*", "[::1]:*")


def parse_allow(items: Iterable[str]) -> tuple[str, ...]:
    """`["db:5432,10.0.*:*", "[::1]:80"]` -> the patterns. Raises ValueError for one that names
    no port (`HOST:PORT`, `*` allowed in either)."""
    out: list[str] = []
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port or not (port == "*" or port.isdigit() or "*" in port):
                raise ValueError(f"{part!r} is not HOST:PORT (globs allowed: 10.0.*:*, db*:5432, [::1]:*)")
            out.append(part)
    return tuple(dict.fromkeys(out))


def endpoint(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _matches(pattern: str, host: str, port: int) -> bool:
    """Host and port are matched apart, an IPv6 pattern's brackets taken off first (to `fnmatch` a
    `[` opens a set of characters)."""
    host_glob, _, port_glob = pattern.rpartition(":")
    if host_glob.startswith("[") and host_glob.endswith("]"):
        host_glob = host_glob[1:-1]
    return fnmatchcase(host.lower(), host_glob.lower()) and fnmatchcase(str(port), port_glob)


def allowed(patterns: Sequence[str], host: str, port: int, addresses: Sequence[str]) -> bool:
    """May a connection go to `host:port`, which resolved to `addresses`?"""
    host = host.strip("[]")
    if any(_matches(p, host, port) for p in patterns):
        return True
    return bool(addresses) and all(any(_matches(p, a, port) for p in patterns) for a in addresses)
