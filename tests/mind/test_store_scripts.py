"""The stores' scripts, written once (`mind/store/scripts.py`): what makes one script serve both
engines (`run_now` over SQLite's port, which never waits; the port's transaction), and the fences
that keep them written once: no engine applies the snapshot rules itself, and no engine reaches
into another module's private names. The answers themselves are tests/mind/test_store_engines.py's,
against both engines."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from mind.core.snapshots import Snapshot
from mind.store.scripts import SnapshotRows, run_now
from mind.store.snapshots import SnapshotStore
from protocol.states import TaskState

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "mind" / "store"
D = "0" * 64


def snap(task_id: str) -> Snapshot:
    return Snapshot(
        task_id=task_id,
        hand="h",
        tool="exec",
        args_digest=D,
        binding_digest=D,
        state=TaskState.QUEUED,
        stale=False,
        created_at=1.0,
    )


def test_run_now_takes_a_script_that_never_waits_to_its_end_and_refuses_one_that_would() -> None:
    async def answers() -> int:
        return 7

    async def script() -> int:
        return await answers() + 1

    assert run_now(script()) == 8

    async def waits() -> None:
        await asyncio.sleep(0)  # a real suspension: no port of SQLite's may do this

    with pytest.raises(RuntimeError, match="must answer at once"):
        run_now(waits())


def test_a_sqlite_script_that_raises_in_its_transaction_writes_nothing(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "mind.db")
    try:

        async def half_done(rows: SnapshotRows) -> None:
            async with rows.transaction() as tx:
                await tx.put([snap("a")])
                raise ValueError("the rule refused")

        with pytest.raises(ValueError):
            store._run(half_done)
        assert store.get("a") is None  # rolled back, and the lock was released
        assert store.insert_new(snap("a")) is None and store.get("a") is not None
    finally:
        store.close()


def modules() -> dict[str, ast.Module]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text()) for p in sorted(STORE.rglob("*.py"))}


RULES_APPLIED = {"apply_report", "from_report", "within_quota", "mark_stale"}
"""The rules of `mind.core.snapshots` a read-modify-write applies between its reads and its writes."""


def test_only_the_scripts_apply_the_snapshot_rules() -> None:
    """An engine that applied a rule itself would be a second copy of a script. (The PostgreSQL
    engine's one-statement empty reconciliation asks `reconcile` of nothing, then defers to the
    script whenever there is anything to write.)"""
    for path, tree in modules().items():
        if path == "mind/store/scripts.py":
            continue
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "mind.core.snapshots":
                used |= {a.name for a in node.names} & RULES_APPLIED
            elif isinstance(node, ast.Attribute):
                used |= {node.attr} & RULES_APPLIED
        assert not used, f"{path} applies {sorted(used)} itself: write it once in mind/store/scripts.py"


def test_no_store_module_reaches_into_anothers_private_names() -> None:
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mind.store"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path} imports {private} from {node.module}"
