"""On a running loop the daemons' `info` lines wait for the end of the loop's turn (DESIGN §13:
audit lines off the call's path), and lose nothing by it: each line is written once, in the order
logged, with the time and the bound context of when it was logged; a warning, an error or an
exception is written at once (after what waits); the audit file's close and a new loop write what
an ended loop left."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import time

import pytest
import structlog

from protocol.audit import AuditEvent
from protocol.io import logs


class _Stream(io.StringIO):
    def isatty(self) -> bool:
        return False


@pytest.fixture
def stream():
    s = _Stream()
    yield s
    logs.flush()
    structlog.reset_defaults()


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def events(stream: _Stream) -> list[str]:
    return [line["event"] for line in lines(stream.getvalue())]


def test_an_info_line_waits_for_the_turn_and_keeps_its_time_and_context(stream):
    logs.configure("json", "info", stream=stream)
    log = logs.get("mind")

    async def turn() -> tuple[str, float, float]:
        structlog.contextvars.bind_contextvars(run_id="r-1")
        before = time.time()
        log.info("run_started", hand="box")
        structlog.contextvars.unbind_contextvars("run_id")
        time.sleep(0.05)  # noqa: ASYNC251 (the rest of the turn: the loop must not run)
        during = stream.getvalue()
        after = time.time()
        await asyncio.sleep(0)  # the turn ends
        return during, before, after

    during, before, after = asyncio.run(turn())
    assert during == ""  # not written while the turn ran
    [line] = lines(stream.getvalue())
    assert line["event"] == "run_started" and line["run_id"] == "r-1" and line["hand"] == "box"
    stamp = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()
    assert line["timestamp"].endswith("Z") and before <= stamp < before + 0.04 < after  # when it was logged


def test_a_warning_is_written_at_once_after_what_waits(stream):
    logs.configure("json", "info", stream=stream)
    log = logs.get("mind")

    async def turn() -> list[str]:
        log.info("first")
        log.warning("second")
        seen = events(stream)
        log.info("third")
        try:
            raise OSError("gone")
        except OSError:
            log.exception("fourth")
        seen += ["|"] + events(stream)
        await asyncio.sleep(0)
        return seen

    seen = asyncio.run(turn())
    assert seen == ["first", "second", "|", "first", "second", "third", "fourth"]
    assert events(stream) == ["first", "second", "third", "fourth"]  # each once, in order


def test_off_a_loop_every_line_is_written_at_once(stream):
    logs.configure("json", "info", stream=stream)
    logs.get("hand").info("hand_started")
    assert events(stream) == ["hand_started"]


def test_without_defer_a_line_on_a_loop_is_written_at_once(stream):
    logs.configure("json", "info", stream=stream, defer=False)

    async def turn() -> list[str]:
        logs.get("mind").info("run_started")
        return events(stream)

    assert asyncio.run(turn()) == ["run_started"]


def test_closing_the_audit_file_writes_the_lines_that_wait(stream, tmp_path):
    audit = logs.AuditLog(tmp_path / "audit.jsonl")
    logs.configure("json", "info", stream=stream, audit=audit)

    async def turn() -> None:
        logs.get("mind").info(AuditEvent.RUN_TERMINAL, run_id="r-2", state="succeeded")
        audit.close()  # within the same turn: the daemon's exit

    asyncio.run(turn())
    [line] = lines((tmp_path / "audit.jsonl").read_text())
    assert line["event"] == "run_terminal" and line["run_id"] == "r-2" and line["state"] == "succeeded"


def test_a_line_left_by_a_loop_that_ended_is_written_by_the_next(stream):
    logs.configure("json", "info", stream=stream)
    log = logs.get("mind")
    loop = asyncio.new_event_loop()
    loop.call_soon(log.info, "on_the_first_loop")
    loop.call_soon(loop.stop)  # the loop's last turn: the flush it scheduled never runs
    loop.run_forever()
    loop.close()
    assert stream.getvalue() == ""

    async def log_on_a_new_loop() -> None:
        log.info("on_the_second_loop")

    asyncio.run(log_on_a_new_loop())
    assert events(stream) == ["on_the_first_loop", "on_the_second_loop"]


def test_what_an_ended_loop_left_is_written_by_flush(stream):
    logs.configure("json", "info", stream=stream)
    loop = asyncio.new_event_loop()
    loop.call_soon(logs.get("mind").info, "left")
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.close()
    logs.flush()  # what the daemons' exit (and atexit) does
    assert events(stream) == ["left"]
