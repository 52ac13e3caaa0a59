"""Reading recordings back (DESIGN §19): mind/client/recordings.py (asciicast lines, one stream's bytes,
a playback's schedule) over real blocks made by `mind.core.recording` (`Recording` -> `seal` ->
`store_block` -> `unpack`), and `mind play` / `mind recordings` (mind/cli/recordings.py) against a
stand-in Mind that answers `get_recording`, `list_recordings` and `verify_recordings` from such blocks."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mind.cli import main, options
from mind.cli import recordings as cli
from mind.client import recordings as rec
from mind.core.recording import ZERO_HEAD, Recording, Stored, events_of, store_block, unpack, verify
from mind.errors import ClientError
from protocol.codes import ErrorCode
from protocol.messages import (
    GetRecording,
    ListRecordings,
    RecordingBlock,
    RecordingCheck,
    RecordingInfo,
    RecordingList,
    RecordingPage,
    VerifyRecordings,
    VerifyResult,
)

KEY = bytes(range(32))
T0 = 0.0
"""The recording's monotonic start (0: `int(s * 1e6)` of the times used here is exact)."""
WALL = 1_700_000_000.5


class Rec:
    """A recording made as the Mind's recorder makes one, its blocks stored and chained."""

    def __init__(self, run_id: str = "r1", pty: bool = True, max_bytes: int = 64 << 20) -> None:
        self.r = Recording(run_id, T0, max_bytes)
        self.blocks: list[Stored] = []
        self.prev = ZERO_HEAD
        start: dict[str, Any] = {"run_id": run_id, "hand": "laptop", "client": "alice", "tool": "exec"}
        start["command"] = {"argv": ["top", "-b"]}
        if pty:
            start["term"] = "xterm-256color"
        self.r.note("start", start, T0)
        if pty:
            self.r.on_resize(120, 40, T0)

    def out(self, at: float, data: bytes, stream: str = "pty") -> Rec:
        self.r.on_output(stream, data, T0 + at)
        return self

    def seal(self, at: float) -> Rec:
        sealed = self.r.seal(T0 + at)  # a list of blocks (one per BLOCK_BYTES of output)
        for block in sealed if isinstance(sealed, list) else [sealed] if sealed is not None else []:
            stored = store_block(block, self.prev, KEY)
            self.prev = stored.head
            self.blocks.append(stored)
        return self

    def end(self, at: float, exit_code: int = 0) -> Rec:
        self.r.end({"state": "succeeded", "exit_code": exit_code, "reason": None, "ended": WALL + at}, T0 + at)
        return self.seal(at)

    def events(self) -> list[list[Any]]:
        return list(events_of(self.blocks))


def joined(items: list[bytes | rec.Gap]) -> bytes:
    return b"".join(i for i in items if isinstance(i, bytes))


def info(run_id: str = "r1", kind: str = "terminal", ended: float | None = WALL + 3, **kw: Any) -> RecordingInfo:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "hand": "laptop",
        "client": "alice",
        "tool": "exec",
        "kind": kind,
        "command": {"argv": ["top", "-b"]},
        "started": WALL,
        "ended": ended,
        "state": "succeeded" if ended is not None else None,
        "exit_code": 0 if ended is not None else None,
    }
    return RecordingInfo(**{**fields, **kw})


# --- one stream, byte for byte --------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(st.sampled_from(["stdout", "stderr"]), st.binary(min_size=1, max_size=300)), min_size=1, max_size=40
    ),
    st.integers(min_value=1, max_value=7),
)
def test_a_streams_bytes_come_back_exactly_whatever_the_chunks_and_blocks(chunks, every):
    r = Rec(pty=False)
    for i, (stream, data) in enumerate(chunks):
        r.out(i * 0.01, data, stream)
        if i % every == 0:
            r.seal(i * 0.01)
    r.end(len(chunks) * 0.01)
    events = r.events()
    for stream in ("stdout", "stderr"):
        want = b"".join(d for s, d in chunks if s == stream)
        items = list(rec.stream_bytes(events, stream))
        assert not any(isinstance(i, rec.Gap) for i in items)
        got = joined(items)
        assert got == want
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest()


