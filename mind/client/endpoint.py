"""Where the Mind is and whether to trust it: the steps both client shells take before the handshake.

`MindClient` (mind/client/aio.py, over `websockets`) and `Link` (mind/client/blocking.py, over one
blocking socket) open their connections differently, but they must accept the same URLs, verify the
Mind the same way and say the same thing when they refuse. So each step is here once:
- `parse_url`: a `ws://` or `wss://` URL, its host, port, `Host` header and path;
- `tls_context`: the policy of `protocol.io.tls.client_context` (system trust or a CA file, TLS >=
  1.2, hostname; a pin alone trusts the pinned certificate), its refusals as `ClientError(ClientCode.CONFIG)`;
- `check_pin`: right after the TLS handshake, before the credential is used at all;
- `unreachable` and `verification_failed`: the sentences for a Mind that cannot be reached or
  failed certificate verification;
- `locate`: where a client started from a command line finds the Mind and its credential (the `mind`
  commands and `mind mcp` alike: here, in the client library, because the MCP server may not import
  the CLI that starts it).

`protocol.io.tls` (and `ssl` with it) is imported only when a URL is `wss://` or a CA or pin is
given: a `mind exec` over `ws://` never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from mind.errors import ClientCode, ClientError
from protocol.record import Frozen

if TYPE_CHECKING:
    import ssl


class Endpoint(Frozen):
    """A parsed Mind URL (immutable; see protocol/record.py)."""

    __slots__ = ("url", "tls", "host", "port", "header", "path")
    url: str
    tls: bool
    host: str
    port: int
    header: str  # the HTTP `Host` header: the port only when it is not the scheme's default
    path: str  # path and query, as the upgrade request names them

    def __init__(self, url: str, tls: bool, host: str, port: int, header: str, path: str) -> None:
        for name, value in zip(self.__slots__, (url, tls, host, port, header, path), strict=True):
            object.__setattr__(self, name, value)


def parse_url(url: str) -> Endpoint:
    """The Mind's URL, or `ClientError(ClientCode.UNREACHABLE)` naming what is wrong with it."""
    try:
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
        default = 443 if tls else 80
        port = parts.port or default  # .port raises ValueError for a bad one
    except ValueError as exc:
        raise unreachable(url, f"{url} isn't a valid URI: {exc}") from None
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    header = shown if port == default else f"{shown}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(url, tls, host, port, header, path)


def tls_context(url: str, ca: str | None, pin: str | None) -> ssl.SSLContext | None:
    """The SSL context for the Mind at `url` (None for `ws://` without a CA or pin)."""
    if not url.startswith("wss://") and not ca and not pin:
        return None
    from protocol.io.tls import TLSConfigError, client_context

    try:
        return client_context(url, ca, pin)
    except TLSConfigError as exc:
        raise ClientError(ClientCode.CONFIG, str(exc)) from None


def check_pin(ssl_object: Any, pin: str | None) -> None:
    """`ClientError(ClientCode.TLS)` unless the Mind's certificate matches `pin` (nothing to do without one)."""
    if pin is None:
        return
    from protocol.io.tls import TLSConfigError
    from protocol.io.tls import check_pin as check

    try:
        check(ssl_object, pin)
    except TLSConfigError as exc:
        raise ClientError(ClientCode.TLS, str(exc)) from None


def verification_failed(url: str, exc: ssl.SSLCertVerificationError) -> ClientError:
    return ClientError(ClientCode.TLS, f"the Mind at {url} failed certificate verification: {exc.verify_message}")


def unreachable(url: str, why: object) -> ClientError:
    return ClientError(ClientCode.UNREACHABLE, f"cannot reach the Mind at {url}: {why}")


def locate(
    home: str | None, urls: list[str] | None, credential: str | None, ca: str | None, pin: str | None
) -> tuple[str, str, str | None, str | None]:
    """URL, credential file, CA file and pin of a client started from a command line: each value
    given (`--mind`, repeatable, `--credential`, `--ca`, `--pin`), else its `MINDHAND_*` variable,
    else the local Mind's files in `home` (`--home`): its `mind.url`, `admin.cred`, and for a local
    `wss://` Mind with no CA or pin given, the pin of its own certificate. No URL anywhere:
    `ClientError(ClientCode.CONFIG)` saying where to give one; a CA or pin with a `ws://` URL: the
    same, naming where each came from (`tls_without_wss`)."""
    import os

    from mind import home as paths

    where = paths.home(home)
    local = False
    url = ",".join(urls) if urls else os.environ.get("MINDHAND_URL")
    url_from = "from --mind" if urls else "from MINDHAND_URL"
    if not url:
        try:
            url = paths.url_file(where).read_text().strip()
            local = True
            url_from = f"the local Mind's, from {paths.url_file(where)}"
        except OSError:
            raise ClientError(
                ClientCode.CONFIG,
                f"no Mind URL: pass --mind URL, set MINDHAND_URL, or start `mind serve` (looked in {paths.url_file(where)})",
            ) from None
    cred = credential or os.environ.get("MINDHAND_CREDENTIAL") or str(paths.admin_cred_file(where))
    sources = [("--ca" if ca else "MINDHAND_CA"), ("--pin" if pin else "MINDHAND_PIN")]
    ca = ca or os.environ.get("MINDHAND_CA")
    pin = pin or os.environ.get("MINDHAND_PIN")
    set_by = [name for name, value in zip(sources, (ca, pin), strict=True) if value]
    if set_by and (wrong := tls_without_wss(url, url_from, set_by)) is not None:
        raise ClientError(ClientCode.CONFIG, wrong)
    if local and not ca and not pin and url.startswith("wss://"):
        try:
            pin = paths.pin_file(where).read_text().strip()
        except OSError:
            pass
    return url, cred, ca, pin


def tls_without_wss(url: str, url_from: str, set_by: list[str]) -> str | None:
    """Why a CA file or a pin cannot be used with `url` (one of its URLs is `ws://`), or None: names
    what set each (`--ca`, or a `MINDHAND_CA` left in an agent's configuration) and where the URL
    came from. Said here, where the sources are known: the TLS layer below can only say that
    "--ca and --pin" need `wss://`, naming a flag nobody gave when a variable set it."""
    plain = next((u.strip() for u in url.split(",") if u.strip().startswith("ws://")), None)
    if plain is None:
        return None
    what = " and ".join(f"{s} is set" if s.startswith("MINDHAND_") else f"{s} is given" for s in set_by)
    undo = [f"unset {s}" if s.startswith("MINDHAND_") else f"drop {s}" for s in set_by]
    fix = undo[0].split()[0] + " it" if len(undo) == 1 else " and ".join(undo)
    return (
        f"{what} but the Mind URL is {plain} ({url_from}): {fix} or use a wss:// URL "
        "(a CA file and a pin need a wss:// Mind URL)"
    )
