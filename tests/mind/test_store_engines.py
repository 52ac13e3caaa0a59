"""One store interface, two engines (DESIGN §16): every test here runs against the SQLite engine
(the home's files, the embedded default) and the PostgreSQL engine (a database of the suite's own
server, tests/support/postgres.py), and both must give the same answers. The PostgreSQL cases
start a server, so they are `slow`; the SQLite ones stay in the fast loop."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from mind.core.snapshots import Snapshot
from mind.store.api import SchemaTooNew, Stores, StoreUnavailable
from mind.store.credentials import StoreError
from mind.store.endings import TAIL_KEPT, Ending
from mind.store.engines import open_stores
from protocol.messages import OutputTail, RunEnd, TaskInfo
from protocol.states import RunState, TaskState

D = "0" * 64


def info(task_id: str, state: TaskState = TaskState.RUNNING, version: int = 2) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tool="exec",
        state=state,
        version=version,
        args_digest=D,
        binding_digest=D,
        max_runtime_ms=1000,
        created_at=1.0,
    )


def snap(task_id: str, state: TaskState = TaskState.QUEUED, created_at: float = 1.0, **kw) -> Snapshot:
    return Snapshot(
        task_id=task_id,
        hand=kw.pop("hand", "h"),
        tool="exec",
        args_digest=D,
        binding_digest=D,
        state=state,
        stale=kw.pop("stale", False),
        created_at=created_at,
        version=kw.pop("version", 0),
        **kw,
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
async def stores(request, tmp_path):
    database = request.getfixturevalue("pg_database") if request.param == "postgresql" else None
    s = await open_stores(tmp_path / "home", database)
    assert s.engine == request.param
    try:
        yield s
    finally:
        await s.close()


# --- credentials ---


async def test_credentials_add_check_rotate_revoke_and_the_epoch(stores: Stores):
    c = stores.credentials
    e0 = await c.epoch()
    cred = await c.add("hand", "box1", None, {"role": "web"})
    assert await c.secret("hand", "box1") == cred.secret
    assert await c.epoch() > e0
    with pytest.raises(StoreError, match="already exists"):
        await c.add("hand", "box1")
    with pytest.raises(StoreError, match="invalid name"):
        await c.add("hand", "-bad name")
    rotated = await c.rotate("hand", "box1")
    assert rotated is not None and rotated.secret != cred.secret
    assert await c.secret("hand", "box1") == rotated.secret
    assert await c.rotate("hand", "nobody") is None
    e1 = await c.epoch()
    assert await c.revoke("hand", "box1") is True
    assert await c.revoke("hand", "box1") is False
    assert await c.secret("hand", "box1") is None
    assert await c.epoch() > e1
    (row,) = await c.list("hand")
    assert row.label == "box1" and row.revoked_at is not None and row.label_map() == {"role": "web"}


async def test_generations_are_monotonic_and_survive_a_re_add(stores: Stores):
    c = stores.credentials
    await c.add("hand", "box1")
    assert [await c.next_generation("hand", "box1") for _ in range(3)] == [1, 2, 3]
    await c.revoke("hand", "box1")
    await c.add("hand", "box1")
    assert await c.next_generation("hand", "box1") == 4
    with pytest.raises(StoreError, match="vanished"):
        await c.next_generation("hand", "ghost")


async def test_concurrent_generations_never_repeat(stores: Stores):
    c = stores.credentials
    await c.add("hand", "box1")
    gens = await asyncio.gather(*(c.next_generation("hand", "box1") for _ in range(20)))
    assert sorted(gens) == list(range(1, 21))


async def test_scopes_labels_and_listing_order(stores: Stores):
    c = stores.credentials
    await c.add("client", "ci", '{"hands":["web-*"]}')
    await c.add("client", "Zed")
    await c.add("client", "alpha")
    assert await c.scope("client", "ci") == '{"hands":["web-*"]}'
    assert await c.scope("client", "alpha") is None
    assert [r.label for r in await c.list("client")] == ["Zed", "alpha", "ci"]  # bytewise, as SQLite
    await c.add("hand", "box1", None, {"a": "1", "b": "2"})
    assert await c.set_labels("hand", "box1", {"c": "3"}, ["a"]) == {"b": "2", "c": "3"}
    assert await c.set_labels("hand", "ghost", {"c": "3"}, []) is None
    with pytest.raises(StoreError, match="at most"):
        await c.set_labels("hand", "box1", {f"k{i}": "v" for i in range(100)}, [])
    assert (await c.list("hand"))[0].label_map() == {"b": "2", "c": "3"}


async def test_one_mind_id(stores: Stores):
    a = await stores.credentials.mind_id()
    assert a.startswith("mind-") and await stores.credentials.mind_id() == a


async def test_one_seal_key_for_every_life(stores: Stores, request, tmp_path):
    """The key runs are sealed with outlives the process (a Mind that restarted verifies what its
    last life sent) and, on a shared database, is every node's."""
    key = await stores.credentials.seal_key()
    assert len(key) == 32 and await stores.credentials.seal_key() == key
    database = request.getfixturevalue("pg_database") if stores.engine == "postgresql" else None
    again = await open_stores(tmp_path / ("home" if database is None else "other-node"), database)
    try:
        assert await again.credentials.seal_key() == key
    finally:
        await again.close()