def test_a_gap_is_reported_where_it_is_recorded_and_its_bytes_are_not_invented():
    r = Rec(pty=False, max_bytes=10)
    r.out(0.1, b"a" * 6, "stdout").out(0.2, b"b" * 6, "stdout").out(0.3, b"c" * 3, "stdout").out(0.35, b"E", "stderr")
    r.seal(0.5).end(1.0)
    items = list(rec.stream_bytes(r.events(), "stdout"))
    assert items[:2] == [b"a" * 6, b"c" * 3]  # b*6 would pass the bound of 10 bytes; c*3 still fits
    gaps = [i for i in items if isinstance(i, rec.Gap)]
    assert gaps == [rec.Gap(500_000, "stdout", 6, "max_bytes")]  # said when the block was sealed
    assert gaps[0].text() == "gap of 6 bytes in stdout (max_bytes)"
    assert list(rec.stream_bytes(r.events(), "stderr")) == [b"E"]


def test_stdin_is_its_own_stream():
    r = Rec(pty=False)
    r.r.on_input(b"typed\n", T0 + 0.1, keep=True)
    r.out(0.2, b"out", "stdout").end(0.3)
    assert list(rec.stream_bytes(r.events(), "stdin")) == [b"typed\n"]
    assert list(rec.stream_bytes(r.events(), "stdout")) == [b"out"]


# --- the schedule of a timed playback -------------------------------------------------------------


def terminal(run_id: str = "r1") -> Rec:
    r = Rec(run_id)
    r.out(0.0, b"a").out(1.0, b"b").seal(1.5).out(3.0, b"c").out(13.0, b"d")
    return r.end(13.5)


def test_frames_keep_the_recorded_pauses_divided_by_the_speed():
    events = terminal().events()
    assert list(rec.frames(events)) == [(0.0, b"a"), (1.0, b"b"), (2.0, b"c"), (10.0, b"d")]
    assert list(rec.frames(events, speed=2)) == [(0.0, b"a"), (0.5, b"b"), (1.0, b"c"), (5.0, b"d")]


def test_frames_from_a_point_write_what_came_before_at_once_then_time_from_there():
    events = terminal().events()
    assert list(rec.frames(events, start_s=2.0)) == [(0.0, b"ab"), (1.0, b"c"), (10.0, b"d")]
    assert list(rec.frames(events, speed=2, start_s=3.0)) == [(0.0, b"ab"), (0.0, b"c"), (5.0, b"d")]
    assert list(rec.frames(events, start_s=60.0)) == [(0.0, b"abcd")]  # past the end: the final screen


def test_the_idle_limit_caps_each_pause_before_the_speed_divides_it():
    events = terminal().events()
    assert list(rec.frames(events, idle_limit=1.5)) == [(0.0, b"a"), (1.0, b"b"), (1.5, b"c"), (1.5, b"d")]
    assert list(rec.frames(events, speed=2, idle_limit=1.5)) == [(0.0, b"a"), (0.5, b"b"), (0.75, b"c"), (0.75, b"d")]


def test_frames_carry_a_terminals_gaps_in_their_place():
    r = Rec(max_bytes=4)
    r.out(0.1, b"abc").out(0.2, b"defgh").seal(0.5).out(1.0, b"i").end(1.2)
    got = list(rec.frames(r.events()))
    assert got == [(0.1, b"abc"), (0.4, rec.Gap(500_000, "pty", 5, "max_bytes")), (0.5, b"i")]
    with pytest.raises(ValueError):
        list(rec.frames(r.events(), speed=0))


# --- asciicast v2 ---------------------------------------------------------------------------------


def cast(r: Rec, **kw: Any) -> tuple[dict[str, Any], list[list[Any]]]:
    lines = list(rec.to_asciicast(info(**kw).model_dump(), r.events()))
    assert all("\n" not in line for line in lines)
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def test_asciicast_header_says_size_time_command_and_term():
    header, _ = cast(terminal())
    assert header == {
        "version": 2,
        "width": 120,
        "height": 40,
        "timestamp": int(WALL),
        "command": "top -b",
        "title": "r1 on laptop",
        "env": {"TERM": "xterm-256color"},
    }


def test_asciicast_events_have_seconds_types_and_text():
    r = Rec()
    r.out(0.25, b"hello\r\n").seal(0.5)
    r.r.on_resize(100, 30, T0 + 0.75)
    r.r.on_input(b"q", T0 + 1.0, keep=True)
    r.out(1.5, b"bye").end(2.0)
    _, events = cast(r)
    assert events == [[0.25, "o", "hello\r\n"], [0.75, "r", "100x30"], [1.0, "i", "q"], [1.5, "o", "bye"]]


