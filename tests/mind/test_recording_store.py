"""The recordings store, both engines (issue 38, DESIGN §19): written by batches as the recorder
flushes them, listed newest first with filters and a cursor, read back a page at a time, continued
by another writer (the node a run moved to) without a break in the chain, pruned by age, and the
signing key kept out of the database. The PostgreSQL cases start the suite's server (`slow`)."""

from __future__ import annotations

import os
import stat

import pytest

from mind.core.recording import Recording, events_of, verify
from mind.store.engines import open_stores
from mind.store.recordings import Batch, Listing, RecordingKeyError, load_key

KEY = b"s" * 32


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
async def stores(request, tmp_path):
    database = request.getfixturevalue("pg_database") if request.param == "postgresql" else None
    s = await open_stores(tmp_path / "home", database)
    try:
        yield s
    finally:
        await s.close()


def listing(run_id: str, started: float, hand: str = "box", client: str = "me") -> Listing:
    return Listing(run_id, hand, client, "exec", "streams", {"argv": ["cat"]}, started)


async def test_written_blocks_read_back_exactly_and_verify(stores):
    rec = stores.open_recordings(KEY)
    try:
        r = Recording("r1", 0.0)
        r.note("start", {"hand": "box", "client": "me", "tool": "exec"}, 0.0)
        data = [os.urandom(5000) for _ in range(6)]
        first = listing("r1", 1000.0)
        for i, d in enumerate(data):
            r.on_output("stdout", d, i * 0.5)
            if i == len(data) - 1:
                r.end({"state": "succeeded", "exit_code": 0}, 3.0)
                first.state, first.exit_code = "succeeded", 0
            await rec.write(Batch(begun=[first] if i == 0 else [], blocks=r.seal(i * 0.5 + 0.1), updated=[first]))
        blocks = await rec.blocks("r1")
        assert [b.seq for b in blocks] == list(range(6)) and await rec.last_seq("r1") == 5
        assert b"".join(e[3] for e in events_of(blocks) if e[1] == "o") == b"".join(data)
        assert verify("r1", blocks, KEY, {"hand": "box", "state": "succeeded", "exit_code": 0}).complete
        assert [b.seq for b in await rec.blocks("r1", after=3)] == [4, 5]
        small = await rec.blocks("r1", max_bytes=1)
        assert [b.seq for b in small] == [0]  # a page stops once past its bytes, never empty
        got = await rec.listing("r1")
        assert got is not None and got.state == "succeeded" and got.command == {"argv": ["cat"]}
        assert await rec.listing("nope") is None
    finally:
        await rec.close()


async def test_listing_filters_and_pages_newest_first(stores):
    rec = stores.open_recordings(KEY)
    try:
        rows = [listing(f"r{i:02d}", 100.0 + i, hand="a" if i % 2 else "b", client=f"c{i % 3}") for i in range(12)]
        await rec.write(Batch(begun=rows))
        assert [x.run_id for x in await rec.find(limit=3)] == ["r11", "r10", "r09"]
        assert [x.run_id for x in await rec.find(limit=3, before=(109.0, "r09"))] == ["r08", "r07", "r06"]
        assert {x.hand for x in await rec.find(hand="a", limit=100)} == {"a"}
        assert [x.run_id for x in await rec.find(client="c0", since=103.0)] == ["r09", "r06", "r03"]
    finally:
        await rec.close()


async def test_another_writer_continues_the_chain(stores, tmp_path):
    """A run that moved to another node goes on in the same recording: that node's writer reads
    the last head from the store and links its blocks after it."""
    one = stores.open_recordings(KEY)
    r = Recording("r1", 0.0)
    r.note("start", {"hand": "box", "client": "me", "tool": "exec"}, 0.0)
    r.on_output("pty", b"before the move", 0.1)
    await one.write(Batch(begun=[listing("r1", 1.0)], blocks=r.seal(0.2)))
    await one.close()
    two = stores.open_recordings(KEY)  # a fresh writer: knows no head
    try:
        r2 = Recording("r1", 0.0, seq=1)
        r2.on_output("pty", b" after it", 0.3)
        r2.end({"state": "succeeded", "exit_code": 0}, 0.4)
        await two.write(Batch(blocks=r2.seal(0.5)))
        blocks = await two.blocks("r1")
        c = verify("r1", blocks, KEY)
        assert c.ok and c.complete and c.blocks == 2, c
        assert b"".join(e[3] for e in events_of(blocks) if e[1] == "o") == b"before the move after it"
    finally:
        await two.close()


async def test_prune_removes_old_recordings_and_their_blocks(stores):
    rec = stores.open_recordings(KEY)
    try:
        old, new = Recording("old", 0.0), Recording("new", 0.0)
        old.on_output("stdout", b"x", 0.0)
        new.on_output("stdout", b"y", 0.0)
        await rec.write(Batch(begun=[listing("old", 10.0), listing("new", 1000.0)], blocks=old.seal(1) + new.seal(1)))
        assert await rec.prune(500.0) == 1
        assert await rec.listing("old") is None and await rec.blocks("old") == []
        assert await rec.listing("new") is not None and len(await rec.blocks("new")) == 1
    finally:
        await rec.close()


def test_the_key_is_made_private_once_and_a_named_one_must_be_private(tmp_path):
    home = tmp_path / "home"
    k = load_key(home)
    path = home / "recording.key"
    assert len(k) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(home) == k
    named = tmp_path / "shared.key"
    named.write_bytes(b"z" * 32)
    named.chmod(0o644)
    with pytest.raises(RecordingKeyError, match="readable by others"):
        load_key(home, str(named))
    named.chmod(0o600)
    assert load_key(home, str(named)) == b"z" * 32
    with pytest.raises(RecordingKeyError, match="no such file"):
        load_key(home, str(tmp_path / "missing.key"))