# --- snapshots ---


async def test_snapshot_round_trip_reports_and_staleness(stores: Stores):
    s = stores.snapshots
    assert await s.insert_new(snap("a", stale=True, start_pending=True, owner="ci")) is None
    existing = await s.insert_new(snap("a"))
    assert existing is not None and existing.owner == "ci" and existing.start_pending
    got, what = await s.report("h", info("a", version=2), 3.0)
    assert what == "updated" and got is not None and got.state is TaskState.RUNNING and not got.stale
    assert not got.start_pending and got.info == info("a", version=2)
    assert await s.mark_hand_stale("h") == 1 and (await s.get("a")).stale  # type: ignore[union-attr]
    got, what = await s.report("other", info("a", version=3), 4.0)
    assert what == "foreign" and (await s.get("a")).version == 2  # type: ignore[union-attr]
    assert (await s.report("h", info("a", version=2), 4.5))[1] == "updated"  # the same row freshens a stale one
    assert (await s.report("h", info("a", version=2), 4.6))[1] == "unchanged"
    assert (await s.report("h", info("new", version=1), 5.0, False)) == (None, "unknown")
    assert (await s.report("h", info("new", version=1), 5.0))[1] == "adopted"
    await s.report("h", info("a", TaskState.SUCCEEDED, 5), 5.0)
    assert await s.mark_all_stale() == 1  # "new" only: terminal snapshots never go stale
    assert await s.count_stale() == 1
    assert await s.counts_by_state() == {"succeeded": 1, "running": 1}
    counts, stale = await s.counts_visible(lambda hand, owner: owner == "ci")
    assert counts == {"succeeded": 1} and stale == 0
    await s.delete("new")
    assert await s.get("new") is None


async def test_cancel_pending_and_start_retries(stores: Stores):
    s = stores.snapshots
    await s.insert_new(snap("a", start_pending=True))
    assert await s.retry_start(snap("a")) is None  # a start in flight: not asked again
    done = await s.finish_start("a")
    assert done is not None and not done.start_pending
    assert await s.retry_start(snap("a", start_pending=True)) is not None
    assert await s.finish_start("ghost") is None
    marked = await s.set_cancel_pending("a", "user_requested")
    assert marked is not None and marked.cancel_pending == "user_requested"
    await s.clear_cancel_pending("a")
    assert (await s.get("a")).cancel_pending is None  # type: ignore[union-attr]


