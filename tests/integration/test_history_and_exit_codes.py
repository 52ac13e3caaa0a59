"""What a user sees of the Mind's history and of commands that cannot start, with real processes.

- The Mind keeps run metadata, not payloads: after hundreds of 4 MiB `read_file` runs, `mind runs`
  answers at once with every run (it used to hang: the Mind refused to send a 9-100 MB `run_list`),
  `mind run get` says the value was not retained, and the Mind has not grown by the values.
- Every list is paged: the client follows the Mind's cursors and gets everything it asked for.
- A program that does not exist exits 127, one that is not executable 126, with the OS's message,
  as in a shell and over ssh; background tasks record the same codes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from mind.client.aio import MindClient, load_credential
from mind.errors import ClientError
from mind.store.credentials import Store
from mind.testing.cluster import Cluster, running, wait_until
from protocol import limits
from protocol.messages import ListRuns, RunList
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind and Hand, and the `mind` CLI

READS = 300


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def read_many(cl: Cluster, n: int) -> list[str]:
    async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:

        async def worker(k: int) -> list[str]:
            ids = []
            for _ in range(k):
                end = await mc.exec("box", "read_file", {"path": "big.bin", "limit": limits.READ_FILE_MAX})
                assert end.state is RunState.SUCCEEDED and len(end.value["data"]) == limits.READ_FILE_MAX
                ids.append(end.run_id)
            return ids

        return sum(await asyncio.gather(*(worker(n // 4) for _ in range(4))), [])


async def raw_pages(cl: Cluster, limit: int) -> list[list[str]]:
    """The Mind's pages as they come, following `next_after` by hand (a cursor it did not make is refused)."""
    async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:
        with pytest.raises(ClientError) as refused:
            await mc._ask(ListRuns(after="not-a-cursor"), RunList)
        assert refused.value.code == "invalid_payload"
        pages, after = [], None
        while True:
            reply = await mc._ask(ListRuns(limit=limit, after=after), RunList)
            pages.append([r.run_id for r in reply.runs])
            if reply.next_after is None:
                return pages
            after = reply.next_after


def test_a_history_of_large_reads_lists_promptly_completely_and_without_the_values(tmp_path):
    with running(tmp_path) as cl:
        (cl.tmp / "root-box" / "big.bin").write_bytes(os.urandom(limits.READ_FILE_MAX))
        assert cl.mind is not None
        idle = rss_mib(cl.mind.pid)
        ids = asyncio.run(asyncio.wait_for(read_many(cl, READS), 300))
        assert cl.cli("exec", "--hand", "box", "--", "true").returncode == 0
        t0 = time.monotonic()
        r = cl.cli("runs", "--json", "--limit", "1000", timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        runs = json.loads(r.stdout)
        assert len(runs) == READS + 1 and runs[0]["tool"] == "exec" and took < 20
        reads = [x for x in runs if x["tool"] == "read_file"]
        assert {x["run_id"] for x in reads} == set(ids)
        assert all(x["value_not_retained"] and x["end"]["value"] is None for x in reads)
        assert all(x["end"]["state"] == "succeeded" and x["end"]["duration_ms"] >= 0 for x in reads)
        # ~1.2 GiB of values went through; the Mind holds their metadata only (it grew by 420 MiB per 100)
        assert rss_mib(cl.mind.pid) < idle + 100

        got = cl.cli("run", "get", ids[0])
        assert got.returncode == 0 and b"value    not retained" in got.stdout, got.stdout
        # past the wire's largest page (10,000) too: the client asks page by page
        r = cl.cli("runs", "--json", "--limit", "20000", timeout=60)
        assert r.returncode == 0 and len(json.loads(r.stdout)) == READS + 1, r.stderr

        pages = asyncio.run(asyncio.wait_for(raw_pages(cl, 64), 60))
        listed = sum(pages, [])
        assert [len(p) for p in pages] == [64] * 4 + [45]
        assert listed == [x["run_id"] for x in runs]  # newest first, nothing twice, nothing skipped


def test_hands_are_listed_in_pages_and_status_stays_one_screen(tmp_path):
    cl = Cluster(tmp_path)
    cl.home.mkdir(parents=True, mode=0o700)
    store = Store(cl.home / "mind.db")
    names = [f"h{i:04d}" for i in range(1500)]
    for name in names:
        store.add("hand", name)
    store.close()
    try:
        cl.start_mind()
        cl.start_hand("box")
        cl.wait_connected("box")
        listed = [h["name"] for h in cl.hands_json()]
        assert listed == sorted([*names, "box"])  # more than one page of 1000, in name order, once each
        st = cl.cli("status", "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        assert status["hands_total"] == 1501 and len(status["hands"]) == 50
        text = cl.cli("status").stdout
        assert b"HANDS (1 of 1501 connected)" in text and b"... and 1451 more: `mind hands` lists them all" in text
    finally:
        cl.stop_all()


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("exits")) as cl:
        yield cl


def test_a_program_that_does_not_exist_exits_127_with_the_os_message(c):
    r = c.cli("exec", "--hand", "box", "--", "no-such-program-xyz", "arg")
    assert r.returncode == 127 and r.stdout == b""
    assert b"cannot start no-such-program-xyz: No such file or directory" in r.stderr, r.stderr
    r = c.cli("exec", "--hand", "box", "--json", "--", "no-such-program-xyz")
    end = json.loads(r.stdout)
    assert r.returncode == 127 and end["state"] == "failed" and end["exit_code"] == 127
    assert end["error"] == "cannot start no-such-program-xyz: No such file or directory"
    r = c.cli("call", "--hand", "box", "exec", 'argv=["no-such-program-xyz"]')
    assert r.returncode == 127 and b"No such file or directory" in r.stderr


def test_a_program_that_is_not_executable_exits_126_with_the_os_message(c):
    (c.tmp / "root-box" / "plain.sh").write_text("#!/bin/sh\necho never\n")
    r = c.cli("exec", "--hand", "box", "--", "./plain.sh")
    assert r.returncode == 126 and r.stdout == b""
    assert b"cannot start ./plain.sh: Permission denied" in r.stderr, r.stderr
    # the program's own 127 is still its own, with nothing added
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", "exit 127")
    assert r.returncode == 127 and r.stderr == b""


def test_a_background_task_that_cannot_start_records_127_and_126(c):
    (c.tmp / "root-box" / "plain2.sh").write_text("#!/bin/sh\necho never\n")
    for task_id, argv, code, message in [
        ("nf", "no-such-program-xyz", 127, "No such file or directory"),
        ("nx", "./plain2.sh", 126, "Permission denied"),
    ]:
        r = c.cli("task", "start", "--hand", "box", "--id", task_id, "--", argv)
        assert r.returncode == 0, r.stderr
        t = wait_until(lambda tid=task_id: (v := c.task(tid))["state"] == "failed" and v, 30, f"task {task_id} failed")
        assert t["exit_code"] == code and t["error"] == f"cannot start {argv}: {message}", t
