"""What a client credential may do (DESIGN §9): which Hands, which tools, whose runs and tasks.

Checked by the Mind before anything is sent to a Hand, so a refused request never reaches one.
Patterns are shell globs (`web-*`). The local admin credential has the full scope.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Scope:
    hands: tuple[str, ...] = ("*",)
    tools: tuple[str, ...] = ("*",)
    read_others: bool = False
    """May read and cancel runs and tasks that other clients started (and tasks adopted from a Hand)."""
    recordings: bool = False
    """May read the recordings of any client's runs on the Hands it may use (DESIGN §19); without it
    a client reads only its own runs' recordings."""

    def allows_hand(self, hand: str) -> bool:
        return any(fnmatchcase(hand, p) for p in self.hands)

    def allows_tool(self, tool: str) -> bool:
        return any(fnmatchcase(tool, p) for p in self.tools)

    def may_touch(self, owner: str | None, me: str) -> bool:
        return self.read_others or owner == me

    def may_read_recording(self, hand: str, client: str, me: str) -> bool:
        """Its own runs' recordings, or with the `recordings` scope those of the Hands it may use.
        Whoever may not is told the same as for a recording that does not exist (no leak)."""
        return client == me or (self.recordings and self.allows_hand(hand))

    def to_json(self) -> str:
        d: dict[str, object] = {"hands": list(self.hands), "tools": list(self.tools), "read_others": self.read_others}
        if self.recordings:  # absent when off: a scope written before recordings reads the same
            d["recordings"] = True
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str | None) -> Scope:
        if not text:
            return FULL
        d = json.loads(text)
        return cls(
            hands=tuple(d["hands"]),
            tools=tuple(d["tools"]),
            read_others=bool(d["read_others"]),
            recordings=bool(d.get("recordings", False)),
        )

    def describe(self) -> str:
        others = "any client's" if self.read_others else "own only"
        recs = "; recordings: any client's" if self.recordings else ""
        return f"hands {','.join(self.hands)}; tools {','.join(self.tools)}; runs/tasks: {others}{recs}"


FULL = Scope(read_others=True, recordings=True)


def parse_patterns(text: str | None, what: str) -> tuple[str, ...]:
    if text is None:
        return ("*",)
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if not items:
        raise ValueError(f"--{what} needs at least one name or pattern")
    for p in items:
        if not all(c.isalnum() or c in "._-*?[]!" for c in p):
            raise ValueError(f"--{what}: {p!r} is not a name or glob pattern")
    return items
