"""Simulated clients: what they ask the Mind, and every answer they get.

A client is one connection at a time (a new connection id after each reconnect). It asks for
foreground runs, cancels them (its own or any run id it heard of), starts background tasks with
names from a small pool (so duplicate starts happen, with the same binding or another), sometimes
several at once to one Hand (their rpcs leave together: one admission batch if read together), gets and
cancels tasks, and sometimes disconnects. Its inbox is what the invariants about "exactly one
`run_end` per run per connected client" and "exactly one answer per request" are checked on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.jobs import JobSpec

from protocol.digest import args_digest
from protocol.messages import Exec, Message, RunEnd, RunOutput, RunUpdate, TaskGet, TaskStart

if TYPE_CHECKING:
    from sim.simulation import World

EXEC_TOOLS = (("exec", 80), ("shell", 10), ("nope", 4), ("write_file", 4), ("read_file", 2))
TASK_TOOLS = (("exec", 85), ("shell", 10), ("read_file", 5))
DURATIONS = (0.05, 0.5, 2.0, 6.0, 25.0)
TIMEOUTS_MS = (300, 1000, 5000, 20000, 60000)
MAX_RUNTIMES_MS = (500, 3000, 10000, 60000)


@dataclass
class Request:
    req_id: str
    kind: str
    conn: str
    target: str
    run_id: str | None = None
    replies: list[Message] = field(default_factory=list)
    ends: int = 0

    @property
    def answered(self) -> int:
        """Final answers: `run_end`s for an exec, every reply for anything else."""
        return self.ends if self.kind == "exec" else len(self.replies)


@dataclass
class SimClient:
    name: str
    conn: str | None = None
    requests: dict[str, Request] = field(default_factory=dict)

    def live_requests(self) -> list[Request]:
        return [r for r in self.requests.values() if r.conn == self.conn]


def pick(rng: random.Random, weighted: tuple[tuple[str, int], ...]) -> str:
    """A weighted choice (one draw; `random.choices` is slower for these tiny tables)."""
    total = 0
    for _, w in weighted:
        total += w
    x = rng.random() * total
    for key, w in weighted:
        x -= w
        if x < 0:
            return key
    return next(key for key, w in reversed(weighted) if w > 0)


def job(rng: random.Random) -> dict[str, Any]:
    return JobSpec(
        duration=rng.choice(DURATIONS),
        rc=rng.choice((0, 0, 0, 1)),
        chunks=rng.randint(0, 3),
        term=rng.random() < 0.8,
        nostart=rng.random() < 0.04,
    ).args()


class ClientActions:
    """The client half of the scheduler: one random action per call."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.task_pool = [f"t{i}" for i in range(world.config.task_ids)]
        self.bindings: dict[str, tuple[str, str, dict[str, Any], int]] = {}
        self.specs: dict[str, JobSpec] = {}
        """args digest -> command, for tests whose broken Hand wants to run a row again."""
        self.run_ids: list[str] = []

    def act(self, client: SimClient) -> str:
        w, rng = self.world, self.rng
        if client.conn is None:
            if w.mind is None:
                return "client:offline"
            client.conn = w.next_id("c")
            w.conn_clients[client.conn] = client
            return "client:connect"
        kind = pick(
            rng,
            (
                ("exec", 30),
                ("task_start", 23),
                ("task_burst", 3),
                ("task_get", 10),
                ("task_cancel", 10),
                ("cancel_run", 12),
                ("disconnect", 3),
            ),
        )
        if kind == "disconnect":
            conn, client.conn = client.conn, None
            w.mind.client_gone(conn)  # type: ignore[union-attr]
            return "client:disconnect"
        req_id = w.next_id("q")
        mind = w.mind
        assert mind is not None
        if kind == "exec":
            hand = rng.choice(w.config.hands) if rng.random() > 0.03 else "ghost"
            grace = rng.choice((None, 200, 1000))
            # Every other request names its run and watches nothing (its end alone); chosen by the
            # request's number, not the generator, so each seed still draws what it drew before.
            named = req_id[-1] in "02468"
            msg = Exec(
                hand=hand,
                tool=pick(rng, EXEC_TOOLS),
                args=job(rng),
                timeout_ms=rng.choice(TIMEOUTS_MS),
                grace_ms=grace,
                run_id=f"{client.conn}.{w.next_id('')}" if named else None,  # its connection's prefix, counting up
                watch=not named,
            )
            req = Request(req_id, "exec", client.conn, hand)
            client.requests[req_id] = req
            req.run_id = mind.on_exec(client.conn, req_id, msg)
            self.run_ids.append(req.run_id)
        elif kind == "cancel_run":
            active = [run.run_id for run in mind.registry.active()]
            r = rng.random()
            run_id = (
                rng.choice(active)
                if active and r < 0.7
                else rng.choice(self.run_ids)
                if self.run_ids and r < 0.95
                else "rx"
            )
            client.requests[req_id] = Request(req_id, "cancel_run", client.conn, run_id)
            mind.on_cancel_run(client.conn, req_id, run_id)
        elif kind == "task_start":
            self.start_task(client, self._task_start(), req_id)
        elif kind == "task_burst":
            hand = rng.choice(w.config.hands)
            for i in range(rng.randint(2, 3)):
                self.start_task(client, self._task_start(hand), req_id if i == 0 else None)
        else:
            live = [snap.task_id for snap in w.snapshots.rows.values() if not snap.terminal]
            if live and rng.random() < 0.6:
                task_id = rng.choice(live)
            else:
                task_id = rng.choice(self.task_pool + [t for t in w.snapshots.rows if t.startswith("tm")][-3:])
            client.requests[req_id] = Request(req_id, kind, client.conn, task_id)
            if kind == "task_get":
                mind.on_task_get(client.conn, req_id, TaskGet(task_id=task_id))
            else:
                mind.on_task_cancel(client.conn, req_id, task_id)
        return f"client:{kind}"

    def start_task(self, client: SimClient, msg: TaskStart, req_id: str | None = None) -> str:
        """Send a `task_start` (also what scripted scenarios in tests call)."""
        w = self.world
        assert client.conn is not None and w.mind is not None
        req_id = req_id or w.next_id("q")
        client.requests[req_id] = Request(req_id, "task_start", client.conn, msg.task_id or "?")
        w.mind.on_task_start(client.conn, req_id, msg)
        w.drain()
        return req_id

    def _task_start(self, to: str | None = None) -> TaskStart:
        """A start with a pooled id (or none); `to`: on this Hand (a retry of another Hand's binding
        is then a conflict)."""
        w, rng = self.world, self.rng
        task_id = rng.choice(self.task_pool) if rng.random() < 0.9 else None
        known = self.bindings.get(task_id) if task_id else None
        if known is not None and rng.random() < 0.6 and to in (None, known[0]):
            hand, tool, args, max_ms = known  # a retry: same binding
        else:
            hand = to or (rng.choice(w.config.hands) if rng.random() > 0.03 else "ghost")
            tool, args, max_ms = pick(rng, TASK_TOOLS), job(rng), rng.choice(MAX_RUNTIMES_MS)
            if task_id is not None:
                self.bindings.setdefault(task_id, (hand, tool, args, max_ms))
        spec = JobSpec.from_args(args)
        if spec is not None:
            self.specs[args_digest(tool, args)] = spec
        return TaskStart(hand=hand, task_id=task_id, tool=tool, args=args, max_runtime_ms=max_ms)


def record(client: SimClient, req_id: str, msg: Message) -> Request | None:
    req = client.requests.get(req_id)
    if req is None:
        return None
    if isinstance(msg, RunEnd):
        req.ends += 1
    if not isinstance(msg, (RunUpdate, RunOutput)):
        req.replies.append(msg)
    return req
