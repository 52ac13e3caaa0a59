"""DESIGN §5's race table, row by row, end to end: real Mind, real Hand, real processes, with the
order steered by the fault proxy and by commands that wait on files (no sleeps that hope)."""

import asyncio
import os

import pytest
from websockets.asyncio.client import connect

from mind.client.aio import MindClient, load_credential
from mind.testing.cluster import pid_alive, running, wait_until
from protocol.auth import ClientHandshake
from protocol.codes import CancelStatus
from protocol.envelope import Channel
from protocol.messages import Accepted, HandClaims, Result, Rpc
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind and Hand, some behind the fault proxy

GATE = "while [ ! -e {0} ]; do sleep 0.02; done"
SLOW_PINGS = ("--ping-interval", "30")  # keepalive must not decide these races


@pytest.fixture
def slow(tmp_path):
    """Mind and Hand through the proxy, with keepalive out of the way."""
    with running(tmp_path, "box", *SLOW_PINGS, via_proxy=True, mind_args=SLOW_PINGS) as cl:
        yield cl


async def client(cl) -> MindClient:
    return await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred"))


async def until(cond, timeout=15.0, what="condition"):
    return await asyncio.to_thread(wait_until, cond, timeout, what)


def root(cl):
    return cl.tmp / "root-box"


async def started(handle, cl) -> str:
    async for ev in handle.events():
        if getattr(ev, "state", None) is RunState.RUNNING:
            return handle.run_id
    raise AssertionError("run ended before running")


async def test_result_then_cancel_keeps_the_result_and_answers_already_done(tmp_path):
    with running(tmp_path) as cl:
        async with await client(cl) as mc:
            end = await mc.exec("box", "exec", {"argv": ["true"]}, timeout=10)
            assert end.state is RunState.SUCCEEDED
            reply = await mc.cancel(end.run_id)
            assert reply.status is CancelStatus.ALREADY_DONE and reply.state is RunState.SUCCEEDED
            assert (await mc.get_run(end.run_id)).state is RunState.SUCCEEDED


async def test_result_in_flight_when_cancel_is_requested_still_succeeds(slow):
    """The command finishes and its result is on the wire (held by the proxy) when the user cancels:
    the run is `succeeded`, because the command did run; the cancel was only a request."""
    cl = slow
    async with await client(cl) as mc:
        h = await mc.start("box", "shell", {"command": GATE.format("go")}, timeout=30)
        await started(h, cl)
        cl.proxy.hold("result", "up")  # the proxy reads the frames: the result itself is held
        (root(cl) / "go").write_text("")
        await until(lambda: cl.proxy.frames_seen("result", "up") == 1, 10, "the result to reach the proxy")
        reply = await mc.cancel(h.run_id)
        assert reply.status is CancelStatus.CANCEL_REQUESTED and reply.state is RunState.CANCEL_REQUESTED
        cl.proxy.release()
        end = await asyncio.wait_for(h.wait(), 15)
        assert end.state is RunState.SUCCEEDED and end.exit_code == 0


async def test_cancel_reaching_the_hand_first_kills_the_tree(tmp_path):
    with running(tmp_path) as cl:
        async with await client(cl) as mc:
            h = await mc.start("box", "shell", {"command": "echo $$ > p.pid; sleep 60"}, timeout=30)
            await started(h, cl)
            await until(lambda: (root(cl) / "p.pid").exists() and (root(cl) / "p.pid").read_text().strip())
            pid = int((root(cl) / "p.pid").read_text())
            assert (await mc.cancel(h.run_id)).status is CancelStatus.CANCEL_REQUESTED
            end = await asyncio.wait_for(h.wait(), 15)
            assert end.state is RunState.CANCELLED and end.stage is not None
            assert not pid_alive(pid)


async def test_accepting_connection_dropping_before_the_result_is_lost(slow):
    cl = slow
    async with await client(cl) as mc:
        h = await mc.start("box", "shell", {"command": "sleep 60"}, timeout=30)
        await started(h, cl)
        cl.proxy.send("cut fin")
        end = await asyncio.wait_for(h.wait(), 15)
        assert end.state is RunState.LOST


async def scripted_hand(url, cred):
    ws = await connect(url, compression=None)
    ch = Channel()
    hs = ClientHandshake(
        cred, os.urandom(32), HandClaims(hostname="s", platform="p", machine="m", python="3", version="0")
    )
    await ws.send(ch.stamp(hs.hello()))
    await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
    ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)
    return ws, ch


