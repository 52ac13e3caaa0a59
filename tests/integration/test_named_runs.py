"""Named runs (issue 40, item 1: one frame each way per call): a client names its run's id, so a
call is answered by its `run_end` alone, and no client can name a run it does not own.

Real processes: a `mind serve` and a `hand run`; the wire is read as a client reads it (the real
`ClientSession` over a real WebSocket), one frame per WebSocket message, so the frames a call costs
are counted, not inferred."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from websockets.asyncio.client import ClientConnection, connect

from mind.client.aio import ClientError
from mind.client.session import ClientSession, Failed, Opened, RunEnded, RunEvent
from mind.testing.cluster import Cluster, running
from protocol import limits
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.ids import named_run
from protocol.messages import Exec, RunEnd, StreamData, Streams
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind and Hand


@pytest.fixture
def cl(tmp_path):
    with running(tmp_path) as c:
        yield c


class Wire:
    """A client on the real protocol that keeps every frame the Mind sends, by request id."""

    def __init__(self, ws: ClientConnection, session: ClientSession) -> None:
        self.ws = ws
        self.session = session
        self.frames: dict[str, list[object]] = {}

    @classmethod
    async def open(cls, url: str, cred: Credential) -> Wire:
        ws = await connect(url, compression=None, max_size=limits.MAX_FRAME_BYTES, open_timeout=10)
        session = ClientSession(cred, os.urandom(limits.NONCE_BYTES))
        wire = cls(ws, session)
        await wire.flush()
        while not any(isinstance(ev, Opened) for ev in await wire.read()):
            await wire.flush()  # our proof, once the challenge came
        return wire

    async def flush(self) -> None:
        for frame in self.session.data_to_send():
            await self.ws.send(frame)

    async def read(self) -> list[object]:
        events = self.session.receive_data(await asyncio.wait_for(self.ws.recv(), 20))
        for ev in events:
            if isinstance(ev, (RunEvent, RunEnded, Failed)):
                self.frames.setdefault(ev.id, []).append(ev)
        return events

    async def run(self, msg: Exec) -> list[object]:
        """Send `msg`; every frame its run got, up to its end or its refusal."""
        id_ = self.session.start_run(msg)
        await self.flush()
        while not any(isinstance(ev, (RunEnded, Failed)) for ev in self.frames.get(id_, [])):
            await self.read()
        return self.frames[id_]


def call(name: str | None, tool: str = "read_file", **args: object) -> Exec:
    return Exec(hand="box", tool=tool, args=args or {"path": "x.txt"}, timeout_ms=10_000, watch=False, run_id=name)


async def test_a_named_call_is_answered_by_its_end_alone_and_an_unnamed_one_by_two_frames(cl: Cluster):
    (cl.hands["box"].root / "x.txt").write_bytes(b"hello")
    w = await Wire.open(cl.url, cl.credential("tester"))
    try:
        assert w.session.run_ids is not None
        name = w.session.name_run()
        named = await w.run(call(name))
        assert len(named) == 1 and isinstance(named[0], RunEnded)
        end = named[0].msg
        assert end.run_id == name and end.state is RunState.SUCCEEDED and end.value["data"] == b"hello"
        unnamed = await w.run(call(None))  # the Mind names it: `admitted` says which, then the end
        assert [type(ev) for ev in unnamed] == [RunEvent, RunEnded]
        assert unnamed[0].msg.state is RunState.ADMITTED and unnamed[0].msg.run_id == unnamed[1].msg.run_id
        watching = await w.run(call(w.session.name_run()).model_copy(update={"watch": True}))
        assert watching[0].msg.state is RunState.ADMITTED  # a watcher is told every state, named or not
    finally:
        await w.ws.close()
    async with await cl.client() as mc:  # the run is the Mind's under the client's name
        info = await mc.get_run(name)
        assert info.run_id == name and info.state is RunState.SUCCEEDED


async def test_a_named_streamed_run_hears_its_numbers_first_and_no_admitted_update(cl: Cluster):
    """A streamed run's `stream_numbers` are sent at its admission: for a named run they are its
    first answer and say all `admitted` said. An unnamed one still gets `admitted` to learn its id."""
    w = await Wire.open(cl.url, cl.credential("tester"))
    try:
        streamed = call(w.session.name_run(), "exec", argv=["echo", "hi"]).model_copy(update={"streams": Streams()})
        named = await w.run(streamed)
        kinds = [ev.msg.TYPE for ev in named]
        assert kinds[0] == "stream_numbers" and "run_update" not in kinds, kinds
        assert kinds[-1] == "run_end" and named[-1].msg.state is RunState.SUCCEEDED
        out = b"".join(bytes(ev.msg.data) for ev in named if ev.msg.TYPE == "stream_data" and ev.msg.stream == "stdout")
        assert out == b"hi\n"
        unnamed = await w.run(streamed.model_copy(update={"run_id": None}))
        kinds = [ev.msg.TYPE for ev in unnamed]
        assert kinds[:2] == ["stream_numbers", "run_update"] and unnamed[1].msg.state is RunState.ADMITTED, kinds
    finally:
        await w.ws.close()
    async with await cl.client() as mc:  # the library names its streamed runs: stdin still flows whole
        h = await mc.start("box", "exec", {"argv": ["cat"]}, stdin=b"x" * 300_000)
        assert h.run_id is not None and h.run_id.startswith(mc._session.run_ids or "?")
        got = bytearray()
        async for ev in h.events():
            if isinstance(ev, StreamData) and ev.stream == "stdout":
                got += ev.data
        assert h.end is not None and h.end.state is RunState.SUCCEEDED and bytes(got) == b"x" * 300_000


async def test_no_client_names_another_connections_run_or_a_name_twice_and_nothing_starts(cl: Cluster):
    root = cl.hands["box"].root
    a = await Wire.open(cl.url, cl.credential("tester"))
    b = await Wire.open(cl.url, cl.credential("tester"))  # the same identity: still not a's connection
    try:
        assert a.session.run_ids != b.session.run_ids
        theirs = named_run(a.session.run_ids, 1)
        prefix = b.session.run_ids
        for bad in (theirs, named_run(prefix, 0), f"{prefix}.01", f"{prefix}.-1", f"{prefix}x.1", "r1.1"):
            got = await b.run(call(bad, "write_file", path=f"stolen-{len(os.listdir(root))}", data=b"x"))
            assert len(got) == 1 and isinstance(got[0], Failed), bad
            assert got[0].error.code == ErrorCode.INVALID_PAYLOAD, bad
        assert sorted(os.listdir(root)) == []  # nothing was started for any of them
        mine = named_run(prefix, 5)
        assert isinstance((await b.run(call(mine, "write_file", path="once", data=b"1")))[0], RunEnded)
        for again in (mine, named_run(prefix, 4)):  # a name used, or one below it: refused
            got = await b.run(call(again, "write_file", path="twice", data=b"2"))
            assert isinstance(got[0], Failed) and got[0].error.code == ErrorCode.INVALID_PAYLOAD
        assert sorted(os.listdir(root)) == ["once"]
        # a's own name was never taken by b's attempt
        got = await a.run(call(theirs, "write_file", path="a", data=b"a"))
        assert isinstance(got[0], RunEnded) and got[0].msg.run_id == theirs and got[0].msg.state is RunState.SUCCEEDED
    finally:
        await a.ws.close()
        await b.ws.close()


async def test_a_named_call_is_known_at_once_and_cancelled_before_any_answer(cl: Cluster):
    async with await cl.client() as mc:
        seen: list[object] = []
        handle = await mc.start("box", "exec", {"argv": ["sleep", "30"]}, stream=False, watch=False)
        assert handle.run_id is not None and handle.run_id.startswith(mc._session.run_ids + ".")
        waiting = asyncio.ensure_future(handle.wait(seen.append))
        deadline = time.monotonic() + 10
        while (await mc.get_run(handle.run_id)).state is not RunState.RUNNING:
            assert time.monotonic() < deadline, "the run never started"
            await asyncio.sleep(0.05)
        result = await asyncio.wait_for(handle.cancel(), 10)
        assert result.run_id == handle.run_id
        end = await asyncio.wait_for(waiting, 20)
    assert isinstance(end, RunEnd) and end.state is RunState.CANCELLED and end.run_id == handle.run_id
    assert seen == [end]  # its end was the only event: no `admitted` came to say what was known


async def test_a_name_refused_fails_the_call_with_a_clear_error_in_the_library(cl: Cluster):
    async with await cl.client() as mc:
        mc._session._named = 0  # as if the counter went back: the next name is one already used
        assert (await mc.exec("box", "exec", {"argv": ["true"]}, stream=False)).state is RunState.SUCCEEDED
        mc._session._named = 0
        with pytest.raises(ClientError) as err:
            await mc.exec("box", "exec", {"argv": ["true"]}, stream=False)
        assert err.value.code == ErrorCode.INVALID_PAYLOAD and "named before" in str(err.value)
