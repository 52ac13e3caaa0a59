"""`Mind.perform` with an endings store over the network (DESIGN §15, §16): an ending is durable
before the actions after it, and nothing performed later overtakes them; on SQLite the write
happens on the loop as before. The daemon's performer, with the stores replaced by recorders."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mind.core.runs import PersistEnding, SendToClient
from mind.daemon.server import Mind, MindConfig
from mind.store.endings import Ending
from protocol.messages import Message, RunEnd
from protocol.states import RunState


class Outbox:
    """A client connection's outbox that writes what it is handed into the shared log."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def put(self, msg: Message, id_: str | None = None, droppable: bool = False) -> None:
        self.log.append(f"told {msg.run_id}")  # type: ignore[attr-defined]


@dataclass
class Client:
    outbox: Outbox


class RemoteEndings:
    """An engine with no write on the loop: `put_many` waits at a gate, as a database round trip does."""

    put_many_now = None

    def __init__(self, log: list[str]) -> None:
        self.gate = asyncio.Event()
        self.log = log

    async def put_many(self, endings: list[Ending]) -> None:
        await self.gate.wait()
        self.log.append("stored " + " ".join(e.end.run_id for e in endings))


class LocalEndings:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.put_many_now = lambda endings: self.log.append("stored " + " ".join(e.end.run_id for e in endings))


def end(run_id: str) -> RunEnd:
    return RunEnd(run_id=run_id, state=RunState.SUCCEEDED, hand="h", tool="exec", exit_code=0)


def told(mind: Mind, log: list[str]) -> None:
    mind.clients["c"] = Client(Outbox(log))  # type: ignore[assignment]


async def test_a_remote_ending_is_stored_before_anything_after_it_and_order_holds(tmp_path):
    log: list[str] = []
    mind = Mind(MindConfig(home=tmp_path))
    mind.endings = RemoteEndings(log)  # type: ignore[assignment]
    told(mind, log)
    async with asyncio.TaskGroup() as tg:
        mind._tg = tg
        mind.perform([SendToClient("c", "q0", end("r0"))])  # nothing to wait for: at once
        assert log == ["told r0"]
        mind.perform([PersistEnding("r1", end("r1"), "me"), SendToClient("c", "q1", end("r1"))])
        mind.perform([SendToClient("c", "q2", end("r2"))])  # later, and not an ending: still after r1
        await asyncio.sleep(0.01)
        assert log == ["told r0"]  # the ending is not written yet: nobody was told
        mind.endings.gate.set()  # type: ignore[attr-defined]
        for _ in range(100):
            if len(log) == 4:
                break
            await asyncio.sleep(0.01)
    assert log == ["told r0", "stored r1", "told r1", "told r2"]
    mind.perform([SendToClient("c", "q3", end("r3"))])  # the queue drained: at once again
    assert log[-1] == "told r3"


async def test_local_endings_of_one_turn_are_written_on_the_loop_in_one_transaction(tmp_path):
    log: list[str] = []
    mind = Mind(MindConfig(home=tmp_path))
    mind.endings = LocalEndings(log)  # type: ignore[assignment]
    told(mind, log)
    mind.perform([PersistEnding("r1", end("r1"), "me"), SendToClient("c", "q1", end("r1"))])
    mind.perform([PersistEnding("r2", end("r2"), "me"), SendToClient("c", "q2", end("r2"))])
    assert log == []  # held until the end of this turn of the loop
    await asyncio.sleep(0)
    assert log == ["stored r1 r2", "told r1", "told r2"]


async def test_endings_decided_while_a_remote_commit_is_in_flight_wait_for_it_and_go_next(tmp_path):
    log: list[str] = []
    mind = Mind(MindConfig(home=tmp_path))
    mind.endings = RemoteEndings(log)  # type: ignore[assignment]
    told(mind, log)
    mind.perform([PersistEnding("r1", end("r1"), "me"), SendToClient("c", "q1", end("r1"))])
    await asyncio.sleep(0.01)  # r1's commit is in flight, at the gate
    mind.perform([PersistEnding("r2", end("r2"), "me"), SendToClient("c", "q2", end("r2"))])
    mind.perform([SendToClient("c", "q3", end("r3"))])
    await asyncio.sleep(0.01)
    assert log == []
    mind.endings.gate.set()  # type: ignore[attr-defined]
    await asyncio.wait_for(mind.held.drain(), 5)
    assert log == ["stored r1", "told r1", "stored r2", "told r2", "told r3"]
