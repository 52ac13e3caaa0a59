"""A recording's rules (issue 38, DESIGN §19), pure: what a recording keeps, its bound and its gaps,
its blocks, and the chain `verify` walks. Every way of tampering a database writer has (alter a
block, remove one, swap two, write one without the key, change the listing, cut the tail) is
performed on real encoded blocks and must be named at the block where it happened."""

from __future__ import annotations

import dataclasses
import os

from hypothesis import given
from hypothesis import strategies as st

from mind.core.recording import (
    BLOCK_BYTES,
    Mode,
    Recording,
    Stored,
    command_of,
    compress,
    events_of,
    records,
    store_block,
    verify,
)

KEY = b"k" * 32


def _blocks(rec: Recording, now: float, key: bytes = KEY) -> list[Stored]:
    prev = bytes(32)
    out = []
    for b in rec.seal(now):
        s = store_block(b, prev, key)
        prev = s.head
        out.append(s)
    return out


def _session(chunks: int = 5, end: bool = True) -> list[Stored]:
    """A recording of five chunks in five blocks (a flush after each), with its start and end."""
    rec = Recording("r1", started=100.0)
    rec.note("start", {"hand": "box", "client": "me", "tool": "exec"}, 100.0)
    prev = bytes(32)
    out: list[Stored] = []
    for i in range(chunks):
        rec.on_output("stdout", f"chunk {i}\n".encode(), 100.0 + i)
        if end and i == chunks - 1:
            rec.end({"state": "succeeded", "exit_code": 0}, 100.0 + i)
        for b in rec.seal(100.0 + i + 0.5):
            s = store_block(b, prev, KEY)
            prev = s.head
            out.append(s)
    return out


def test_modes_record_what_they_say():
    assert records(Mode.PTY, "shell", pty=True, background=False)
    assert not records(Mode.PTY, "exec", pty=False, background=False)
    assert records(Mode.ALL, "exec", pty=False, background=False)
    assert not records(Mode.ALL, "exec", pty=False, background=True)
    assert not records(Mode.OFF, "shell", pty=True, background=False)


def test_a_command_is_kept_but_never_its_environment_values():
    args = {"argv": ["psql", "-c", "drop table t"], "cwd": "/srv", "env": {"PGPASSWORD": "hunter2", "A": "1"}}
    kept = command_of("exec", args)
    assert kept == {"argv": ["psql", "-c", "drop table t"], "cwd": "/srv", "env": ["A", "PGPASSWORD"]}
    assert "hunter2" not in repr(kept)
    copy = command_of("put_file", {"path": "/etc/x", "size": 3, "sha256": "ab" * 32, "data": b"secret bytes"})
    assert copy == {"path": "/etc/x", "size": 3, "sha256": "ab" * 32}


def test_the_stream_bytes_come_back_exactly_with_their_times():
    chunks = [os.urandom(n) for n in (1, 700, 65536, 3)]
    rec = Recording("r1", started=10.0)
    for i, c in enumerate(chunks):
        rec.on_output("stdout", memoryview(c), 10.0 + i * 0.25)
    rec.on_output("stderr", b"oops", 11.5)
    events = list(events_of(_blocks(rec, 12.0)))
    out = [e for e in events if e[1] == "o" and e[2] == "stdout"]
    assert b"".join(e[3] for e in out) == b"".join(chunks)
    assert [e[0] for e in out] == [0, 250_000, 500_000, 750_000]
    assert [e for e in events if e[2] == "stderr"] == [[1_500_000, "o", "stderr", b"oops"]]


def test_past_the_bound_the_recording_says_how_many_bytes_it_left_out_and_goes_on():
    rec = Recording("r1", started=0.0, max_bytes=10)
    rec.on_output("pty", b"12345678", 0.1)
    rec.on_output("pty", b"abcdef", 0.2)  # would pass 10: left out, counted
    rec.on_output("pty", b"xyz", 0.3)
    rec.on_resize(100, 40, 0.4)  # metadata is still kept
    rec.end({"state": "succeeded", "exit_code": 0}, 1.0)
    events = list(events_of(_blocks(rec, 1.0)))
    assert b"".join(e[3] for e in events if e[1] == "o") == b"12345678"
    assert [e[2:] for e in events if e[1] == "g"] == [["pty", 9, "max_bytes"]]
    assert [e[2:] for e in events if e[1] == "r"] == [[100, 40]]
    end = [e[3] for e in events if e[1] == "m" and e[2] == "end"][0]
    assert end["recorded"] == 8 and end["relayed"] == {"pty": 17} and end["gaps"] == 1


def test_a_store_that_falls_behind_is_a_gap_not_a_wait():
    rec = Recording("r1", started=0.0)
    rec.on_output("stdout", b"kept", 0.1)
    rec.on_output("stdout", b"not kept", 0.2, behind=True)
    events = list(events_of(_blocks(rec, 1.0)))
    assert [e[2:] for e in events if e[1] == "g"] == [["stdout", 8, "behind"]]


def test_keystrokes_are_kept_only_when_asked():
    rec = Recording("r1", started=0.0)
    rec.on_input(b"password\r", 0.1, keep=False)
    rec.on_input(b"ls\r", 0.2, keep=True)
    events = list(events_of(_blocks(rec, 1.0)))
    assert [e[2] for e in events if e[1] == "i"] == [b"ls\r"]
    assert rec.relayed["stdin"] == 12


