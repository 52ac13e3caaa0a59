"""`TaskService` performing the task-start core (`mind.core.taskstart`) against the real snapshot
store and run registry: the snapshot is written stale before the start run is admitted, a failure
while settling answers every waiter with `internal_error`, and a failed retry write frees the id."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from mind.core.handshake import Identity
from mind.core.registry import Action, RunRegistry, SendToHand, StartEnded
from mind.core.scope import FULL, Scope
from mind.daemon.peer import INTERNAL_ERROR
from mind.daemon.taskservice import TaskService
from mind.store.sqlite import SqliteSnapshots
from protocol.messages import Message, Rpc, RunEnd, TaskStart, TaskStartResult
from protocol.states import RunState


@dataclass
class Outbox:
    sent: list[tuple[Message, str | None]] = field(default_factory=list)

    def put(self, msg: Message, id: str | None = None, droppable: bool = False) -> None:
        self.sent.append((msg, id))


@dataclass(eq=False)
class FakePeer:
    gen: int = 1
    scope: Scope = FULL
    ident: Identity = field(default_factory=lambda: Identity("client", "me", None))
    outbox: Outbox = field(default_factory=Outbox)


class FakeMind:
    """What a start uses of the Mind: the snapshot store (the SQLite engine), the connections, the
    registry and the performer (here: the actions are kept)."""

    def __init__(self, snapshots: SqliteSnapshots) -> None:
        self.snapshots = snapshots
        self.hands: dict[str, FakePeer] = {"h1": FakePeer(gen=7)}
        self.registry = RunRegistry()
        self.performed: list[Action] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.router = None  # a lone Mind: no other node to relay a start to

    async def db(self, fn: Any, *args: Any) -> Any:
        return await fn(*args)

    def spawn(self, coro: Any) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))

    def perform(self, actions: list[Action]) -> None:
        self.performed += actions


@pytest.fixture
async def mind(tmp_path):
    m = FakeMind(SqliteSnapshots(tmp_path / "mind.db"))
    yield m
    await m.snapshots.close()


def request() -> TaskStart:
    return TaskStart(hand="h1", task_id="t1", tool="exec", args={"argv": ["true"]}, max_runtime_ms=60_000)


async def test_a_start_is_stored_stale_before_its_run_goes_to_the_live_generation(mind) -> None:
    svc = TaskService(mind)  # type: ignore[arg-type]
    peer = FakePeer()
    await svc.start(peer, "q1", request())  # type: ignore[arg-type]
    snap = mind.snapshots.sync.get("t1")
    assert snap is not None and snap.stale and snap.start_pending and snap.owner == "me"
    [rpc] = [a for a in mind.performed if isinstance(a, SendToHand)]
    assert rpc.gen == 7 and isinstance(rpc.msg, Rpc) and rpc.msg.background is not None
    assert svc.starts.in_flight("t1") and peer.outbox.sent == []  # the answer waits for the Hand


async def test_settling_that_fails_answers_every_waiter_with_internal_error(mind, monkeypatch) -> None:
    svc = TaskService(mind)  # type: ignore[arg-type]
    first, second = FakePeer(), FakePeer()
    await svc.start(first, "q1", request())  # type: ignore[arg-type]
    await svc.start(second, "q2", request())  # type: ignore[arg-type]  # joins the one in flight

    def broken(task_id: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(mind.snapshots.sync, "finish_start", broken)
    end = RunEnd(run_id="t1", hand="h1", tool="exec", state=RunState.LOST, reason="hand gone")
    with pytest.raises(OSError):
        await svc.start_ended(StartEnded(run_id="t1", hand="h1", end=end))
    assert first.outbox.sent == [(INTERNAL_ERROR, "q1")] and second.outbox.sent == [(INTERNAL_ERROR, "q2")]


async def test_a_retry_whose_write_fails_frees_the_id_for_the_next_start(mind, monkeypatch) -> None:
    svc = TaskService(mind)  # type: ignore[arg-type]
    await svc.start(FakePeer(), "q0", request())  # type: ignore[arg-type]
    # the Hand's connection ends before it answers: the start run ends `lost`, the Hand must settle it
    [ended] = [a for a in mind.registry.on_hand_gone("h1", 7, 1.0, 1.0) if isinstance(a, StartEnded)]
    await svc.start_ended(ended)
    mind.hands["h1"] = FakePeer(gen=8)  # and it is back
    real_retry = mind.snapshots.sync.retry_start

    def broken(snap: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(mind.snapshots.sync, "retry_start", broken)
    with pytest.raises(OSError):
        await svc.start(FakePeer(), "q1", request())  # type: ignore[arg-type]
    assert not svc.starts.in_flight("t1")  # a later retry is not left joining a start nobody sends
    monkeypatch.setattr(mind.snapshots.sync, "retry_start", real_retry)
    peer = FakePeer()
    await svc.start(peer, "q2", request())  # type: ignore[arg-type]
    assert svc.starts.in_flight("t1") and peer.outbox.sent == []  # asked of the Hand again
    assert [a.gen for a in mind.performed if isinstance(a, SendToHand)] == [7, 8]


async def test_an_answered_start_tells_the_sender_accepted(mind) -> None:
    svc = TaskService(mind)  # type: ignore[arg-type]
    peer = FakePeer()
    await svc.start(peer, "q1", request())  # type: ignore[arg-type]
    info = _hand_row(mind)
    end = RunEnd(run_id="t1", hand="h1", tool="exec", state=RunState.SUCCEEDED, value={"task": info})
    await svc.start_ended(StartEnded(run_id="t1", hand="h1", end=end))
    [(msg, id_)] = peer.outbox.sent
    assert isinstance(msg, TaskStartResult) and (msg.outcome, id_) == ("accepted", "q1")
    snap = mind.snapshots.sync.get("t1")
    assert snap is not None and not snap.stale and snap.version == 1


def _hand_row(mind: FakeMind) -> dict[str, Any]:
    """The row the Hand reports for the start stored in `mind`, as it arrives on the wire."""
    snap = mind.snapshots.sync.get("t1")
    assert snap is not None
    return {
        "task_id": "t1",
        "tool": snap.tool,
        "state": "queued",
        "version": 1,
        "args_digest": snap.args_digest,
        "binding_digest": snap.binding_digest,
        "max_runtime_ms": 60_000,
        "created_at": 1.0,
    }
