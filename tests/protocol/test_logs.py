"""A logged exception carries its type, message and traceback as JSON fields (`exc_type`,
`exc_message`, `traceback`), never local variables, a pydantic error's input, or what the daemon
redacts (the Hand: its root and its secret)."""

from __future__ import annotations

import io
import json
import os

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


# --- a sink that cannot write (a full disk) -------------------------------------------------------


@pytest.fixture
def dropped(monkeypatch):
    """A fresh count of dropped lines for the test (the process's own is module-wide)."""
    fresh = logs.Dropped()
    monkeypatch.setattr(logs, "DROPPED", fresh)
    return fresh


def test_an_audit_file_on_a_full_disk_drops_its_lines_and_says_so_once(stream, tmp_path, dropped):
    """A Hand whose state disk filled exited 1: the audit line of a run's end raised ENOSPC out of
    the code that logged it. Now the line is counted and dropped (the console still shows it); one
    error when the failures start, one warning with the count when a line goes through again, and
    the file holds only whole lines. (`/dev/full` answers every write with ENOSPC.)"""
    from protocol.audit import AuditEvent

    audit = logs.AuditLog(tmp_path / "audit.jsonl")
    audit._follow = lambda now: None  # type: ignore[method-assign]  # (no rotation: the descriptor is swapped)
    real, full = audit._fd, os.open("/dev/full", os.O_WRONLY)
    try:
        logs.configure("json", "info", stream=stream, audit=audit)
        log = logs.get("hand")
        audit._fd = full
        for i in range(3):
            log.info(AuditEvent.RUN_TERMINAL, run_id=f"r{i}", state="succeeded")  # never raises
        assert dropped.counts == {"audit": 3} and dropped.failing("audit")
        audit._fd = real
        log.info(AuditEvent.RUN_TERMINAL, run_id="r3", state="succeeded")
    finally:
        audit._fd = real
        audit.close()
        os.close(full)
    shown = lines(stream)
    assert [(e["event"], e.get("run_id")) for e in shown] == [
        ("log_writes_failing", None),
        ("run_terminal", "r0"),
        ("run_terminal", "r1"),
        ("run_terminal", "r2"),
        ("log_writes_recovered", None),
        ("run_terminal", "r3"),
    ]
    failing, recovered = shown[0], shown[4]
    assert failing["level"] == "error" and failing["sink"] == "audit" and failing["error"].startswith("ENOSPC")
    assert recovered["level"] == "warning" and recovered["dropped"] == 3
    assert dropped.counts == {"audit": 3} and not dropped.failing("audit")
    written = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["run_id"] for e in written] == ["r3"]


def test_a_line_the_disk_cut_short_does_not_swallow_the_next(tmp_path, dropped):
    """A write that stopped part way leaves a partial line: the next one starts on a line of its
    own, so every line written whole is still one JSON line."""
    audit = logs.AuditLog(tmp_path / "audit.jsonl")
    try:
        os.write(audit._fd, b'{"event": "cut sh')  # what a disk that filled mid-line leaves
        audit._torn = True
        audit.write({"event": "run_terminal", "run_id": "r1"})
    finally:
        audit.close()
    *_, last = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert json.loads(last) == {"event": "run_terminal", "run_id": "r1"}


def test_a_console_on_a_full_disk_drops_its_lines_and_says_so_once(tmp_path, dropped, capfd):
    """A `--log-file` (or stdout) on a full disk: the line is counted and dropped, never raised;
    the failures are told once on stderr (the console itself cannot take it), and when a line
    goes through again the console says how many were dropped. Nothing refused is written later:
    each line is one write of its own, never kept in a buffer."""
    path = tmp_path / "hand.log"
    console = open(path, "w")
    keep, full = os.dup(console.fileno()), os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, console.fileno())  # the console's file descriptor now answers ENOSPC
        logs.configure("json", "info", stream=console)
        log = logs.get("hand")
        log.info("lost_one")
        log.warning("lost_two")
        assert dropped.counts == {"log": 2}
        os.dup2(keep, console.fileno())  # room again
        log.info("kept")
    finally:
        structlog.reset_defaults()
        console.close()
        os.close(keep)
        os.close(full)
    shown = [json.loads(x) for x in path.read_text().splitlines()]
    assert [e["event"] for e in shown] == ["kept", "log_writes_recovered"]
    assert shown[1]["sink"] == "log" and shown[1]["dropped"] == 2
    told = [json.loads(x) for x in capfd.readouterr().err.splitlines() if x.startswith("{")]
    assert [(e["event"], e["sink"]) for e in told] == [("log_writes_failing", "log")]
    assert told[0]["error"].startswith("ENOSPC")