def test_a_character_split_between_chunks_comes_out_whole():
    r = Rec()
    euro = "€".encode()  # three bytes
    r.out(0.1, b"price " + euro[:1]).seal(0.2).out(0.3, euro[1:2]).out(0.4, euro[2:] + b"5").end(0.5)
    _, events = cast(r)
    assert events == [[0.1, "o", "price "], [0.4, "o", "€5"]]
    assert "\ufffd" not in "".join(e[2] for e in events)


def test_invalid_utf8_is_replaced_and_a_half_character_at_a_gap_is_not_joined_across_it():
    r = Rec(max_bytes=8)
    r.out(0.1, b"ok\xff" + "é".encode()[:1]).out(0.2, b"0123456789").seal(0.5).out(0.6, "é".encode()[1:]).end(0.7)
    _, events = cast(r)
    assert events == [
        [0.1, "o", "ok\ufffd"],
        [0.5, "o", "\ufffd"],  # the held first byte of é, ended by the gap
        [0.5, "m", "not recorded: gap of 10 bytes in pty (max_bytes)"],
        [0.6, "o", "\ufffd"],  # and its lone continuation byte
    ]


def test_a_plain_runs_stdout_and_stderr_are_both_output_with_terminal_line_ends():
    r = Rec(pty=False)
    r.out(0.1, b"one\ntwo\n", "stdout").out(0.2, b"oops\n", "stderr").end(0.3)
    header, events = cast(r, kind="streams")
    assert (header["width"], header["height"], header["env"]) == (80, 24, {})
    assert events == [[0.1, "o", "one\r\ntwo\r\n"], [0.2, "o", "oops\r\n"]]


# --- everything as JSON ---------------------------------------------------------------------------


def test_the_json_document_holds_every_event_with_bytes_in_base64():
    r = Rec(pty=False)
    payload = bytes(range(256))
    r.out(0.1, payload, "stdout").seal(0.2).end(0.3, exit_code=3)
    doc = json.loads(json.dumps(rec.to_document(info(kind="streams").model_dump(mode="json"), r.blocks)))
    assert (doc["format"], doc["bytes"], doc["complete"]) == ("mindhand-recording", "base64", True)
    assert [b["seq"] for b in doc["blocks"]] == [0, 1]
    assert doc["blocks"][1]["head"] == r.blocks[1].head.hex()
    outs = [e for e in doc["events"] if e[1] == "o"]
    assert outs == [[100_000, "o", "stdout", base64.b64encode(payload).decode()]]
    end = [e for e in doc["events"] if e[1] == "m" and e[2] == "end"][0][3]
    assert (end["exit_code"], end["recorded"]) == (3, 256)
    assert doc["info"]["run_id"] == "r1"


# --- small things -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seconds, text", [(0.44, "0.4s"), (59.94, "59.9s"), (185, "3m05s"), (3723, "1h02m03s"), (0, "0.0s")]
)
def test_duration_text(seconds, text):
    assert rec.duration_text(seconds) == text


@pytest.mark.parametrize(
    "command, text",
    [
        ({"argv": ["ls", "-l", "my dir"]}, "ls -l 'my dir'"),
        ({"command": "make && make test"}, "make && make test"),
        ({"path": "/etc/hosts", "dest": "/tmp/h", "size": 3}, "/etc/hosts -> /tmp/h"),
        ({"host": "db", "port": 5432}, "db:5432"),
        ({}, ""),
    ],
)
def test_command_text(command, text):
    assert rec.command_text(command) == text


def test_a_page_block_is_read_as_the_store_wrote_it():
    r = terminal()
    page = [
        RecordingBlock(seq=b.seq, t=b.t, data=b.data, compressed=b.compressed, head=b.head, mac=b.mac) for b in r.blocks
    ]
    stored = [rec.stored_of("r1", b) for b in page]
    assert [unpack(s) for s in stored] == [unpack(b) for b in r.blocks]
    assert verify("r1", stored, KEY).ok


# --- the commands, against a stand-in Mind --------------------------------------------------------


