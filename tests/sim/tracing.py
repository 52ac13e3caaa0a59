"""The `--trace` output: each step, what happened within it, and what it changed.

A step prints one header line (`[step] t=virtual time event`), then the timers that fired and the
frames delivered within it, the answers clients got, and every line of the world's summary (runs,
snapshots, Hand rows, connections) whose value changed: enough to read a failing seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol.messages import Message, TaskCancelResult, TaskInfo, TaskInventoryPage, TaskUpdate

if TYPE_CHECKING:
    from sim.simulation import World


class Tracer:
    def __init__(self, world: World, out: Callable[[str], None]) -> None:
        self.world = world
        self.line = out
        self._last: dict[str, str] = {}
        self._notes: list[str] = []

    def note(self, what: str) -> None:
        """Something that happened within the current step (printed under its header)."""
        self._notes.append(what)

    def step(self, desc: str, label: str) -> None:
        self.line(f"[{label}] t={self.world.clock.now:.3f} {desc}")
        for what in self._notes:
            self.line(f"      {what}")
        self._notes.clear()
        now = summary(self.world)
        for key in sorted(set(now) | set(self._last)):
            old, new = self._last.get(key), now.get(key)
            if old != new:
                self.line(f"      {key}: {old or '-'} -> {new or '-'}")
        self._last = now


def summary(w: World) -> dict[str, str]:
    s: dict[str, str] = {}
    mind = w.mind
    s["mind"] = "down" if mind is None else "up " + " ".join(f"{h}:gen{p.gen}" for h, p in mind.hands.items())
    if mind is not None:
        for run in mind.registry.active():
            s[f"run {run.run_id}"] = f"{run.state.value} ({run.hand} gen{run.gen})"
    for (life, run_id), state in w.checker.mind_ends.items():
        if mind is not None and life == mind.life:
            s[f"run {run_id}"] = f"{state.value} (final)"
    for snap in w.snapshots.all():
        flags = "".join(
            f" {f}"
            for f, on in (
                ("stale", snap.stale),
                ("start_pending", snap.start_pending),
                ("cancel_pending", snap.cancel_pending),
            )
            if on
        )
        why = f" ({snap.reason})" if snap.reason else ""
        s[f"snap {snap.task_id}"] = f"{snap.hand} {snap.state.value} v{snap.version}{flags}{why}"
    for slot in w.hands.values():
        proc = slot.proc
        s[slot.label] = "down" if proc is None else (f"up gen{proc.conn.link.gen}" if proc.conn else "up offline")
        for row in slot.store.rows.values():
            s[f"{slot.label} row {row.task_id}"] = f"{row.state.value} v{row.version}"
    for link in w.links:
        s[f"link {link.hand} gen{link.gen}"] = repr(link)
    return s


def describe(msg: Message) -> str:
    parts = [msg.TYPE]
    for name in (
        "run_id",
        "task_id",
        "state",
        "status",
        "outcome",
        "reject_code",
        "code",
        "after",
        "next_after",
        "reason",
    ):
        value = getattr(msg, name, None)
        if value not in (None, ""):
            parts.append(f"{name}={getattr(value, 'value', value)}")
    task = getattr(msg, "task", None)
    if isinstance(msg, (TaskUpdate, TaskCancelResult)) and isinstance(task, TaskInfo):
        parts.append(f"task={task.task_id}:{task.state.value}:v{task.version}")
    if isinstance(msg, TaskInventoryPage):
        parts.append("tasks=[" + " ".join(f"{t.task_id}:{t.state.value}:v{t.version}" for t in msg.tasks) + "]")
    return " ".join(parts)
