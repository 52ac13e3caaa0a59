"""The claims a node holds Hands by, and the check every write about a Hand makes (DESIGN §16).

A Hand's claim is a fencing token (`mind.core.nodes`): the node that welcomed it last holds it by
the claim its welcome got (`mind.store.postgres.nodes`), and every later write about the Hand, on
any store, is conditional on that claim still being the Hand's current one. A write that finds a
newer claim writes nothing and raises `Fenced`; the shell closes its stale connection.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from mind.store.api import Fenced


class Fence:
    """The claims this node holds Hands by (`mind.core.nodes`), shared by the stores that write
    about a Hand: `claims` is kept by the shell; `on_fenced` tells it a write found a newer claim."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.claims: dict[str, int] = {}
        self.on_fenced: Callable[[str, int], None] | None = None
        self.active = False
        """Set by a serving node (`mind.daemon.nodes`); the admin commands and the store suite
        write unfenced, as one Mind does."""

    def claim(self, hand: str) -> int:
        """The claim a write about `hand` carries (-1, matching nothing, for a Hand not held here)."""
        return self.claims.get(hand, -1)

    async def check(self, con: asyncpg.Connection, hand: str) -> None:
        """Inside a transaction: the Hand is still ours, and stays so until it commits (the row is
        locked FOR SHARE: a claim by another node waits for this transaction). Raises `Fenced`."""
        if not self.active:
            return
        claim = self.claim(hand)
        held = await con.fetchval(
            "SELECT 1 FROM hands WHERE label = $1 AND node = $2 AND claim = $3 FOR SHARE", hand, self.node, claim
        )
        if held is None:
            self.fenced(hand, claim)

    def fenced(self, hand: str, claim: int) -> None:
        if self.on_fenced is not None:
            self.on_fenced(hand, claim)
        raise Fenced(hand, claim)
