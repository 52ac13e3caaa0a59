"""Every refusal the README names is audited on the side that decides it, with its reason, and no
audit line carries a raw argument or a secret. Real processes: a Mind and a Hand on loopback, each
refusal provoked through the CLI or `MindClient`, then the deciding side's `audit.jsonl` read back
(the Mind's in its home, the Hand's in its state dir)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from mind.client.aio import ClientError, MindClient, load_credential
from mind.testing.cluster import running, wait_until
from protocol.auth import Credential
from protocol.codes import ErrorCode

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARK = "raw-arg-" + secrets.token_hex(6)
"""Put in the arguments of every refused request: it must reach no audit line."""


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def audited(path: Path, event: str, explained: bool = True, **fields: Any) -> dict[str, Any]:
    """The first record of `event` with these fields (waited for: a Hand's line may land a moment after
    the CLI returned); a refusal must say why (`reason`, `what` or `why`)."""

    def find() -> dict[str, Any] | None:
        for r in records(path):
            if r["event"] == event and all(r.get(k) == v for k, v in fields.items()):
                return r
        return None

    found = wait_until(find, 10, f"{event} {fields} in {path.name}")
    assert not explained or any(found.get(k) for k in ("reason", "what", "why")), found
    return found


def add_client(cl, name: str, *flags: str) -> tuple[Path, Credential]:
    path = cl.tmp / f"{name}.client.cred"
    r = cl.cli("client", "add", name, "--out", str(path), *flags)
    assert r.returncode == 0, r.stderr
    return path, load_credential(path)


def refused(cl, *args: str) -> subprocess.CompletedProcess:
    r = cl.cli(*args)
    assert r.returncode == 125, (args, r.returncode, r.stdout, r.stderr)
    return r


async def test_every_refusal_is_audited_where_it_is_decided(tmp_path):
    hand_flags = ("--deny-tools", "shell", "--max-cpu-seconds", "5", "--max-retained-tasks", "1")
    mind_flags = ("--auth-fail-limit", "4", "--max-pending-handshakes", "1")
    with running(tmp_path, "box", *hand_flags, mind_args=mind_flags) as cl:
        mind_audit, hand_audit = cl.home / "audit.jsonl", tmp_path / "state-box" / "audit.jsonl"
        assert cl.cli("hand", "add", "gone").returncode == 0  # known, never connected
        narrow_file, narrow = add_client(cl, "narrow", "--hands", "box", "--tools", "exec")
        admin = load_credential(cl.home / "admin.cred")

        # --- decided by the Hand: its policy, its paths, its caps, its tools, its task quota ---
        refused(cl, "exec", "--hand", "box", "--shell", f"echo {MARK}")
        audited(hand_audit, "run_rejected", code="denied_by_policy")
        refused(cl, "call", "--hand", "box", "read_file", "path=../escape")
        audited(hand_audit, "run_rejected", code="path_outside_root")
        refused(cl, "exec", "--hand", "box", "--cpu-seconds", "100", "--", "echo", MARK)
        over_cap = audited(hand_audit, "run_rejected", code="invalid_request")
        assert "cap" in over_cap["reason"]
        async with await MindClient.connect(cl.url, admin) as mc:
            end = await mc.exec("box", "no_such_tool", {"x": MARK})
            assert end.reject_code is not None and end.reject_code.value == "unknown_tool"
        audited(hand_audit, "run_rejected", code="unknown_tool")
        r = cl.cli("task", "start", "--hand", "box", "--id", "t-first", "--", "echo", MARK)
        assert r.returncode == 0, r.stderr
        refused(cl, "task", "start", "--hand", "box", "--id", "t-quota", "--", "echo", MARK)
        audited(hand_audit, "task_start_rejected", code="quota_exceeded")  # was never audited (`task_rejected`)
        audited(mind_audit, "task_start_ended", task_id="t-quota", outcome="rejected", reject_code="quota_exceeded")
        refused(cl, "task", "start", "--hand", "box", "--id", "t-shell", "--shell", f"echo {MARK}")
        audited(hand_audit, "task_start_rejected", code="denied_by_policy")
        refused(cl, "task", "start", "--hand", "box", "--id", "t-cap", "--cpu-seconds", "100", "--", "echo", MARK)
        audited(hand_audit, "task_start_rejected", code="invalid_request")

        # --- decided by the Mind: unknown and offline Hands, scopes, conflicting task ids ---
        refused(cl, "exec", "--hand", "nobody", "--", "echo", MARK)
        audited(mind_audit, "run_terminal", state="rejected", reject_code="unknown_hand")
        refused(cl, "exec", "--hand", "gone", "--", "echo", MARK)
        audited(mind_audit, "run_terminal", state="rejected", reject_code="hand_offline")
        refused(cl, "task", "start", "--hand", "nobody", "--", "echo", MARK)
        audited(mind_audit, "task_start_rejected", code="unknown_hand", client="admin")
        refused(cl, "task", "start", "--hand", "gone", "--", "echo", MARK)
        audited(mind_audit, "task_start_rejected", code="hand_offline", client="admin")
        refused(cl, "task", "start", "--hand", "box", "--id", "t-first", "--", "echo", MARK, "again")
        audited(mind_audit, "task_start_rejected", task_id="t-first", code="conflicting_duplicate")
        r = cl.cli("task", "start", "--hand", "box", "--id", "t-first", "--", "echo", MARK)
        assert r.returncode == 0, r.stderr  # the same start again: answered as a duplicate, nothing ran
        audited(mind_audit, "task_start_duplicate", explained=False, task_id="t-first", client="admin")
        as_narrow = ("--credential", str(narrow_file))
        refused(cl, "exec", *as_narrow, "--hand", "gone", "--", "echo", MARK)  # a Hand outside its scope
        refused(cl, "call", *as_narrow, "--hand", "box", "read_file", f"path={MARK}")  # a tool outside it
        refused(cl, "task", "start", *as_narrow, "--hand", "box", "--shell", f"echo {MARK}")
        audited(mind_audit, "denied_by_scope", client="narrow", hand="gone")
        audited(mind_audit, "run_terminal", state="rejected", reject_code="denied_by_scope", client="narrow")
        audited(mind_audit, "task_start_rejected", code="denied_by_scope", client="narrow")
        async with await MindClient.connect(cl.url, admin) as mc:
            theirs = await mc.exec("box", "list_dir", {"path": "."})
        async with await MindClient.connect(cl.url, narrow) as mc:
            with pytest.raises(ClientError) as err:
                await mc.get_run(theirs.run_id)
            assert err.value.code == ErrorCode.DENIED_BY_SCOPE.value
        audited(mind_audit, "denied_by_scope", client="narrow", run_id=theirs.run_id)

        # --- who got in: revoked credentials, failed and refused handshakes ---
        bot_file, bot = add_client(cl, "bot")
        mc = await MindClient.connect(cl.url, bot)
        await mc.hands()
        r = await asyncio.to_thread(cl.cli, "client", "revoke", "bot")
        assert r.returncode == 0, r.stderr
        by_cli = "local admin (mind CLI)"
        audited(mind_audit, "credential_changed", explained=False, label="bot", action="revoke", by=by_cli)
        audited(mind_audit, "credential_closed", label="bot", why="revoked")
        await mc.close()
        with pytest.raises(ClientError):
            await MindClient.connect(cl.url, bot)  # failure 1 from this address
        for cred in (  # failures 2 and 3: a wrong secret, and a name nobody knows, fail alike
            Credential(role="client", label="admin", secret=os.urandom(32)),
            Credential(role="client", label="stranger", secret=os.urandom(32)),
        ):
            with pytest.raises(ClientError) as err:
                await MindClient.connect(cl.url, cred)
            assert err.value.code == ErrorCode.AUTH_FAILED.value
        failed = [r for r in records(mind_audit) if r["event"] == "handshake_failed"]
        assert len(failed) >= 3 and all(r["code"] == "auth_failed" and r["reason"] for r in failed)
        silent = await connect(cl.url, compression=None)  # holds the one handshake slot, says nothing
        try:
            async with connect(cl.url, compression=None):  # a newcomer: the silent one makes room (issue 23)
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(silent.recv(), 10)
                assert silent.close_code == 1013  # try later
        finally:
            await silent.close()
        audited(mind_audit, "handshake_refused", why="evicted")
        with pytest.raises(ClientError):  # failure 4
            await MindClient.connect(cl.url, bot)
        with pytest.raises(ClientError) as err:  # limited now: a failure from this address is told so
            await MindClient.connect(cl.url, bot)
        assert err.value.code == ErrorCode.RATE_LIMITED.value
        audited(mind_audit, "handshake_refused", why="rate_limited")
        async with await MindClient.connect(cl.url, admin) as mc:  # the right secret still gets in (issue 13)
            await mc.hands()

        secret_hexes = [c.secret.hex() for c in (admin, narrow, bot)]
        secret_hexes.append(load_credential(tmp_path / "box.cred").secret.hex())
        for path in (mind_audit, hand_audit):
            text = path.read_text()
            assert MARK not in text, f"a raw argument reached {path}"
            for s in secret_hexes:
                assert s not in text, f"a credential secret reached {path}"


def test_a_hand_audits_a_mind_that_fails_verification(tmp_path):
    """The Hand decides whether the Mind is the one it trusts (its pin) before using its credential."""
    certs = tmp_path / "certs"
    subprocess.run([str(ROOT / "scripts" / "mkcerts"), str(certs)], capture_output=True, check=True)
    tls = ("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
    with running(tmp_path, hand=None, mind_args=tls) as cl:
        hand = cl.start_hand("box", "--pin", "sha256:" + "0" * 64)
        record = audited(tmp_path / "state-box" / "audit.jsonl", "handshake_failed", code="auth_failed")
        assert "pinned" in record["reason"] and hand.p.wait(timeout=15) == 2  # said once, not retried
