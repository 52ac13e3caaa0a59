"""A scoped client's refusals aggregate per (client, what) in the audit file and on the console
(issue 23, attack 6), as strangers' handshake refusals already do."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from protocol.audit import AuditEvent
from protocol.io import logs


@pytest.fixture
def stream():
    s = io.StringIO()
    yield s
    structlog.reset_defaults()


def test_denials_are_written_a_burst_per_client_and_what_then_counted(stream, tmp_path):
    audit = logs.AuditLog(tmp_path / "audit.log")
    logs.configure("json", "info", stream=stream, audit=audit)
    log = structlog.get_logger(component="mind")
    for _ in range(1000):
        log.warning(AuditEvent.DENIED_BY_SCOPE, client="ci", what="use hand 'db1'", hand="db1")
    for _ in range(3):
        log.warning(AuditEvent.DENIED_BY_SCOPE, client="ci", what="use tool 'exec'", tool="exec")
    log.warning(AuditEvent.DENIED_BY_SCOPE, client="other", what="use hand 'db1'", hand="db1")
    audit.close()
    written = [json.loads(ln) for ln in (tmp_path / "audit.log").read_text().splitlines()]
    per = {}
    for rec in written:
        per.setdefault((rec["client"], rec["what"]), []).append(rec)
    assert len(per[("ci", "use hand 'db1'")]) == logs.AUDIT_BURST + 1
    assert per[("ci", "use hand 'db1'")][-1]["repeated"] == 1000 - logs.AUDIT_BURST
    assert len(per[("ci", "use tool 'exec'")]) == 3, "another refusal of the same client is its own key"
    assert len(per[("other", "use hand 'db1'")]) == 1, "another client is not hidden by the first"
    console = stream.getvalue().splitlines()
    assert len(console) == logs.AUDIT_BURST + 3 + 1, "the console skips the counted repeats too"


def test_runs_refused_before_running_are_counted_but_runs_that_ended_are_all_written(stream, tmp_path):
    audit = logs.AuditLog(tmp_path / "audit.log")
    logs.configure("json", "info", stream=stream, audit=audit)
    log = structlog.get_logger(component="mind")
    for i in range(100):
        log.info(
            AuditEvent.RUN_TERMINAL,
            run_id=f"r{i}",
            client="ci",
            hand="db1",
            tool="exec",
            state="rejected",
            reject_code="denied_by_scope",
        )
        log.info(AuditEvent.RUN_TERMINAL, run_id=f"s{i}", client="ci", hand="db1", tool="exec", state="failed")
    audit.close()
    written = [json.loads(ln) for ln in (tmp_path / "audit.log").read_text().splitlines()]
    assert sum(1 for r in written if r.get("state") == "failed") == 100, "every run that ran is on record"
    refused = [r for r in written if r.get("state") == "rejected" or r.get("repeated")]
    assert len(refused) == logs.AUDIT_BURST + 1 and refused[-1]["repeated"] == 100 - logs.AUDIT_BURST
