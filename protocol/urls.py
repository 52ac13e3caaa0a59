"""Several Mind URLs (DESIGN §16): how Hands and clients are given them and go round them.

`--mind URL` repeated, or a comma list in `MINDHAND_URL` and the TOML, names Mind nodes that share
one database: any of them serves. Each peer starts at a random one (a fleet given the same list
spreads over the nodes instead of all landing on the first), stays on a node that works, and moves
to the next when one refuses the connection; only after every URL of a round failed does it back
off (full jitter, `hand.core.backoff`), so the death of a node is one quick hop, and the death of
all of them is not a thundering herd.

Pure: the start is injected (default: a random draw); nothing here dials. Imports nothing heavy:
the CLI's fast path (mind/client/blocking.py) uses it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def split_urls(value: str | Iterable[str]) -> list[str]:
    """`"ws://a:1, ws://b:2"` or `["ws://a:1", "ws://b:2,ws://c:3"]` -> the URLs, in order, each once."""
    parts = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for part in parts:
        for url in part.split(","):
            url = url.strip()
            if url and url not in out:
                out.append(url)
    return out


class Rotation:
    """Which URL to dial now: a random start, the same one while it works, the next on a failure."""

    __slots__ = ("_i", "_tried", "urls")

    def __init__(self, urls: list[str], start: int | None = None) -> None:
        if not urls:
            raise ValueError("no Mind URL")
        self.urls = urls
        self._i = (int.from_bytes(os.urandom(4), "big") if start is None else start) % len(urls)
        self._tried = 0
        """URLs that failed since the last connection that worked (or since the round began)."""

    @property
    def current(self) -> str:
        return self.urls[self._i]

    def failed(self) -> bool:
        """The current URL refused us: move to the next. True if that one has not been tried in this
        round (dial it at once); False when every URL failed (back off, then start a new round)."""
        self._i = (self._i + 1) % len(self.urls)
        self._tried += 1
        if self._tried >= len(self.urls):
            self._tried = 0
            return False
        return True

    def worked(self) -> None:
        """A connection was welcomed on the current URL: stay on it, and a new round starts here."""
        self._tried = 0