async def test_a_removed_tasks_snapshot_goes_only_if_still_its_hands_and_settled(stores: Stores):
    """`mind task rm`: after the Hand removed the task, its snapshot is deleted and returned, once;
    not when it names another Hand, nor while a start of its id is in flight (that start owns the
    id now), nor an id the Mind does not hold."""
    s = stores.snapshots
    await s.insert_new(snap("done", hand="h", owner="ci"))
    await s.report("h", info("done", TaskState.SUCCEEDED, 3), 2.0)
    await s.insert_new(snap("elsewhere", hand="g"))
    await s.insert_new(snap("starting", hand="h", start_pending=True))
    assert await s.remove("done", "g") is None and await s.get("done") is not None  # not g's
    gone = await s.remove("done", "h")
    assert gone is not None and gone.task_id == "done" and gone.state is TaskState.SUCCEEDED and gone.owner == "ci"
    assert await s.get("done") is None and await s.remove("done", "h") is None
    assert await s.remove("elsewhere", "h") is None and await s.get("elsewhere") is not None
    assert await s.remove("starting", "h") is None and await s.get("starting") is not None
    assert await s.remove("ghost", "h") is None
    assert [x.task_id for x in await s.list()] == ["elsewhere", "starting"]


async def test_listing_is_newest_first_in_pages(stores: Stores):
    s = stores.snapshots
    for i in range(7):
        await s.insert_new(snap(f"t{i}", created_at=float(i // 2), hand="h" if i % 2 else "g"))
    first = await s.list(limit=3)
    assert [x.task_id for x in first] == ["t6", "t4", "t5"]
    rest = await s.list(limit=10, after=(first[-1].created_at, first[-1].task_id))
    assert [x.task_id for x in rest] == ["t2", "t3", "t0", "t1"]
    assert [x.task_id for x in await s.list(hand="h")] == ["t5", "t3", "t1"]
    await s.report("g", info("t0", TaskState.SUCCEEDED, 2), 1.0)
    assert [x.task_id for x in await s.list(state=TaskState.SUCCEEDED)] == ["t0"]


async def test_reconcile_in_one_transaction_with_a_quota(stores: Stores):
    s = stores.snapshots
    for i in range(10):
        await s.insert_new(snap(f"t{i:03}", state=TaskState.RUNNING, stale=True, version=1))
    rows = {f"t{i:03}": info(f"t{i:03}", TaskState.SUCCEEDED, 3) for i in range(0, 10, 2)}
    rows |= {f"x{i}": info(f"x{i}", TaskState.RUNNING, 1) for i in range(5)}  # unknown to the Mind
    plan = await s.reconcile("h", rows, 7.0, None, 12)
    assert len(plan.updated) == 5 and len(plan.lost) == 5 and plan.over_quota == 3
    states = {x.task_id: x.state for x in await s.list(limit=100)}
    assert states["t000"] is TaskState.SUCCEEDED and states["t001"] is TaskState.LOST
    assert sorted(t for t in states if t.startswith("x")) == ["x0", "x1"]
    again = await s.reconcile("h", rows, 8.0, None, 12)
    assert again.writes == [] and again.over_quota == 3


async def test_reconcile_of_a_hand_that_reports_no_tasks(stores: Stores):
    """The common welcome (a Hand with no tasks; one statement on PostgreSQL): nothing for a Hand
    the Mind holds nothing for; the same empty inventory from a Hand the Mind holds a running
    task for declares it lost, and an unreported start is forgotten, as a full reconcile does."""
    s = stores.snapshots
    await s.insert_new(snap("other", hand="g", state=TaskState.RUNNING, version=1))
    empty = await s.reconcile("h", {}, 5.0)
    assert (empty.writes, empty.lost, empty.never_stored, empty.unchanged) == ([], [], [], 0)
    await s.insert_new(snap("t1", state=TaskState.RUNNING, version=1))
    await s.insert_new(snap("t2"))  # a start never reported
    plan = await s.reconcile("h", {}, 6.0)
    assert [x.task_id for x in plan.lost] == ["t1"] and plan.never_stored == ["t2"]
    assert {x.task_id: x.state for x in await s.list(limit=10)} == {"t1": TaskState.LOST, "other": TaskState.RUNNING}


async def test_a_batch_runs_in_order_and_marks_an_offline_hand_stale(stores: Stores):
    s = stores.snapshots
    results = await s.batch(
        [
            ("insert_new", (snap("a"),), None),
            ("report", ("h", info("a", version=2), 2.0), "h"),
            ("report", ("h", info("zz", version=2), 2.0, False), None),
            ("no_such_method", (), None),
        ]
    )
    assert [ok for ok, _ in results] == [True, True, True, False]
    assert results[1][1][1] == "updated" and results[2][1] == (None, "unknown")
    assert (await s.get("a")).stale  # type: ignore[union-attr]  # its Hand was offline: stale after


# --- endings ---


def ending(run_id: str, ended_at: float, out: bytes = b"") -> Ending:
    end = RunEnd(
        run_id=run_id, state=RunState.LOST, hand="box1", tool="exec", stdout=OutputTail(data=out, total=len(out))
    )
    return Ending(end, "ci", ended_at, "hand_gone", "d" * 64)


async def test_endings_are_kept_shortened_and_pruned(stores: Stores):
    e = stores.endings
    now = time.time()
    await e.put(ending("r-old", now - 10 * 24 * 3600))
    await e.put(ending("r-new", now, b"x" * (TAIL_KEPT * 3)))
    await e.put(ending("r-new", now + 1))  # the same run again: one row
    loaded = await e.load(60.0, now + 2)
    assert [x.end.run_id for x in loaded] == ["r-new"]
    assert loaded[0].owner == "ci" and loaded[0].cancel_reason == "hand_gone" and loaded[0].end.state is RunState.LOST
    await e.put(ending("r-tail", now + 3, b"y" * (TAIL_KEPT * 3)))
    (tail,) = [x for x in await e.load(60.0, now + 4) if x.end.run_id == "r-tail"]
    assert tail.end.stdout.data == b"y" * TAIL_KEPT


async def test_a_life_that_ended_cleanly_is_told_apart_from_a_crash(stores: Stores):
    e = stores.endings
    assert await e.begin_life() is False  # the first life: nothing left behind
    assert await e.begin_life() is True  # the one before never said it stopped: a crash
    await e.end_life(0)
    assert await e.begin_life() is False
    await e.end_life(3)
    assert await e.begin_life() is True  # stopped with runs resumable on Hands


# --- PostgreSQL only: run history, migrations and a database that is not there ---


@pytest.mark.slow
async def test_run_history_is_shared_metadata(pg_database, tmp_path):
    from protocol.messages import RunInfo

    a, b = await open_stores(tmp_path / "a", pg_database), await open_stores(tmp_path / "b", pg_database)
    try:
        assert a.history is not None and b.history is not None
        end = RunEnd(run_id="r1", state=RunState.SUCCEEDED, hand="box1", tool="exec", exit_code=0)
        info = RunInfo(
            run_id="r1", hand="box1", tool="exec", state=RunState.SUCCEEDED, created_at=1.0, ended_at=2.0,
            args_digest="d" * 64, end=end, value_not_retained=True,
        )  # fmt: skip
        await a.history.put_many([("ci", info)])
        assert await b.history.get("r1") == ("ci", info)
        assert await b.history.get("r2") is None
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_two_nodes_migrate_one_database_once(pg_database, tmp_path):
    import asyncpg

    from mind.store.postgres import SCHEMA_VERSION

    a, b = await asyncio.gather(open_stores(tmp_path / "a", pg_database), open_stores(tmp_path / "b", pg_database))
    try:
        await a.credentials.add("client", "x")
        assert await b.credentials.secret("client", "x") is not None
    finally:
        await a.close()
        await b.close()
    con = await asyncpg.connect(pg_database)
    try:
        assert await con.fetchval("SELECT array_agg(version ORDER BY version) FROM schema_version") == list(
            range(1, SCHEMA_VERSION + 1)
        )
    finally:
        await con.close()


@pytest.mark.slow
async def test_a_schema_newer_than_the_binary_is_refused(pg_database, tmp_path):
    import asyncpg

    from mind.store.postgres import SCHEMA_VERSION

    s = await open_stores(tmp_path / "a", pg_database)
    await s.close()
    con = await asyncpg.connect(pg_database)
    try:
        await con.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION + 1)
    finally:
        await con.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}, newer than this Mind's"):
        await open_stores(tmp_path / "a", pg_database)


async def test_an_unreachable_database_is_a_clear_error_with_no_password(tmp_path):
    from support.postgres import free_port

    dsn = f"postgresql://someone:hunter2@127.0.0.1:{free_port()}/nothing"
    with pytest.raises(StoreUnavailable, match="cannot reach the database") as err:
        await open_stores(tmp_path / "a", dsn)
    assert "hunter2" not in str(err.value) and "someone:***@127.0.0.1" in str(err.value)


@pytest.mark.slow
async def test_a_statement_that_hangs_is_cut_at_its_timeout_and_the_store_goes_on(pg_database, tmp_path):
    s = await open_stores(tmp_path / "a", pg_database)
    try:
        db = s._db  # type: ignore[attr-defined]  # the one bounded way every call of the engine takes
        with pytest.raises(StoreUnavailable, match="is unavailable"):
            await db.run(lambda con: con.execute("SELECT pg_sleep(30)"), timeout=0.5)
        await s.credentials.add("hand", "box1")  # the pool gave the cut connection back clean
        assert await s.credentials.secret("hand", "box1") is not None
    finally:
        await s.close()


@pytest.mark.slow
async def test_claims_fence_every_write_about_a_hand(pg_database, tmp_path):
    """Two nodes on one database (DESIGN §16): a Hand's claim is one statement refused without a
    live lease; after node B claims the Hand, node A's writes about it (a snapshot report, a
    reconciliation, a run's ending, its history) land nowhere and say so; B's land; `endings_of`
    gives B what A ended before B's claim; a released Hand is held by no node."""
    from mind.store.api import Fenced, NotLive
    from protocol.messages import RunInfo

    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    b = await open_stores(tmp_path / "b", pg_database, "node-b")
    try:
        na, nb = a.nodes, b.nodes
        assert na is not None and nb is not None
        fenced: list[tuple[str, int]] = []
        na.fence.active = nb.fence.active = True
        na.fence.on_fenced = lambda hand, claim: fenced.append((hand, claim))
        await a.credentials.add("hand", "box")
        with pytest.raises(NotLive):  # no heartbeat yet: no claim
            await na.claim("box", 10.0)
        await na.heartbeat()
        await nb.heartbeat()
        ca = await na.claim("box", 10.0)
        await a.snapshots.insert_new(snap("t1", hand="box"))
        assert (await a.snapshots.report("box", info("t1"), 2.0))[1] == "updated"
        early = RunEnd(run_id="r0", state=RunState.LOST, hand="box", tool="exec")
        await a.endings.put(Ending(early, "ci", time.time()))

        cb = await nb.claim("box", 10.0)
        assert cb > ca
        assert (await na.holders())["box"][:2] == ("node-b", cb)
        with pytest.raises(Fenced):
            await a.snapshots.report("box", info("t1", version=3), 3.0)
        with pytest.raises(Fenced):
            await a.snapshots.reconcile("box", {}, 3.0)
        with pytest.raises(Fenced):  # `mind task rm` through a node that no longer holds the Hand
            await a.snapshots.remove("t1", "box")
        assert await b.snapshots.get("t1") is not None
        late = RunEnd(run_id="r1", state=RunState.LOST, hand="box", tool="exec")
        with pytest.raises(Fenced):
            await a.endings.put(Ending(late, "ci", time.time()))
        assert fenced == [("box", ca)] * 4
        run = RunInfo(
            run_id="r1", hand="box", tool="exec", state=RunState.LOST, created_at=1.0, ended_at=2.0, args_digest=D,
        )  # fmt: skip
        assert a.history is not None and b.history is not None
        await a.history.put_many([("ci", run)])
        assert await b.history.get("r1") is None  # A's history of B's Hand: skipped
        assert (await b.snapshots.report("box", info("t1", version=3), 3.0))[1] == "updated"
        await b.endings.put(Ending(late.model_copy(update={"state": RunState.SUCCEEDED}), "ci", time.time()))
        await b.history.put_many([("ci", run)])
        assert await a.history.get("r1") is not None
        assert {e.end.run_id: e.end.state for e in await nb.endings_of("box", 0.0)} == {
            "r0": RunState.LOST,
            "r1": RunState.SUCCEEDED,
        }
        await na.release("box", ca)  # A's late release of its old claim changes nothing
        assert "box" in await nb.holders()
        await nb.release("box", cb)
        assert "box" not in await nb.holders()
        assert {n[0] for n in await na.nodes()} == {"node-a", "node-b"}
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_a_welcome_claims_checks_the_secret_and_reads_endings_in_one_statement(pg_database, tmp_path):
    """`PgNodes.welcome` (DESIGN §16): one statement claims the Hand only while its secret is the
    one the proof was checked against (rotated or revoked since the hello: None, no claim), only
    on a live lease (`NotLive`), and gives the endings of its runs; an ending the old holder is
    committing while the welcome waits on the Hand's row is among them (first terminal wins)."""
    import asyncpg

    from mind.store.api import NotLive
    from mind.store.rows import ending_blob

    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    b = await open_stores(tmp_path / "b", pg_database, "node-b")
    con = await asyncpg.connect(pg_database)
    try:
        na, nb = a.nodes, b.nodes
        assert na is not None and nb is not None
        cred = await a.credentials.add("hand", "box")
        with pytest.raises(NotLive):  # no heartbeat yet: no claim
            await na.welcome("box", 10.0, cred.secret, 0.0)
        await na.heartbeat()
        await nb.heartbeat()
        assert await na.welcome("box", 10.0, b"x" * len(cred.secret), 0.0) is None
        assert "box" not in await na.holders()
        got = await na.welcome("box", 10.0, cred.secret, 0.0)
        assert got is not None
        ca, endings = got
        assert endings == [] and (await na.holders())["box"][:2] == ("node-a", ca)
        first = Ending(RunEnd(run_id="r0", state=RunState.LOST, hand="box", tool="exec"), "ci", time.time())
        await a.endings.put(first)

        # node A's last ending, mid-commit: its transaction holds the claim's row as A's writes do
        late = Ending(RunEnd(run_id="r1", state=RunState.SUCCEEDED, hand="box", tool="exec"), "ci", time.time())
        tx = con.transaction()
        await tx.start()
        assert await con.fetchval("SELECT 1 FROM hands WHERE label = 'box' AND claim = $1 FOR SHARE", ca) == 1
        await con.execute(
            "INSERT INTO run_endings (run_id, owner, ended_at, cancel_reason, args_digest, run_end, hand) "
            "VALUES ('r1', 'ci', $1, NULL, '', $2, 'box')",
            late.ended_at,
            ending_blob(late),
        )
        welcome = asyncio.create_task(nb.welcome("box", 10.0, cred.secret, 0.0))
        for _ in range(500):  # B's claim waits on the row (a lock wait, seen by the server), 10 s at most
            if await con.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the welcome never waited on the Hand's row")
        assert not welcome.done()
        await tx.commit()
        got = await asyncio.wait_for(welcome, 10)
        assert got is not None
        cb, endings = got
        assert cb > ca
        assert {e.end.run_id: e.end.state for e in endings} == {"r0": RunState.LOST, "r1": RunState.SUCCEEDED}
        assert (await nb.holders())["box"][:2] == ("node-b", cb)

        await b.credentials.revoke("hand", "box")
        assert await nb.welcome("box", 10.0, cred.secret, 0.0) is None  # revoked between hello and proof
        assert (await nb.holders())["box"][:2] == ("node-b", cb)  # no new claim
    finally:
        await con.close()
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_concurrent_welcomes_share_statements_and_each_gets_its_own_answer(pg_database, tmp_path):
    """A connect storm (DESIGN §16): the lookups, claims and empty reconciliations of concurrent
    welcomes go as batches (`Coalescer`), and each Hand still gets exactly its own answer: its
    secret (None when revoked, unknown or of another role), its claim (None for a wrong or revoked
    secret, a newer claim for each of two welcomes of one Hand), its own endings; a batch on a node
    without a live lease is refused for every caller."""
    from mind.store.api import NotLive

    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    c = await open_stores(tmp_path / "c", pg_database, "node-c")
    try:
        na, nc = a.nodes, c.nodes
        assert na is not None and nc is not None
        creds = {f"h{i:02d}": await a.credentials.add("hand", f"h{i:02d}") for i in range(40)}
        await a.credentials.add("client", "h01")  # same label, other role: never mixed up
        await a.credentials.revoke("hand", "h05")
        ended = Ending(RunEnd(run_id="r2", state=RunState.SUCCEEDED, hand="h02", tool="exec"), "ci", time.time())
        await a.endings.put(ended)  # written unfenced, as the admin commands do
        na.fence.active = True

        batches: list[int] = []
        real = a.credentials._secrets._run

        async def counted(keys):
            batches.append(len(keys))
            return await real(keys)

        a.credentials._secrets._run = counted
        labels = [*creds, "nobody"]
        secrets = await asyncio.gather(*(a.credentials.secret("hand", x) for x in labels))
        want = [None if x in ("h05", "nobody") else creds[x].secret for x in labels]
        assert secrets == want
        assert len(batches) < len(labels) and sum(batches) == len(labels)

        await na.heartbeat()
        wrong = b"x" * len(creds["h07"].secret)
        calls = [(x, wrong if x == "h07" else creds[x].secret) for x in creds] + [("h03", creds["h03"].secret)]
        got = await asyncio.gather(*(na.welcome(x, 10.0, s, 0.0) for x, s in calls))
        answers = dict(zip([f"{x}#{k}" for k, (x, _) in enumerate(calls)], got, strict=True))
        assert answers.pop("h05#5") is None and answers.pop("h07#7") is None
        second = answers.pop("h03#40")
        first = answers["h03#3"]
        assert first is not None and second is not None and first[0] != second[0]
        holders = await na.holders()
        assert holders["h03"][:2] == ("node-a", max(first[0], second[0]))
        for key, answer in answers.items():
            hand = key.split("#")[0]
            assert answer is not None, hand
            claim, endings = answer
            assert [e.end.run_id for e in endings] == (["r2"] if hand == "h02" else [])
            if hand != "h03":
                assert holders[hand][:2] == ("node-a", claim)
        assert "h05" not in holders and "h07" not in holders

        # the empty reconciliations of every Hand claimed, at once: each still held, nothing to write
        plans = await asyncio.gather(
            *(a.snapshots.reconcile(x, {}, time.time()) for x in creds if x not in ("h05", "h07"))
        )
        assert all(p.writes == [] for p in plans)

        with pytest.raises(NotLive):  # node C never heartbeat: every caller of its batch is refused
            await asyncio.gather(*(nc.welcome(x, 10.0, creds[x].secret, 0.0) for x in ("h10", "h11", "h12")))
        assert (await na.holders())["h10"][0] == "node-a"
    finally:
        await a.close()
        await c.close()


@pytest.mark.slow
async def test_claims_and_credential_changes_are_heard_by_the_other_nodes(pg_database, tmp_path):
    """LISTEN/NOTIFY (DESIGN §16): node A hears node B's claim of a Hand (its name and claim) and a
    credential change made through B, at once, with no poll; `listening` says the channel is up."""
    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    b = await open_stores(tmp_path / "b", pg_database, "node-b")
    heard: asyncio.Queue[tuple[str, ...]] = asyncio.Queue()
    try:
        na, nb = a.nodes, b.nodes
        assert na is not None and nb is not None
        await b.credentials.add("hand", "box")
        await nb.heartbeat()
        listener = asyncio.create_task(
            na.listen(lambda h, c, n: heard.put_nowait(("claim", h, str(c), n)), lambda: heard.put_nowait(("creds",)))
        )
        try:
            async with asyncio.timeout(10):
                assert await heard.get() == ("creds",)  # said once at the start: a change while it was down
                assert na.listening
                claim = await nb.claim("box", 10.0)
                assert await heard.get() == ("claim", "box", str(claim), "node-b")
                await b.credentials.revoke("hand", "box")
                assert await heard.get() == ("creds",)
        finally:
            listener.cancel()
            with pytest.raises(asyncio.CancelledError):
                await listener
        assert not na.listening
    finally:
        await a.close()
        await b.close()


@pytest.mark.slow
async def test_a_dropped_listener_is_noticed_and_opened_again(pg_database, tmp_path):
    """The LISTEN connection killed by the server (an administrator, a restart): it is opened
    again (`listening` is False in between: the shell polls), and its opening says "look now", so
    a change made while it was down is not missed."""
    import asyncpg

    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    heard: asyncio.Queue[str] = asyncio.Queue()
    try:
        na = a.nodes
        assert na is not None
        listener = asyncio.create_task(na.listen(lambda *_: None, lambda: heard.put_nowait("creds")))
        try:
            async with asyncio.timeout(15):
                assert await heard.get() == "creds" and na.listening
                con = await asyncpg.connect(pg_database)
                try:
                    killed = await con.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                        "mindhand node-a listen",
                    )
                finally:
                    await con.close()
                assert killed == 1
                # no change was made: this second word comes only from a listener opened again
                assert await heard.get() == "creds" and na.listening
        finally:
            listener.cancel()
            with pytest.raises(asyncio.CancelledError):
                await listener
    finally:
        await a.close()


