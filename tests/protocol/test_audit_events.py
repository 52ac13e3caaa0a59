"""Audit events are one enum for both sides (`protocol.audit.AuditEvent`), used at every call site
that logs one, and each of them is logged somewhere: an allow-list naming an event nobody logs
(the old `task_rejected`, while the Hand logged `task_start_rejected`) cannot come back."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import structlog
from support.sources import python_files
from support.sources import tree as parsed

from protocol.audit import AUDITED, AuditEvent
from protocol.io import logs

pytestmark = pytest.mark.xdist_group("sources")  # `scripts/test --fast`: one worker parses the sources

ROOT = Path(__file__).resolve().parents[2]
LOG_METHODS = {"debug", "info", "msg", "warning", "warn", "error", "exception", "critical"}


def sources() -> list[tuple[Path, ast.Module]]:
    return [(p, parsed(p)) for p in python_files("protocol", "mind", "hand")]


def test_no_audited_event_is_logged_by_its_string():
    """A string at a log call could be misspelt and silently never audited; the enum cannot."""
    found = []
    for path, tree in sources():
        for node in ast.walk(tree):
            literal = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in LOG_METHODS or name in ("Log", "_log"):
                    literal = node.args[0].value
            elif isinstance(node, ast.Dict):  # an audit record written directly: {"event": ...}
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "event" and isinstance(value, ast.Constant):
                        literal = value.value
            if isinstance(literal, str) and literal in AUDITED:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {literal!r}")
    assert found == [], "use protocol.audit.AuditEvent at these call sites"


def test_every_audit_event_is_logged_somewhere():
    used = {
        node.attr
        for _, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "AuditEvent"
    }
    assert sorted(e.name for e in AuditEvent if e.name not in used) == []


def test_the_hands_refused_task_start_is_the_event_the_audit_receives():
    assert AuditEvent.TASK_START_REJECTED == "task_start_rejected" and "task_rejected" not in AUDITED


def test_audited_events_reach_the_audit_file_whatever_the_console_level(tmp_path):
    audit = logs.AuditLog(tmp_path / "audit.jsonl")
    console = tmp_path / "console.log"
    try:
        with console.open("w") as stream:
            logs.configure("json", "error", stream=stream, audit=audit)
            log = logs.get("hand")
            log.info(AuditEvent.TASK_START_REJECTED, task_id="t1", code="quota_exceeded", reason="full")
            log.info("task_running", task_id="t1")  # not audited, and below the console's level
            log.error(AuditEvent.CONFIG_RELOAD_FAILED, file="x.toml")
    finally:
        audit.close()
        structlog.reset_defaults()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["task_start_rejected", "config_reload_failed"]
    assert records[0]["code"] == "quota_exceeded" and records[0]["reason"] == "full"
    assert [json.loads(line)["event"] for line in console.read_text().splitlines()] == ["config_reload_failed"]
