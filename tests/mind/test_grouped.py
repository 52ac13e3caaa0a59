"""The Mind's per-turn grouping (`mind/daemon/grouped.py`): endings committed together before
anything after them is performed, and `result_ack`s riding with the next frame to their Hand."""

from __future__ import annotations

import asyncio

from mind.core.runs import Log, PersistEnding, SendToClient
from mind.daemon.grouped import ACK_BATCH, HeldActions, ResultAcks
from mind.store.endings import Ending, EndingStore
from protocol.messages import Message, ResultAck, RunEnd
from protocol.states import RunState


def end(run_id: str) -> RunEnd:
    return RunEnd(run_id=run_id, hand="h", tool="exec", state=RunState.SUCCEEDED, exit_code=0)


class Recorder:
    """What the shell did, in order: commits (with the run ids) and performed actions."""

    def __init__(self) -> None:
        self.trace: list[tuple[str, object]] = []

    def perform(self, a: object) -> None:
        self.trace.append(("performed", a.req_id if isinstance(a, SendToClient) else a.event))  # type: ignore[attr-defined]

    def commit(self, batch: list[PersistEnding]) -> None:
        self.trace.append(("committed", [p.run_id for p in batch]))


def tell(run_id: str) -> SendToClient:
    return SendToClient("c1", run_id, end(run_id))


async def test_endings_of_one_turn_commit_together_before_anything_after_them():
    rec = Recorder()
    held = HeldActions(rec.perform, rec.commit)
    held.hold([PersistEnding("r1", end("r1")), tell("r1")])
    held.hold([Log("x", {}), PersistEnding("r2", end("r2")), tell("r2")])  # behind them, in order
    assert held.holding and rec.trace == []  # nothing told before the commit
    await asyncio.sleep(0)  # the turn ends
    assert rec.trace == [("committed", ["r1", "r2"]), ("performed", "r1"), ("performed", "x"), ("performed", "r2")]
    assert not held.holding


def test_without_a_loop_the_commit_is_immediate():
    rec = Recorder()
    HeldActions(rec.perform, rec.commit).hold([PersistEnding("r1", end("r1")), tell("r1")])
    assert rec.trace == [("committed", ["r1"]), ("performed", "r1")]


def test_put_many_is_one_transaction_and_reads_back(tmp_path):
    store = EndingStore(tmp_path / "endings.db")
    store.load(60.0, now=1000.0)
    store.put_many([Ending(end(f"r{i}"), "alice", 1000.0) for i in range(64)])
    store.close()
    again = EndingStore(tmp_path / "endings.db")
    assert sorted(e.end.run_id for e in again.load(60.0, now=1001.0)) == sorted(f"r{i}" for i in range(64))


def test_the_bound_holds_with_endings_that_share_a_time(tmp_path, monkeypatch):
    """A batch shares one wall time: the oldest beyond MAX_ROWS go, ties at the cutoff with them."""
    from mind.store import endings

    monkeypatch.setattr(endings, "PRUNE_EVERY", 8)
    monkeypatch.setattr(endings, "MAX_ROWS", 10)
    store = EndingStore(tmp_path / "endings.db")
    store.load(60.0, now=1000.0)
    for batch in range(4):
        store.put_many([Ending(end(f"b{batch}r{i}"), "alice", 1000.0 + batch) for i in range(4)])
    kept = [e.end.run_id for e in store.load(60.0, now=1004.0)]
    assert len(kept) <= 10 and {f"b3r{i}" for i in range(4)} | {f"b2r{i}" for i in range(4)} <= set(kept)


class Outbox:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def put(self, msg: Message) -> None:
        self.sent.append(msg)


class HandPeer:
    def __init__(self) -> None:
        self.outbox = Outbox()


async def test_acks_wait_for_the_next_frame_or_the_delay():
    acks, peer = ResultAcks(), HandPeer()
    acks.hold(peer, ResultAck(run_id="r1"))  # type: ignore[arg-type]
    acks.hold(peer, ResultAck(run_id="r2"))  # type: ignore[arg-type]
    assert peer.outbox.sent == []
    acks.release(peer)  # type: ignore[arg-type]  # a frame to this Hand follows: they go first
    assert [m.run_id for m in peer.outbox.sent] == ["r1", "r2"]  # type: ignore[attr-defined]
    acks.hold(peer, ResultAck(run_id="r3"))  # type: ignore[arg-type]
    for _ in range(200):  # bounded: the delay is 50 ms
        if len(peer.outbox.sent) == 3:
            break
        await asyncio.sleep(0.01)
    assert [m.run_id for m in peer.outbox.sent] == ["r1", "r2", "r3"]  # type: ignore[attr-defined]


async def test_acks_never_pile_up_past_the_batch():
    acks, peer = ResultAcks(), HandPeer()
    for i in range(ACK_BATCH):
        acks.hold(peer, ResultAck(run_id=f"r{i}"))  # type: ignore[arg-type]
    assert len(peer.outbox.sent) == ACK_BATCH


def test_one_failing_action_does_not_silence_the_others_held_with_it():
    """Held actions belong to many calls: a bug in performing one must not drop the others' answers."""
    rec = Recorder()

    def perform(a: object) -> None:
        if isinstance(a, SendToClient) and a.req_id == "r1":
            raise RuntimeError("a bug")
        rec.perform(a)

    HeldActions(perform, rec.commit).hold(
        [PersistEnding("r1", end("r1")), tell("r1"), PersistEnding("r2", end("r2")), tell("r2")]
    )
    assert rec.trace == [("committed", ["r1", "r2"]), ("performed", "r2")]