@pytest.mark.slow
async def test_the_lease_renews_while_the_pool_is_taken_and_after_its_connection_died(pg_database, tmp_path):
    """A node's heartbeat runs on a connection of its own: with every pooled connection held (a
    connect storm's statements) it still renews at once, on the database's clock; its connection
    killed by the server, a renewal opens another."""
    import asyncpg

    from mind.store.postgres.pool import POOL_MAX

    a = await open_stores(tmp_path / "a", pg_database, "node-a")
    try:
        na = a.nodes
        assert na is not None
        await na.heartbeat()
        held: list[asyncpg.Connection] = []
        pool = a._db.pool  # type: ignore[attr-defined]
        for _ in range(POOL_MAX):
            held.append(await pool.acquire())
        try:
            with pytest.raises(StoreUnavailable):  # the pool is really taken: a pooled statement waits
                await a._db.run(lambda con: con.fetchval("SELECT 1"), timeout=0.5)  # type: ignore[attr-defined]
            await asyncio.sleep(0.3)
            assert await held_age(held[0], "node-a") >= 0.3
            await na.heartbeat(timeout=2.0)
            assert await held_age(held[0], "node-a") < 0.25
        finally:
            for con in held:
                await pool.release(con)
        con = await asyncpg.connect(pg_database)
        try:
            killed = await con.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                "mindhand node-a lease",
            )
            assert killed == 1
            await asyncio.sleep(0.1)
            with contextlib.suppress(StoreUnavailable):  # the first may meet the dead connection
                await na.heartbeat(timeout=2.0)
            await na.heartbeat(timeout=2.0)
            assert await held_age(con, "node-a") < 0.5
        finally:
            await con.close()
    finally:
        await a.close()


async def held_age(con, node: str) -> float:
    """Seconds since `node`'s heartbeat, on the database's clock."""
    return float(
        await con.fetchval(
            "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 FROM nodes WHERE name = $1", node
        )
    )