async def next_rpc(ws, ch) -> Rpc:
    while True:
        msg = ch.receive(await asyncio.wait_for(ws.recv(), 10)).msg
        if isinstance(msg, Rpc):
            return msg


async def test_a_new_generation_cannot_answer_a_run_of_the_old_one(tmp_path):
    with running(tmp_path, hand=None) as cl:
        cred = load_credential(cl.add_hand("twin"))
        ws1, ch1 = await scripted_hand(cl.url, cred)
        async with await client(cl) as mc:
            h = await mc.start("twin", "exec", {"argv": ["true"]}, timeout=30)
            rpc = await next_rpc(ws1, ch1)
            await ws1.send(ch1.stamp(Accepted(run_id=rpc.run_id)))
            ws2, ch2 = await scripted_hand(cl.url, cred)  # same label: replaces generation 1
            end = await asyncio.wait_for(h.wait(), 10)
            assert end.state is RunState.LOST
            # the new generation now claims the old run succeeded: refused, nothing changes
            await ws2.send(ch2.stamp(Result(run_id=rpc.run_id, state=RunState.SUCCEEDED, exit_code=0)))
            await until(lambda: "hand_input_wrong_generation" in cl.mind.output() or "late_input" in cl.mind.output())
            assert (await mc.get_run(rpc.run_id)).state is RunState.LOST
        await ws2.close()


async def test_deadline_on_the_hand_kills_the_tree_timed_out(tmp_path):
    with running(tmp_path) as cl:
        async with await client(cl) as mc:
            end = await mc.exec("box", "shell", {"command": "echo $$ > d.pid; sleep 60"}, timeout=1, grace=1)
            assert end.state is RunState.TIMED_OUT and end.stage is not None
            assert not pid_alive(int((root(cl) / "d.pid").read_text()))


async def test_mind_decides_timed_out_when_the_hand_is_blackholed_and_tells_the_hand(slow):
    cl = slow
    async with await client(cl) as mc:
        cl.proxy.send("blackhole")
        end = await asyncio.wait_for(mc.exec("box", "shell", {"command": "sleep 60"}, timeout=1, grace=0), 20)
        assert end.state is RunState.TIMED_OUT and "no answer from the hand" in end.reason
        cl.proxy.send("resume")
        # the Hand's own late answer (it enforced the same deadline) changes nothing: first terminal won
        await until(lambda: "late_input" in cl.mind.output(), 15, "the hand's late answer")
        assert (await mc.get_run(end.run_id)).state is RunState.TIMED_OUT


async def test_waiting_client_disconnect_cancels_the_run(tmp_path):
    with running(tmp_path) as cl:
        mc = await client(cl)
        h = await mc.start("box", "shell", {"command": "echo $$ > w.pid; sleep 60"}, timeout=30)
        run_id = await started(h, cl)
        await until(lambda: (root(cl) / "w.pid").exists() and (root(cl) / "w.pid").read_text().strip())
        pid = int((root(cl) / "w.pid").read_text())
        await mc.close()
        await until(lambda: not pid_alive(pid), 15, "the run to be killed after its client left")
        async with await client(cl) as mc2:
            async with asyncio.timeout(15):  # the tree is gone; its result is on its way
                while (info := await mc2.get_run(run_id)).state is RunState.CANCEL_REQUESTED:  # noqa: ASYNC110 - polls the Mind
                    await asyncio.sleep(0.05)
            assert info.state is RunState.CANCELLED and info.end.reason == "client_disconnected"


async def test_blackholed_hand_is_detected_by_keepalive_and_heals_by_itself(tmp_path):
    with running(tmp_path, via_proxy=True) as cl:  # ping interval 1 s on both sides
        gen = cl.hand_info("box")["generation"]
        async with await client(cl) as mc:
            h = await mc.start("box", "shell", {"command": "sleep 60"}, timeout=60)
            await started(h, cl)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            cl.proxy.send("blackhole")
            end = await asyncio.wait_for(h.wait(), 20)
            assert end.state is RunState.LOST
            assert loop.time() - t0 < 6  # ~2 ping intervals, plus scheduling slack
            cl.proxy.send("resume")
            info = await asyncio.to_thread(cl.wait_connected, "box", gen + 1, 30)
            assert info["generation"] > gen
            again = await mc.exec("box", "exec", {"argv": ["echo", "healed"]}, timeout=10)
            assert again.state is RunState.SUCCEEDED and again.stdout.data == b"healed\n"
