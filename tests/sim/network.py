"""The in-memory network: one ordered link per Mind<->Hand connection (one generation).

Like TCP through the fault proxy (`mind/testing/faultproxy`): each direction delivers in order,
never duplicates, and can be delayed (every frame held `delay` seconds) or blackholed (held, nobody
is told). A `glued` frame was written together with the one before it (one read delivers both).
A closed link loses whatever was in flight, both ways, and each side notices on its own
schedule: at once if it closed the link itself, a moment later if the peer did (RST), or only when
its keepalive expires if the path is blackholed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Frame:
    msg: Any
    env_id: str | None
    sent_at: float
    ready_at: float
    glued: bool = False
    """Delivered with the frame before it, in the same read (see `Link.twin`)."""


@dataclass
class Direction:
    name: str
    queue: deque[Frame] = field(default_factory=deque)
    delay: float = 0.0
    sent: int = 0
    delivered: int = 0
    dropped: int = 0

    def head(self) -> Frame | None:
        return self.queue[0] if self.queue else None


class Link:
    """One connection of generation `gen` between the Mind and Hand `hand`."""

    def __init__(self, hand: str, gen: int, now: float) -> None:
        self.hand = hand
        self.gen = gen
        self.opened_at = now
        self.down = Direction("down")  # Mind -> Hand
        self.up = Direction("up")  # Hand -> Mind
        self.open = True
        self.flowing = True
        self.blackhole_epoch = 0
        self.mind_noticed = False
        self.hand_noticed = False
        self.closed_why = ""
        self.twin: Callable[[Any], Any] | None = None
        """A fault (`sim.faults`): called with each Mind -> Hand message; a message it returns is
        sent too, glued to the original (written in the same write)."""

    def send(self, direction: Direction, msg: Any, env_id: str | None, now: float) -> None:
        """Queue a frame; a closed link swallows it (the sender's socket is already gone)."""
        if not self.open:
            direction.dropped += 1
            return
        direction.sent += 1
        frame = Frame(msg, env_id, now, now + direction.delay)
        direction.queue.append(frame)
        if self.twin is not None and direction is self.down:
            copy = self.twin(msg)
            if copy is not None:
                direction.sent += 1
                direction.queue.append(Frame(copy, env_id, now, frame.ready_at, glued=True))

    def deliverable(self, direction: Direction, now: float) -> bool:
        head = direction.head()
        return self.open and self.flowing and head is not None and head.ready_at <= now

    def pop(self, direction: Direction) -> Frame:
        direction.delivered += 1
        return direction.queue.popleft()

    def close(self, why: str) -> int:
        """Close the connection; returns how many in-flight frames were lost."""
        if not self.open:
            return 0
        self.open = False
        self.closed_why = why
        lost = len(self.down.queue) + len(self.up.queue)
        self.down.dropped += len(self.down.queue)
        self.up.dropped += len(self.up.queue)
        self.down.queue.clear()
        self.up.queue.clear()
        return lost

    def in_flight(self) -> int:
        return len(self.down.queue) + len(self.up.queue)

    def __repr__(self) -> str:
        state = "open" if self.open else f"closed({self.closed_why})"
        flow = "" if self.flowing else " blackholed"
        return f"<link {self.hand} gen{self.gen} {state}{flow} down={len(self.down.queue)} up={len(self.up.queue)}>"