def test_a_fast_run_becomes_blocks_of_at_most_the_block_size():
    rec = Recording("r1", started=0.0)
    chunk = b"x" * (256 << 10)
    for i in range(10):
        rec.on_output("stdout", chunk, i * 0.01)
    blocks = rec.seal(1.0)
    assert [b.seq for b in blocks] == list(range(len(blocks))) and len(blocks) == 3
    assert all(b.nbytes <= BLOCK_BYTES for b in blocks) and sum(b.nbytes for b in blocks) == 10 * len(chunk)


def test_copies_and_tunnels_keep_sizes_not_bytes():
    rec = Recording("r1", started=0.0, streams=False)
    rec.on_output("stdout", b"file bytes", 0.1)
    rec.end({"state": "succeeded"}, 0.2)
    events = list(events_of(_blocks(rec, 0.3)))
    assert not [e for e in events if e[1] == "o"]
    assert events[-1][3]["relayed"] == {"stdout": 10}


def test_what_compresses_is_compressed_and_what_does_not_is_kept_raw():
    text = b"$ ls -la\r\ntotal 0\r\n" * 2000
    packed, yes = compress(text)
    assert yes and len(packed) < len(text) / 10
    noise = os.urandom(100_000)
    assert compress(noise) == (noise, False)


# --- verify ---


def test_an_untouched_recording_verifies_complete():
    c = verify(
        "r1", _session(), KEY, {"hand": "box", "client": "me", "tool": "exec", "state": "succeeded", "exit_code": 0}
    )
    assert c.ok and c.complete and c.blocks == 5 and c.problem == ""


def test_an_altered_block_is_named():
    blocks = _session()
    b = blocks[2]
    data = b.data.replace(b"chunk 2", b"chunk X")
    assert data != b.data
    blocks[2] = dataclasses.replace(b, data=data)
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == 2 and "altered" in c.problem


def test_a_removed_block_is_named():
    blocks = _session()
    del blocks[1]
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == 1 and "removed" in c.problem


def test_a_removed_block_renumbered_is_still_caught():
    blocks = _session()
    del blocks[1]
    blocks = [dataclasses.replace(b, seq=i) for i, b in enumerate(blocks)]
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == 1


def test_two_blocks_swapped_are_caught_at_the_first():
    blocks = _session()
    a, b = blocks[1], blocks[3]
    blocks[1] = dataclasses.replace(b, seq=1)
    blocks[3] = dataclasses.replace(a, seq=3)
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == 1


def test_a_block_rewritten_with_a_good_chain_but_without_the_key_fails_its_signature():
    """Whoever can write the database can recompute every hash; only the key signs."""
    blocks = _session()
    forged: list[Stored] = []
    prev = bytes(32)
    for b in blocks:
        events = list(events_of([b]))
        for e in events:
            if e[1] == "o":
                e[3] = e[3].replace(b"chunk", b"CHUNK")
        from mind.core.recording import Block

        s = store_block(Block("r1", b.seq, b.t, events, 0), prev, b"not the key" * 3)
        prev = s.head
        forged.append(s)
    assert verify("r1", forged, None).ok  # the chain alone holds: a break, not a forgery, is what it tells
    c = verify("r1", forged, KEY)
    assert not c.ok and c.at == 0 and "signature" in c.problem


def test_a_listing_changed_in_the_database_disagrees_with_the_signed_record():
    c = verify(
        "r1", _session(), KEY, {"hand": "box", "client": "me", "tool": "exec", "state": "succeeded", "exit_code": 1}
    )
    assert not c.ok and "exit_code" in c.problem
    c = verify("r1", _session(), KEY, {"hand": "other", "client": "me", "tool": "exec"})
    assert not c.ok and "hand" in c.problem


def test_a_cut_tail_is_told_apart_from_a_node_that_stopped():
    cut = _session()[:3]
    stopped = verify("r1", cut, KEY, {"hand": "box", "client": "me", "tool": "exec"})
    assert stopped.ok and not stopped.complete and stopped.blocks == 3  # in progress, or its node died
    claimed = verify("r1", cut, KEY, {"hand": "box", "client": "me", "tool": "exec", "state": "succeeded"})
    assert not claimed.ok and "removed" in claimed.problem


def test_garbage_in_a_block_is_unreadable_not_a_crash():
    blocks = _session()
    blocks[0] = dataclasses.replace(blocks[0], data=b"\x78\x9c garbage", compressed=True)
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == 0 and "unreadable" in c.problem


@given(st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=30), st.integers(0, 29))
def test_any_flipped_byte_of_any_block_is_caught(chunks: list[bytes], which: int):
    rec = Recording("r1", started=0.0)
    rec.note("start", {"hand": "h", "client": "c", "tool": "exec"}, 0.0)
    prev = bytes(32)
    blocks: list[Stored] = []
    for i, c in enumerate(chunks):
        rec.on_output("stdout", c, i * 0.1)
        for b in rec.seal(i * 0.1):
            s = store_block(b, prev, KEY)
            prev = s.head
            blocks.append(s)
    i = which % len(blocks)
    raw = bytearray(blocks[i].data)
    raw[len(raw) // 2] ^= 0x01
    blocks[i] = dataclasses.replace(blocks[i], data=bytes(raw))
    c = verify("r1", blocks, KEY)
    assert not c.ok and c.at == i