class FakeMind:
    """Answers the recording requests as the Mind would, `page` blocks a page; `grow` adds blocks
    (a recording still being written) each time the client has seen all there is."""

    def __init__(self, recordings: dict[str, tuple[RecordingInfo, list[Stored]]], page: int = 2) -> None:
        self.recordings = recordings
        self.page = page
        self.asked: list[Any] = []
        self.grow: list[list[Stored]] = []
        self.refuse: ClientError | None = None

    # the three requests of `MindClient` the commands make

    async def get_recording(self, run_id: str, after: int = -1) -> RecordingPage:
        return await self._ask(GetRecording(run_id=run_id, after=after), RecordingPage)

    async def list_recordings(self, hand=None, client=None, since=None, limit=100, after=None) -> RecordingList:
        msg = ListRecordings(hand=hand, client=client, since=since, limit=limit, after=after)
        return await self._ask(msg, RecordingList)

    async def verify_recordings(self, run_id: str | None = None) -> VerifyResult:
        return await self._ask(VerifyRecordings(run_id=run_id), VerifyResult)

    async def _ask(self, msg: Any, kind: type, *, read: bool = False) -> Any:
        self.asked.append(msg)
        if self.refuse is not None:
            raise self.refuse
        if isinstance(msg, GetRecording):
            if msg.run_id not in self.recordings:
                raise ClientError(ErrorCode.UNKNOWN_RUN, f"no recording of run {msg.run_id}")
            meta, blocks = self.recordings[msg.run_id]
            rest = [b for b in blocks if b.seq > msg.after]
            if not rest and self.grow:
                blocks += self.grow.pop(0)
            chunk = rest[: self.page]
            out = [
                RecordingBlock(seq=b.seq, t=b.t, data=b.data, compressed=b.compressed, head=b.head, mac=b.mac)
                for b in chunk
            ]
            reply: Any = RecordingPage(info=meta, blocks=out, more=len(rest) > self.page)
        elif isinstance(msg, ListRecordings):
            items = sorted((i for i, _ in self.recordings.values()), key=lambda i: i.run_id)
            start = int(msg.after or 0)
            n = min(msg.limit, self.page)
            reply = RecordingList(
                items=items[start : start + n], next_after=str(start + n) if start + n < len(items) else None
            )
        elif isinstance(msg, VerifyRecordings):
            ids = [msg.run_id] if msg.run_id else sorted(self.recordings)
            checks = []
            for run_id in ids:
                c = verify(run_id, self.recordings[run_id][1], KEY)
                checks.append(
                    RecordingCheck(
                        run_id=run_id, ok=c.ok, problem=c.problem, at=c.at, blocks=c.blocks, complete=c.complete
                    )
                )
            reply = VerifyResult(items=checks)
        assert isinstance(reply, kind)
        return reply


def parse(*words: str) -> argparse.Namespace:
    p, sub = main.top_parser()
    cli.add_parsers(sub)
    return p.parse_args(list(words))


COMMANDS = {"play": cli.play, "export": cli.export, "verify": cli.verify_recordings, None: cli.list_recordings}


def run(fake: FakeMind, *words: str) -> int:
    """A command's coroutine (what `with_client` would run once connected) against `fake`."""
    args = parse(*words)
    command = COMMANDS["play" if words[0] == "play" else args.action]
    return asyncio.run(command(fake, args))


def plain_run() -> Rec:
    r = Rec("p1", pty=False)
    for i in range(7):
        r.out(i * 0.01, f"line {i}\n".encode(), "stdout").out(i * 0.01, b"E", "stderr").seal(i * 0.01)
    return r.end(0.1)


def test_play_stream_prints_stdout_byte_exact_across_pages(capsysbinary):
    r = plain_run()
    fake = FakeMind({"p1": (info("p1", kind="streams"), r.blocks)})
    assert run(fake, "play", "p1") == 0
    out = capsysbinary.readouterr()
    assert out.out == b"".join(f"line {i}\n".encode() for i in range(7))
    assert out.err == b""
    afters = [m.after for m in fake.asked]
    assert len(r.blocks) == 8
    assert afters == [-1, 1, 3, 5]  # page by page while the Mind said more: 8 blocks, 2 a page
    assert run(fake, "play", "--stream", "stderr", "p1") == 0
    assert capsysbinary.readouterr().out == b"E" * 7


def test_play_says_each_gap_and_a_missing_end_and_exits_1(capsysbinary):
    r = Rec("g1", pty=False, max_bytes=4)
    r.out(0.1, b"abc", "stdout").out(0.2, b"defgh", "stdout").seal(0.5).out(0.6, b"i", "stdout").seal(2.5)
    fake = FakeMind({"g1": (info("g1", kind="streams", ended=None), r.blocks)})
    assert run(fake, "play", "g1") == 1
    out = capsysbinary.readouterr()
    assert out.out == b"abci"
    assert out.err.decode().splitlines() == [
        "mind: gap of 5 bytes in stdout (max_bytes)",
        "mind: the recording stops at 2.5s (its node stopped before the run ended, or the run goes on: --follow waits)",
    ]


