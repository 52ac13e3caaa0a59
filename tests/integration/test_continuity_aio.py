"""Continuity of the Python client (issue 22, must-holds 3 and 6): a run outlives a cut of the client
leg, another client of the same identity can take it over, a wait bound leaves it running, and
`mind task wait` / `mind task logs --follow` ride out a restart of the Mind.

Real processes: a Mind with an explicit `--resume-window` (the suite pins 0), a Hand, and a fault
proxy in front of the Mind for the client leg only (the Hand dials the Mind directly), so every
fault here is the client's. The streamed cases need the Hand to resend from a resume point
(`stream_resume`, the Hand leg of issue 22): until that lands they fail, and are marked so, strictly.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import sys
import time

import pytest

from mind.client.aio import ClientError, StillRunning
from mind.testing.cluster import Cluster, running, wait_until
from protocol.codes import ErrorCode
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind, a Hand and a fault proxy

WINDOW = ("--resume-window", "30")
LINES = 40
TICKER = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done; exit 3"
EXPECTED = b"".join(b"line %d\n" % i for i in range(1, LINES + 1))


@pytest.fixture
def cl(tmp_path):
    with running(tmp_path, mind_args=WINDOW) as c:
        yield c


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def newest_connection(proxy) -> int:
    """The id of the newest live connection through the proxy (ids grow: a reconnect is a new one)."""
    return max((c["id"] for c in proxy.status()["connections"]), default=0)


async def test_exec_rides_out_a_reset_and_a_blackhole_of_the_client_leg(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        assert mc.resume_window == 30
        seen: list[bytes] = []
        handle = await mc.start("box", "exec", {"argv": ["sh", "-c", TICKER]}, stream=False)
        waiting = asyncio.ensure_future(handle.wait(lambda ev: seen.append(getattr(ev, "data", b""))))
        await until(lambda: len(seen) >= 3, 10, "output before the cut")
        before = newest_connection(fp)
        fp.cut("rst")  # reset, link back at once
        await until(lambda: newest_connection(fp) > before, 10, "the client to reconnect")
        await asyncio.sleep(0.5)
        fp.blackhole()  # nothing passes, nobody is told
        await asyncio.sleep(5)
        fp.resume()
        end = await asyncio.wait_for(waiting, 30)
    assert end.state is RunState.FAILED and end.exit_code == 3  # the real end, not "connection lost"
    assert end.stdout.total == len(EXPECTED) and end.stdout.data == EXPECTED


async def test_a_second_client_attaches_after_the_first_died_and_the_first_is_told_it_was_replaced(cl: Cluster):
    # the first client is a process killed with -9: nothing of it says goodbye
    cred = cl.client_credential()
    program = (
        "import asyncio, sys\n"
        "from mind.client.aio import MindClient, load_credential\n"
        "async def main():\n"
        f"    mc = await MindClient.connect({cl.url!r}, load_credential({str(cred)!r}))\n"
        f"    h = await mc.start('box', 'exec', {{'argv': ['sh', '-c', {TICKER!r}]}}, stream=False)\n"
        "    async for ev in h.events():\n"
        "        print(ev.run_id, flush=True)\n"
        "        await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    first = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, env=cl.env)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(first.stdout.readline), 20)
        run_id = line.decode().strip()
        first.kill()
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    async with await cl.client() as mc, await cl.client() as other:
        handle = await mc.attach(run_id)
        newer = await other.attach(run_id)  # the newest attachment wins
        with pytest.raises(ClientError) as replaced:
            await asyncio.wait_for(handle.wait(), 10)
        assert replaced.value.code is ErrorCode.REPLACED and run_id in replaced.value.message
        end = await asyncio.wait_for(newer.wait(), 30)
    assert end.run_id == run_id and end.state is RunState.FAILED and end.exit_code == 3
    assert end.stdout.data == EXPECTED


async def test_detach_then_attach_and_a_wait_bound_then_attach_get_the_real_end(cl: Cluster):
    async with await cl.client() as mc:
        handle = await mc.start("box", "exec", {"argv": ["sh", "-c", "sleep 2; echo done; exit 7"]}, stream=False)
        await until(lambda: handle.run_id is not None, 10, "the run's id")
        assert await handle.detach() == 30  # kept for the window
        with pytest.raises(StillRunning):
            await handle.wait()
        end = await asyncio.wait_for((await mc.attach(handle.run_id)).wait(), 20)
        assert end.state is RunState.FAILED and end.exit_code == 7 and end.stdout.data == b"done\n"

        with pytest.raises(StillRunning) as still:
            await mc.exec("box", "exec", {"argv": ["sh", "-c", "sleep 3; echo late; exit 4"]}, stream=False, wait=1)
        assert "mind attach " + still.value.run_id in str(still.value)
        info = await mc.get_run(still.value.run_id)
        assert info.state is RunState.RUNNING  # left running, not cancelled
    async with await cl.client() as again:  # a new connection of the same identity
        end = await asyncio.wait_for((await again.attach(still.value.run_id)).wait(), 20)
    assert end.state is RunState.FAILED and end.exit_code == 4 and end.stdout.data == b"late\n"


async def test_attach_refuses_a_run_of_another_client_and_an_unknown_run(cl: Cluster):
    async with await cl.client("alice") as alice, await cl.client("bob") as bob:
        handle = await alice.start("box", "exec", {"argv": ["sleep", "5"]}, stream=False)
        await until(lambda: handle.run_id is not None, 10, "the run's id")
        with pytest.raises(ClientError) as other:
            await bob.attach(handle.run_id)
        assert other.value.code is ErrorCode.NOT_ALLOWED
        with pytest.raises(ClientError) as unknown:
            await bob.attach("r-no-such-run")
        assert unknown.value.code is ErrorCode.UNKNOWN_RUN
        await handle.cancel()
        end = await asyncio.wait_for(handle.wait(), 20)
        assert end.state is RunState.CANCELLED


async def test_past_the_window_the_run_fails_saying_its_fate_is_unknown_here(tmp_path):
    with running(tmp_path, mind_args=("--resume-window", "2")) as cl:
        fp = cl.start_proxy()
        async with await cl.client(url=fp.url) as mc:
            handle = await mc.start("box", "exec", {"argv": ["sleep", "30"]}, stream=False)
            await until(lambda: handle.run_id is not None, 10, "the run's id")
            fp.partition()  # cut, and refuse every new connection
            t0 = time.monotonic()
            with pytest.raises(ClientError) as lost:
                await asyncio.wait_for(handle.wait(), 15)
            assert time.monotonic() - t0 < 6
            assert lost.value.code == "closed" and "fate is unknown here" in lost.value.message
            assert handle.run_id in lost.value.message


async def test_a_cancel_asked_during_an_outage_is_sent_once_on_return(cl: Cluster):
    fp = cl.start_proxy()
    root = cl.tmp / "root-box"
    async with await cl.client(url=fp.url) as mc:
        handle = await mc.start("box", "exec", {"argv": ["sh", "-c", "echo $$ > c.pid; exec sleep 60"]}, stream=False)
        await until(lambda: (root / "c.pid").exists() and (root / "c.pid").read_text().strip() != "", 15, "start")
        fp.partition()
        await until(lambda: not mc.connected, 10, "the client to notice the cut")
        asks = [asyncio.ensure_future(handle.cancel()) for _ in range(3)]
        await asyncio.sleep(1)
        assert not any(a.done() for a in asks)  # nothing to send it on yet
        fp.reset()  # accept again
        results = await asyncio.wait_for(asyncio.gather(*asks), 20)
        assert len({id(r) for r in results}) == 1 and results[0].run_id == handle.run_id  # one request
        end = await asyncio.wait_for(handle.wait(), 20)
    assert end.state is RunState.CANCELLED


async def test_a_fleet_run_rides_out_a_cut_of_the_client_leg(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        fleet = mc.exec_many("box", "exec", {"argv": ["sh", "-c", "sleep 2; echo fleet"]}, stream=False)
        waiting = asyncio.ensure_future(fleet.wait())
        await until(lambda: bool(fleet.results) and all(r.run_id for r in fleet.results.values()), 10, "the run")
        async with await cl.client() as direct:  # (its id is the client's own at once: the Mind has it too)
            run_id = fleet.results["box"].run_id
            deadline = time.monotonic() + 10
            while (await direct.get_run(run_id)).state is not RunState.RUNNING:
                assert time.monotonic() < deadline, "the run never started"
                await asyncio.sleep(0.05)
        before = newest_connection(fp)
        fp.cut("rst")
        await until(lambda: newest_connection(fp) > before, 10, "the client to reconnect")
        aggregate = await asyncio.wait_for(waiting, 20)
    assert aggregate.ok and not aggregate.abandoned and aggregate.counts == {"succeeded": 1}
    assert fleet.results["box"].end.stdout.data == b"fleet\n"


async def test_a_read_whose_answer_a_cut_lost_is_asked_again_and_a_cancel_in_flight_fails(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        handle = await mc.start("box", "exec", {"argv": ["sleep", "30"]}, stream=False)
        await until(lambda: handle.run_id is not None, 10, "the run's id")
        fp.frame("cut", "run_info", direction="down")  # RST instead of get_run's answer
        info = await asyncio.wait_for(mc.get_run(handle.run_id), 15)  # asked again on the new connection
        assert info.run_id == handle.run_id and info.state is RunState.RUNNING and mc.reconnects == 1
        await until(lambda: mc.connected, 10, "the new connection")
        fp.frame("cut", "cancel_run_result", direction="down")
        with pytest.raises(ClientError) as cut:  # not a read: its answer is lost, nobody says it twice
            await asyncio.wait_for(mc.cancel(handle.run_id), 15)
        assert cut.value.code == "closed"
        end = await asyncio.wait_for(handle.wait(), 20)  # the run itself rode it out: its real end
    assert end.state is RunState.CANCELLED and mc.reconnects == 2


async def test_a_fleet_start_cut_before_its_answer_is_that_hands_run_never_the_fleet_abandoned(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        # The member's run is named by the client: an RST before its first answer, and the client
        # attaches by that name on return and gets the run's real end (unnamed, it was `lost`).
        fp.frame("cut", "stream_numbers", direction="down")
        aggregate = await asyncio.wait_for(mc.exec_many("box", "exec", {"argv": ["true"]}, stream=True).wait(), 20)
        assert not aggregate.abandoned and aggregate.counts == {"succeeded": 1}
        await until(lambda: mc.connected, 10, "the client to reconnect for what comes next")
        # The RST takes the `exec` itself: the Mind never heard of the run; for the fleet that Hand's
        # run is `lost` (the client cannot know more), and the fleet is not abandoned for it.
        fp.frame("cut", "exec", direction="up")
        aggregate = await asyncio.wait_for(mc.exec_many("box", "exec", {"argv": ["true"]}, stream=True).wait(), 20)
        assert not aggregate.abandoned and aggregate.counts == {"lost": 1}
        await until(lambda: mc.connected, 10, "the client to reconnect for what comes next")
        end = await asyncio.wait_for(mc.exec("box", "exec", {"argv": ["echo", "next"]}, stream=False), 20)
    assert end.stdout.data == b"next\n" and mc.reconnects == 2


async def test_a_named_call_whose_exec_a_cut_took_fails_saying_its_fate_is_unknown_and_never_runs(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        # The RST takes the `exec` itself: the client knows the id it named and attaches on return;
        # the Mind never heard of the run, and says so at once (nothing waits for it).
        fp.frame("cut", "exec", direction="up")
        with pytest.raises(ClientError) as err:
            await asyncio.wait_for(mc.exec("box", "exec", {"argv": ["touch", "ran"]}, stream=False), 20)
        assert err.value.code is ErrorCode.UNKNOWN_RUN and "fate is unknown here" in err.value.message
        assert mc.reconnects == 1
        end = await asyncio.wait_for(mc.exec("box", "exec", {"argv": ["touch", "next"]}, stream=False), 20)
    assert end.state is RunState.SUCCEEDED and (cl.hands["box"].root / "next").exists()  # (where `ran` would be)
    assert not (cl.hands["box"].root / "ran").exists()


async def test_a_named_call_whose_only_answer_a_cut_lost_gets_its_real_end_on_return(cl: Cluster):
    fp = cl.start_proxy()
    async with await cl.client(url=fp.url) as mc:
        # A call names its run: its end is its only frame, and the RST takes it. The client knows
        # the id it named, attaches on return, and gets the end the Mind kept, not `lost`.
        fp.frame("cut", "run_end", direction="down")
        aggregate = await asyncio.wait_for(
            mc.exec_many("box", "exec", {"argv": ["echo", "ran"]}, stream=False).wait(), 20
        )
        assert not aggregate.abandoned and aggregate.counts == {"succeeded": 1}
        assert mc.reconnects == 1


@pytest.fixture
def short(tmp_path):
    """A window that outlasts the faults of a test, and no more: a failure costs that long."""
    with running(tmp_path, mind_args=("--resume-window", "10")) as c:
        yield c


async def test_streamed_exec_through_a_reset_and_a_blackhole_loses_and_repeats_nothing(short: Cluster):
    cl = short
    fp = cl.start_proxy()
    got = bytearray()

    def take(ev) -> None:
        if isinstance(ev, StreamData) and ev.stream == "stdout":
            got.extend(ev.data)

    async with await cl.client(url=fp.url) as mc:
        handle = await mc.start("box", "exec", {"argv": ["sh", "-c", TICKER]})
        waiting = asyncio.ensure_future(handle.wait(take))
        await until(lambda: len(got) >= 20, 10, "output before the cut")
        fp.cut("rst")
        await asyncio.sleep(1)
        fp.blackhole()
        await asyncio.sleep(5)
        fp.resume()
        end: RunEnd = await asyncio.wait_for(waiting, 30)
    assert end.exit_code == 3
    assert hashlib.sha256(bytes(got)).hexdigest() == hashlib.sha256(EXPECTED).hexdigest() == end.stdout.sha256


async def test_stdin_through_sha256sum_with_a_cut_arrives_once(short: Cluster):
    cl = short
    fp = cl.start_proxy()
    data = bytes(range(256)) * 16384  # 4 MiB: several windows, so the cut falls mid-stream
    cut_done = asyncio.Event()

    async def feed():
        for i in range(0, len(data), 65536):
            if i == len(data) // 2:
                fp.cut("rst")
                cut_done.set()
            yield data[i : i + 65536]

    out = bytearray()
    async with await cl.client(url=fp.url) as mc:
        end = await asyncio.wait_for(
            mc.exec(
                "box",
                "exec",
                {"argv": ["sha256sum"]},
                stdin=feed(),
                on_event=lambda ev: out.extend(ev.data) if isinstance(ev, StreamData) else None,
            ),
            60,
        )
    assert cut_done.is_set() and end.exit_code == 0
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_task_wait_and_logs_follow_ride_out_a_mind_restart(cl: Cluster):
    lines = 30
    script = f"for i in $(seq 1 {lines}); do echo log $i; sleep 0.25; done; exit 5"
    r = cl.cli("task", "start", "--hand", "box", "--id", "t-restart", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    waiter = cl.cli_popen("task", "wait", "t-restart")
    follower = cl.cli_popen("task", "logs", "t-restart", "--follow")
    try:
        time.sleep(2)
        gen = cl.hand_info("box")["generation"]
        cl.mind.signal(signal.SIGTERM)
        wait_until(lambda: not cl.mind.alive(), 15, "the Mind to stop")
        time.sleep(1)  # the clients are cut off and knocking
        cl.start_mind(*WINDOW, port=cl.port)
        cl.wait_connected("box", min_gen=gen + 1, timeout=30)
        w_out, w_err = waiter.communicate(timeout=40)
        f_out, f_err = follower.communicate(timeout=40)
    finally:
        for p in (waiter, follower):
            if p.poll() is None:
                p.kill()
    assert waiter.returncode == 5, w_err  # the task's real end, by the exec table
    assert b"failed" in w_err
    assert follower.returncode == 5, f_err
    assert f_out == b"".join(b"log %d\n" % i for i in range(1, lines + 1))  # every byte, exactly once


def test_task_wait_gives_up_past_its_bound_with_a_clear_error(tmp_path):
    with running(tmp_path, mind_args=("--resume-window", "2")) as cl:
        r = cl.cli("task", "start", "--hand", "box", "--id", "t-gone", "--", "sleep", "30")
        assert r.returncode == 0, r.stderr
        waiter = cl.cli_popen("task", "wait", "t-gone")
        try:
            time.sleep(1)
            cl.mind.kill9()
            t0 = time.monotonic()
            out, err = waiter.communicate(timeout=20)
            gave_up = time.monotonic() - t0
        finally:
            if waiter.poll() is None:
                waiter.kill()
        assert waiter.returncode == 125
        assert b"could not reach the Mind again within 2 s" in err and b"Traceback" not in err
        assert gave_up < 5  # the bound, and a poll


async def test_a_client_without_a_window_fails_its_runs_at_a_cut_as_before(tmp_path):
    with running(tmp_path, mind_args=("--resume-window", "0")) as cl:
        fp = cl.start_proxy()
        async with await cl.client(url=fp.url) as mc:
            assert mc.resume_window == 0
            handle = await mc.start("box", "exec", {"argv": ["sleep", "30"]}, stream=False)
            await until(lambda: handle.run_id is not None, 10, "the run's id")
            fp.cut("rst")
            with pytest.raises(ClientError) as cut:
                await asyncio.wait_for(handle.wait(), 10)
            assert cut.value.code == "closed"


async def test_a_client_back_before_the_hand_after_a_restart_waits_for_it_and_gets_the_real_end(tmp_path):
    """The Mind restarts and the Hand cannot reach it for a while (its link refuses connections): the
    client comes back first, its re-attachment is answered `resume_pending`, it attaches again once
    the Hand presented the run, and the run ends with its real exit code and every byte. (It used to
    give up at the window's end, `resume_pending`: found through `mind mcp`, issue 26.)"""
    with running(tmp_path, "box", via_proxy=True, mind_args=WINDOW) as cl:
        assert cl.proxy is not None and cl.mind is not None
        async with await cl.client() as mc:
            handle = await mc.start("box", "exec", {"argv": ["sh", "-c", TICKER]})
            got = bytearray()

            async def read() -> RunEnd:
                async for ev in handle.events():
                    if isinstance(ev, StreamData):
                        got.extend(ev.data)
                    elif isinstance(ev, RunEnd):
                        return ev
                raise AssertionError("the events ended without the run's end")

            reading = asyncio.ensure_future(read())
            await until(lambda: len(got) >= 30, 10, "output before the restart")
            cl.proxy.refuse()
            cl.mind.signal(signal.SIGKILL)
            await asyncio.to_thread(cl.mind.p.wait, 20)
            await asyncio.to_thread(cl.start_mind, *WINDOW, port=cl.port)
            await asyncio.sleep(4)  # the client is back, the Hand is not: the run is not in this Mind yet
            assert not reading.done()
            cl.proxy.accept()
            end = await asyncio.wait_for(reading, 40)
    assert end.state is RunState.FAILED and end.exit_code == 3
    assert bytes(got) == EXPECTED


async def test_an_attach_closes_the_stdin_its_first_client_left_open_in_the_library_as_in_the_cli(cl: Cluster):
    """One run follower (mind/client/follow.py) for every client: a run whose first client left its
    stdin open (detached while still typing) is taken over by `mc.attach` and by `mind attach` alike,
    and both close that stdin (nobody there can feed it): `cat` sees its end and the run ends
    `succeeded`. The library's attach used to leave it open, the run waiting for input for ever."""
    forever = asyncio.Event()

    async def typing(line: bytes):
        yield line
        await forever.wait()  # the user stops typing but never ends the input

    async def left_open(mc, line: bytes) -> str:
        h = await mc.start("box", "exec", {"argv": ["cat"]}, stdin=typing(line))
        got = b""
        async for ev in h.events():
            got += ev.data if isinstance(ev, StreamData) else b""
            if got == line:
                break
        assert h.run_id is not None
        await h.detach()
        return h.run_id

    async with await cl.client() as mc:
        by_library = await left_open(mc, b"hello\n")
        end = await asyncio.wait_for((await mc.attach(by_library)).wait(), 20)
        assert end.state is RunState.SUCCEEDED and end.exit_code == 0 and end.stdout.data == b"hello\n"
        by_cli = await left_open(mc, b"again\n")
    r = await asyncio.to_thread(cl.cli, "attach", "--credential", str(cl.client_credential()), by_cli, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"", r.stdout  # its first client took "again\n" already: nothing twice
