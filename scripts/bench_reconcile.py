"""Reconciliation at scale (see scripts/bench-reconcile)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

from hand.taskstore import TaskRow, TaskStore, _COLUMNS, _FIELDS, _to_values  # noqa: E402
from mind.client import MindClient, load_credential  # noqa: E402
from protocol.states import TaskState  # noqa: E402
from support.cluster import Cluster, wait_until  # noqa: E402

DIGEST = "ab" * 32


def seed(state_dir: Path, n: int) -> None:
    store = TaskStore(state_dir)
    now = time.time()
    rows = [
        TaskRow(task_id=f"t{i:06}", tool="exec", args_digest=DIGEST, binding_digest=DIGEST,
                state=TaskState.SUCCEEDED, version=3, max_runtime_ms=60_000, created_at=now - 100 + i / n,
                started_at=now - 99, finished_at=now - 98, exit_code=0, log_bytes=10)
        for i in range(n)
    ]
    with store._lock:
        store._db.execute("BEGIN")
        store._db.executemany(
            f"INSERT INTO tasks ({_COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))})", [_to_values(r) for r in rows]
        )
        store._db.execute("COMMIT")
    store.close()


def reconcile_lines(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if '"reconcile_done"' in line:
            out.append(json.loads(line))
    return out


async def probe(url: str, cred_path: Path, stop: asyncio.Event, worst: list[float]) -> None:
    async with await MindClient.connect(url, load_credential(cred_path)) as mc:
        while not stop.is_set():
            t0 = time.perf_counter()
            await mc.hands()
            worst.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.005)


def measure(cl: Cluster, expect_lines: int, start_hand) -> tuple[dict, float]:
    worst: list[float] = []

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(probe(cl.url, cl.home / "admin.cred", stop, worst))
        await asyncio.sleep(0.2)
        start_hand()
        deadline = time.monotonic() + 120
        while len(reconcile_lines(cl.tmp / "mind.log")) < expect_lines:
            if time.monotonic() > deadline:
                raise SystemExit("reconciliation did not finish within 120 s")
            await asyncio.sleep(0.05)
        stop.set()
        await task

    asyncio.run(go())
    return reconcile_lines(cl.tmp / "mind.log")[expect_lines - 1], max(worst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=10_000, help="retained tasks on the Hand")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cl = Cluster(Path(tmp))
        try:
            cl.start_mind()
            cl.add_hand("bench")
            seed(Path(tmp) / "state-bench", args.n)
            first, lag1 = measure(cl, 1, lambda: cl.start_hand("bench"))
            cl.hands["bench"].stop()
            second, lag2 = measure(cl, 2, lambda: cl.start_hand("bench"))
        finally:
            cl.stop_all()
    print(f"{'pass':<34} {'tasks':>7} {'adopted':>8} {'unchanged':>9} {'duration ms':>12} {'worst client RTT ms':>20}")
    for label, line, lag in (("first (Mind knows none: adopt)", first, lag1), ("again (all known: unchanged)", second, lag2)):
        print(f"{label:<34} {line['hand_tasks']:>7} {line['adopted']:>8} {line['unchanged']:>9} {line['duration_ms']:>12} {lag:>20.1f}")


if __name__ == "__main__":
    main()