def test_play_times_a_terminal(capsysbinary, monkeypatch):
    r = Rec("t1")
    r.out(0.0, b"\x1b[2Jhi").out(0.2, b" there").out(5.0, b"!").end(5.1)
    fake = FakeMind({"t1": (info("t1"), r.blocks)})
    loop_time: list[float] = []
    original = cli.write

    def stamped(data: bytes) -> None:
        loop_time.append(asyncio.get_running_loop().time())
        original(data)

    monkeypatch.setattr(cli, "write", stamped)
    assert run(fake, "play", "--speed", "2", "--idle-limit", "0.3", "t1") == 0
    assert capsysbinary.readouterr().out == b"\x1b[2Jhi there!"
    pauses = [b - a for a, b in zip(loop_time, loop_time[1:], strict=False)]
    assert pauses[0] == pytest.approx(0.1, abs=0.05)  # 0.2 s at twice the speed
    assert pauses[1] == pytest.approx(0.15, abs=0.05)  # 4.8 s capped at 0.3, at twice the speed


def test_play_from_writes_the_screen_before_it_at_once(capsysbinary):
    r = Rec("t2")
    r.out(0.0, b"a").out(30.0, b"b").out(30.05, b"c").end(30.1)
    fake = FakeMind({"t2": (info("t2"), r.blocks)})
    assert run(fake, "play", "--from", "30", "t2") == 0  # 30 s of pause skipped: this returns at once
    assert capsysbinary.readouterr().out == b"abc"


def test_play_follow_prints_blocks_as_they_come_until_the_end(capsysbinary, monkeypatch):
    r = Rec("f1")
    r.out(0.0, b"first ").seal(0.5)
    fake = FakeMind({"f1": (info("f1", ended=None), list(r.blocks))})
    r.out(0.6, b"second ").seal(1.0)
    later1 = r.blocks[1:]
    r.out(1.2, b"third").end(1.5)
    fake.grow = [later1, r.blocks[2:]]
    monkeypatch.setattr(cli, "FOLLOW_POLL_S", 0.0)
    assert run(fake, "play", "--follow", "f1") == 0
    assert capsysbinary.readouterr().out == b"first second third"


def test_play_refusals(capsysbinary):
    r = Rec("c1", pty=False).end(0.1)
    fake = FakeMind({"c1": (info("c1", kind="copy"), r.blocks), "t1": (info("t1"), terminal().blocks)})
    with pytest.raises(SystemExit) as exc:
        run(fake, "play", "nope")
    assert exc.value.code == 1
    assert capsysbinary.readouterr().err == b"mind: no recording of run nope\n"
    with pytest.raises(SystemExit) as exc:
        run(fake, "play", "c1")
    assert exc.value.code == 1
    assert b"holds names, sizes and digests, not bytes" in capsysbinary.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run(fake, "play", "--stream", "stdout", "t1")  # a terminal has one output stream: pty
    assert exc.value.code == 2
    assert capsysbinary.readouterr().err == b"mind: run t1 is a terminal recording: it holds pty, stdin, not stdout\n"
    with pytest.raises(SystemExit) as exc:
        run(fake, "play", "--follow", "--speed", "2", "t1")
    assert exc.value.code == 2
    capsysbinary.readouterr()
    fake.refuse = ClientError(ErrorCode.DENIED_BY_SCOPE, "this credential may not read recordings")
    with pytest.raises(SystemExit) as exc:
        run(fake, "play", "t1")
    assert exc.value.code == 1
    assert capsysbinary.readouterr().err == b"mind: this credential may not read recordings\n"
    fake.refuse = ClientError(ErrorCode.SHUTDOWN, "the Mind is stopping")  # the connection's end, not a refusal:
    with pytest.raises(ClientError):  # up to `with_client`, which says it and exits 125 as every command does
        run(fake, "play", "t1")


def test_play_stream_pty_of_a_terminal_is_byte_exact(capsysbinary):
    fake = FakeMind({"t1": (info("t1"), terminal("t1").blocks)})
    assert run(fake, "play", "--stream", "pty", "t1") == 0
    assert capsysbinary.readouterr().out == b"abcd"


