"""kill -9 of the Mind or the Hand at random points during a burst of task starts: SQLite is never
corrupted, an accepted task row is never lost, and no task is stored or executed twice."""

import asyncio
import os
import random
import sqlite3

import pytest

from mind.client.aio import ClientError, MindClient, load_credential
from mind.testing.cluster import running, wait_until

pytestmark = pytest.mark.slow  # a real Mind and Hand, killed with -9

BURST = 40


def integrity(db) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def task_ids(db, table) -> list[str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] for r in con.execute(f"SELECT task_id FROM {table}")]
    finally:
        con.close()


async def burst(cl, prefix: str, kill_after: int, victim: str) -> dict[str, str]:
    """Start BURST tasks at once; kill -9 `victim` after `kill_after` answers. Returns id -> outcome."""
    outcomes: dict[str, str] = {}
    killed = asyncio.Event()
    async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:

        async def one(i: int) -> None:
            tid = f"{prefix}{i:03}"
            try:
                res = await mc.task_start("box", "shell", {"command": f"echo x >> ran-{tid}"}, task_id=tid)
                outcomes[tid] = res.outcome
            except ClientError as exc:
                outcomes[tid] = f"error:{exc.code}"
            if len(outcomes) >= kill_after and not killed.is_set():
                killed.set()
                (cl.mind if victim == "mind" else cl.hands["box"]).kill9()

        await asyncio.gather(*(one(i) for i in range(BURST)))
    return outcomes


@pytest.mark.parametrize("victim", ["hand", "mind"])
async def test_kill_9_during_a_burst_of_task_starts(tmp_path, victim):
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    print(f"seed {seed}")
    with running(tmp_path) as cl:
        root, state = tmp_path / "root-box", tmp_path / "state-box"
        for rnd in range(3):
            kill_after = rng.randint(1, BURST - 1)
            gen = cl.hand_info("box")["generation"]
            outcomes = await burst(cl, f"r{rnd}-", kill_after, victim)
            if victim == "mind":
                cl.start_mind(port=cl.port)
            else:
                cl.start_hand("box")
            await asyncio.to_thread(cl.wait_connected, "box", gen + 1, 30)
            # the stores are intact
            assert integrity(state / "tasks.db") == "ok"
            assert integrity(cl.home / "mind.db") == "ok"
            rows = task_ids(state / "tasks.db", "tasks")
            assert len(rows) == len(set(rows))  # nothing stored twice
            accepted = {t for t, o in outcomes.items() if o in ("accepted", "duplicate")}
            assert accepted <= set(rows), f"seed {seed}: accepted but not stored: {accepted - set(rows)}"
            # after reconciliation the Mind holds every task the Hand has, and nothing ran twice
            await asyncio.to_thread(
                wait_until,
                lambda stored=set(rows): stored <= set(task_ids(cl.home / "mind.db", "task_snapshots")),
                30,
                "reconciliation to adopt every stored task",
            )
            for f in root.glob(f"ran-r{rnd}-*"):
                assert f.read_text() == "x\n", f"seed {seed}: {f.name} ran more than once"
            # a task that ran is a task the Hand stored
            ran = {f.name[len("ran-") :] for f in root.glob(f"ran-r{rnd}-*")}
            assert ran <= set(rows), f"seed {seed}: ran without a row: {ran - set(rows)}"
