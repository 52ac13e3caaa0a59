"""Where `mind mcp --listen` serves, and which `Host` and `Origin` headers it answers: pure, and free of
the MCP SDK (the CLI checks `--listen` with it before the optional SDK is imported).

A bearer is a client credential, the long-term secret of an agent: plain HTTP beyond this machine
would send it in clear text on every request. So a listen address that is not loopback needs TLS
(`--tls-cert`), or `--insecure-http` said out loud by whoever terminates TLS in front.

DNS rebinding: a web page can make a browser send requests to a name it controls that resolves to
this server, carrying that name in `Host`. A request is answered only when its `Host` is a name or
address the server is reached by (the listen address; for a wildcard one, this machine's names and
addresses; and each `--allow-host`), and its `Origin`, if any, is one of those too.
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = frozenset({"0.0.0.0", "::", ""})
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def split(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT`, `:PORT` for loopback) as (host, port); `ValueError` if malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen wants HOST:PORT (e.g. 127.0.0.1:7480), not {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def loopback(host: str) -> bool:
    """Only this machine can reach `host`: `localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def this_machine() -> list[str]:
    """The names and addresses this machine is reached by, as far as it knows them itself."""
    names = [socket.gethostname(), socket.getfqdn()]
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        infos = []
    names += [str(info[4][0]) for info in infos]
    return names


def bracketed(host: str) -> str:
    """A host as it appears in a `Host` header: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(host: str, port: int, extra: list[str] | None = None) -> list[str]:
    """The `Host` headers a request may carry (exact, or `name:*` for any port): the listen address
    with and without its port (and the loopback names for a loopback one, this machine's names and
    addresses for a wildcard one), then each of `extra` (`--allow-host NAME` or `NAME:PORT`)."""
    if host in WILDCARDS:
        names = [*LOOPBACK_NAMES, *this_machine()]
    elif loopback(host):
        names = [host, *LOOPBACK_NAMES]
    else:
        names = [host]
    out: list[str] = []
    for name in names:
        h = bracketed(name)
        out += [h, f"{h}:{port}"]
    for given in extra or []:
        h = bracketed(given) if given.count(":") > 1 else given  # a bare IPv6 address gets its brackets
        out += [h] if h.rpartition(":")[2].isdigit() and not h.endswith("]") else [h, f"{h}:*"]
    return list(dict.fromkeys(out))


def allowed_origins(hosts: list[str]) -> list[str]:
    """The `Origin` headers a request may carry: a page served from one of the allowed hosts."""
    return [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