def test_export_asciicast_and_json(tmp_path, capsysbinary):
    r = terminal()
    fake = FakeMind({"r1": (info("r1"), r.blocks)})
    assert run(fake, "recordings", "export", "r1") == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    assert json.loads(lines[0])["width"] == 120
    assert [json.loads(line) for line in lines[1:]] == [
        [0.0, "o", "a"],
        [1.0, "o", "b"],
        [3.0, "o", "c"],
        [13.0, "o", "d"],
    ]
    path = tmp_path / "r1.json"
    assert run(fake, "recordings", "export", "--format", "json", "-o", str(path), "r1") == 0
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and len(doc["blocks"]) == len(r.blocks)
    outs = [base64.b64decode(e[3]) for e in doc["events"] if e[1] == "o"]
    assert outs == [b"a", b"b", b"c", b"d"]


def test_verify_lines_and_exit_codes(capsys):
    good = terminal()
    cut = Rec("r2").out(0.1, b"x").seal(0.2).out(0.3, b"y").seal(0.4)  # no end: its node stopped
    bad = Rec("r3").out(0.1, b"x").seal(0.2).out(0.3, b"y").end(0.4)
    b1 = bad.blocks[1]
    bad.blocks[1] = Stored(b1.run_id, b1.seq, b1.t, b1.data, b1.compressed, b1.head, bytes(32), b1.raw_len)
    fake = FakeMind({"r1": (info("r1"), good.blocks), "r2": (info("r2"), cut.blocks), "r3": (info("r3"), bad.blocks)})
    assert run(fake, "recordings", "verify", "r1") == 0
    assert capsys.readouterr().out == f"r1  ok  complete ({len(good.blocks)} blocks)\n"
    assert run(fake, "recordings", "verify", "--all") == 1
    assert capsys.readouterr().out.splitlines() == [
        f"r1  ok  complete ({len(good.blocks)} blocks)",
        "r2  ok  incomplete: ends at block 1",
        "r3  BROKEN  block 1's signature does not check: written without the key",
    ]
    with pytest.raises(SystemExit) as exc:
        run(fake, "recordings", "verify")
    assert exc.value.code == 2


def test_the_list_pages_and_shows_dashes_for_a_recording_going_on(capsys):
    fake = FakeMind(
        {f"r{i}": (info(f"r{i}", ended=None if i == 2 else WALL + 65, bytes=2048), []) for i in range(5)}, page=2
    )
    assert run(fake, "recordings", "--limit", "3", "--since", "2h", "--client", "alice") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == cli.HEADERS
    assert [line.split()[0] for line in lines[1:]] == ["r0", "r1", "r2"]
    r2 = lines[3].split()
    assert (r2[-4], r2[-1]) == ("-", "-")  # no duration, no state: it goes on
    assert lines[1].split()[-4:] == ["1m05s", "2.0", "KiB", "succeeded"]
    assert [(m.client, m.limit, m.after) for m in fake.asked] == [("alice", 3, None), ("alice", 1, "2")]
    assert fake.asked[0].since == pytest.approx(time.time() - 7200, abs=5)
    with pytest.raises(SystemExit) as exc:
        run(fake, "recordings", "--since", "0")
    assert exc.value.code == 2


def test_the_commands_parse_and_their_durations_read_units(capsys):
    a = parse("play", "r1", "--from", "90s", "--idle-limit", "2s", "--speed", "0.5")
    assert (a.start, a.idle_limit, a.speed, a.follow, a.stream) == (90.0, 2.0, 0.5, False, None)
    assert parse("recordings", "verify", "--all").all is True
    assert parse("recordings", "export", "r1", "-o", "f").output == "f"
    assert parse("recordings", "--since", "2h").since == 7200.0
    for bad in (["play", "r1", "--speed", "0"], ["play", "r1", "--from", "soon"], ["play"]):
        with pytest.raises(SystemExit) as exc:
            parse(*bad)
        assert exc.value.code == 2
    # the rules tests/mind/test_cli_parse.py holds every command to, once mind/cli/main.py lists this family
    p, sub = main.top_parser()
    cli.add_parsers(sub)
    parsers = [sub.choices["play"], sub.choices["recordings"], *sub.choices["recordings"]._actions[-1].choices.values()]
    for sp in parsers:
        for action in sp._actions:
            assert action.type is not float
            if action.metavar == "DURATION":
                assert action.type is options.duration
