"""A logged exception carries its type, message and traceback as JSON fields (`exc_type`,
`exc_message`, `traceback`), never local variables, a pydantic error's input, or what the daemon
redacts (the Hand: its root and its secret)."""

from __future__ import annotations

import io
import json

import pydantic
import pytest
import structlog

from protocol.io import logs


class _Stream(io.StringIO):
    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.fixture
def stream():
    s = _Stream()
    yield s
    structlog.reset_defaults()  # later tests get structlog's own defaults back


def lines(stream: _Stream) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


SECRET = "-".join(("local", "value", "not", "logged"))  # never in a source line either


def failing_handler(secret_argument: str) -> None:
    try:
        raise LookupError("no such row")
    except LookupError as exc:
        raise RuntimeError("the store is gone") from exc


def test_an_exception_becomes_type_message_and_traceback(stream):
    logs.configure("json", "info", stream=stream)
    log = logs.get("mind")
    try:
        failing_handler(SECRET)
    except RuntimeError:
        log.exception("request_failed", req="q1")
    [line] = lines(stream)
    assert line["event"] == "request_failed" and line["level"] == "error" and line["req"] == "q1"
    assert line["exc_type"] == "RuntimeError" and line["exc_message"] == "the store is gone"
    tb = line["traceback"]
    assert tb.startswith("Traceback (most recent call last):") and tb.endswith("RuntimeError: the store is gone\n")
    assert "in failing_handler" in tb and "test_logs.py" in tb  # the frames, with file and function
    assert "LookupError: no such row" in tb and "direct cause" in tb  # the chain, as Python prints it
    assert "exc_info" not in line
    assert SECRET not in stream.getvalue()  # frames show code, never the values of local variables


def test_an_exception_passed_explicitly_and_an_audited_event_with_one(stream, tmp_path):
    audit = logs.AuditLog(tmp_path / "audit.jsonl")
    try:
        logs.configure("json", "info", stream=stream, audit=audit)
        err = ValueError("bad reload")
        logs.get("mind").error("config_reload_failed", exc_info=err)
    finally:
        audit.close()
    [line] = lines(stream)
    assert line["exc_type"] == "ValueError" and line["exc_message"] == "bad reload"
    [record] = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert record["exc_type"] == "ValueError"  # the audit line is the same line


def test_a_validation_error_is_described_without_its_input(stream):
    class Args(pydantic.BaseModel):
        count: int

    logs.configure("json", "info", stream=stream)
    try:
        Args.model_validate({"count": SECRET})
    except pydantic.ValidationError:
        logs.get("hand").exception("run_admission_failed")
    text = stream.getvalue()
    assert SECRET not in text
    [line] = lines(stream)
    assert line["exc_type"] == "pydantic_core._pydantic_core.ValidationError"
    assert "count" in line["exc_message"] and "integer" in line["exc_message"]


def test_the_daemons_redaction_applies_to_the_exception_text(stream, tmp_path):
    from hand.core.sanitize import Sanitizer

    root = tmp_path / "the-hand-root"
    root.mkdir()
    redact = Sanitizer(root, secrets=["a1b2c3-secret"], limit=1 << 20, other_paths=False)
    logs.configure("json", "info", stream=stream, redact=redact)
    try:
        raise OSError(f"cannot open {root}/x with a1b2c3-secret")
    except OSError:
        logs.get("hand").exception("task_crashed")
    text = stream.getvalue()
    assert str(root) not in text and "a1b2c3-secret" not in text
    [line] = lines(stream)
    assert line["exc_message"] == "cannot open ./x with <redacted>"
    assert __file__ in line["traceback"]  # source paths stay: they are the point of a traceback


def test_a_console_prints_the_traceback_below_the_line(stream):
    tty = _Stream(tty=True)
    logs.configure("console", "info", stream=tty)
    try:
        raise KeyError("k")
    except KeyError:
        logs.get("mind").exception("tick_failed")
    first, *rest = tty.getvalue().rstrip("\n").splitlines()
    assert "tick_failed" in first and "exc_type" in first
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "KeyError: 'k'"
