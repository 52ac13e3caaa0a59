"""Security round 2 (issue 13, items 3, 11, 12, 14, 16, 17, 18, 19), each attack performed with real
processes: a `mind serve`, `hand run` agents (one as root with `--run-as` a throwaway user) and, for a
compromised machine, a fake Hand that speaks the real protocol (`protocol.auth.ClientHandshake`)."""

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect

from mind.client.aio import ClientError, MindClient, load_credential
from mind.testing.cluster import BIN, Proc, running, wait_until
from protocol import limits
from protocol.auth import ClientHandshake, Credential
from protocol.codes import ErrorCode, TaskCancelStatus
from protocol.envelope import Channel
from protocol.messages import (
    Challenge,
    HandClaims,
    TaskInfo,
    TaskInventory,
    TaskInventoryPage,
    TaskUpdate,
    Welcome,
)
from protocol.states import TaskState

pytestmark = pytest.mark.slow  # real Mind and Hand processes

DIGEST = "0" * 64


def add_client(cl, name: str, *flags: str, home: Path | None = None) -> Credential:
    path = cl.tmp / f"{name}-{uuid.uuid4().hex[:6]}.client.cred"
    env = dict(cl.env, MINDHAND_HOME=str(home)) if home else cl.env
    r = subprocess.run(
        [str(BIN / "mind"), "client", "add", name, "--out", str(path), *flags], env=env, capture_output=True
    )
    assert r.returncode == 0, r.stderr
    return load_credential(path)


def snapshot_count(home: Path, where: str = "1=1", *args: object) -> int:
    db = sqlite3.connect(f"file:{home / 'mind.db'}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(f"SELECT COUNT(*) FROM task_snapshots WHERE {where}", args).fetchone()[0]
    finally:
        db.close()


# --- a fake Hand on the real protocol ---------------------------------------------------------


async def fake_hand(url: str, cred: Credential, hostname: str = "fake") -> tuple[ClientConnection, Channel]:
    """A Hand's handshake with chosen claims; returns the welcomed connection."""
    ws = await connect(url, compression=None, max_size=limits.MAX_FRAME_BYTES, open_timeout=10)
    ch = Channel()
    claims = HandClaims(hostname=hostname, platform="Linux", machine="x", python="3", version="fake")
    hs = ClientHandshake(cred, os.urandom(limits.NONCE_BYTES), claims=claims)
    await ws.send(ch.stamp(hs.hello()))
    msg = ch.receive(await asyncio.wait_for(ws.recv(), 10)).msg
    assert isinstance(msg, Challenge), msg
    await ws.send(ch.stamp(hs.on_challenge(msg)))
    msg = ch.receive(await asyncio.wait_for(ws.recv(), 10)).msg
    assert isinstance(msg, Welcome), msg
    ch.gen = hs.on_welcome(msg)
    return ws, ch


def task_info(task_id: str) -> TaskInfo:
    return TaskInfo(
        task_id=task_id,
        tool="exec",
        state=TaskState.RUNNING,
        version=1,
        args_digest=DIGEST,
        binding_digest=DIGEST,
        max_runtime_ms=60_000,
        created_at=time.time(),
    )


# --- item 3: commands do not share the Hand's identity ------------------------------------------


@pytest.fixture
def throwaway_user():
    assert os.geteuid() == 0, "issue 13's identity tests run as root (CI runs them as root)"
    name = f"mh-run-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


def test_an_exec_client_cannot_read_the_hands_state_credential_or_environment(tmp_path, throwaway_user):
    """The attack: an `exec`-only client reads other clients' task logs in the state dir, the Hand's
    credential and `/proc/$PPID/environ`. With `--run-as`, each read is `Permission denied`."""
    work = Path(tempfile.mkdtemp(prefix="mh-work-"))  # outside root's 0700 pytest tree: the user can enter it
    try:
        shutil.chown(work, throwaway_user)
        os.chmod(work, 0o755)
        with running(tmp_path, hand=None) as cl:
            cred = cl.add_hand("box")
            cl.start_hand("box", "--run-as", throwaway_user, root=work)
            cl.wait_connected("box")
            assert (
                cl.cli("task", "start", "--hand", "box", "--id", "their-task", "--shell", "echo t0p-secret").returncode
                == 0
            )
            state = tmp_path / "state-box"
            wait_until(lambda: any(b"t0p-secret" in p.read_bytes() for p in state.rglob("*") if p.is_file()), 20, "log")
            task_log = next(p for p in state.rglob("*") if p.is_file() and b"t0p-secret" in p.read_bytes())
            hand_pid = cl.hands["box"].pid
            assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE(cred.stat().st_mode) == 0o600
            r = cl.cli("exec", "--hand", "box", "--", "id", "-u")
            assert r.returncode == 0 and int(r.stdout) != 0, r  # the command is not root, not the Hand
            for attack in (
                ["ls", str(state)],
                ["cat", str(task_log)],
                ["cat", str(state / "audit.jsonl")],
                ["cat", str(cred)],
                ["sh", "-c", "cat /proc/$PPID/environ"],
                ["cat", f"/proc/{hand_pid}/environ"],
            ):
                r = cl.cli("exec", "--hand", "box", "--", *attack)
                assert r.returncode != 0 and b"Permission denied" in r.stderr, (attack, r)
                assert b"t0p-secret" not in r.stdout and b"mh1:" not in r.stdout, attack
            assert "WARNING" not in cl.hands["box"].output()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_hand_without_run_as_says_an_exec_client_can_act_as_it(tmp_path):
    with running(tmp_path) as cl:
        out = cl.hands["box"].output()
        assert "hand: WARNING: commands run as this Hand's own user" in out and "act as this Hand" in out
        events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        assert any(e["event"] == "commands_share_hand_identity" and e["level"] == "warning" for e in events)


# --- item 14: no token on argv --------------------------------------------------------------


def test_a_token_on_argv_is_refused_and_the_environment_still_works(tmp_path):
    with running(tmp_path, hand=None) as cl:
        token = cl.add_hand("box").read_text().strip()
        argv = [str(BIN / "hand"), "run", "--mind", cl.url, "--root", str(tmp_path), "--state-dir", str(tmp_path / "s")]
        r = subprocess.run([*argv, "--credential", token], env=cl.env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "--credential takes a file, not the token itself" in r.stderr, r.stderr
        assert token.rsplit(":", 1)[1] not in r.stderr + r.stdout
        hand = Proc(
            "hand-env", [*argv, "--log-format", "json"], dict(cl.env, MINDHAND_CREDENTIAL=token), tmp_path / "h.log"
        )
        cl.procs.append(hand)
        cl.wait_connected("box")
        r = cl.cli("exec", "--hand", "box", "--", "env")
        assert r.returncode == 0 and b"MINDHAND_" not in r.stdout and token.encode() not in r.stdout


def test_a_token_from_the_environment_leaves_the_hands_environment_once_read(tmp_path):
    """`hand run` in a real process, its agent replaced by a probe of `os.environ` at the moment the
    agent would start (children and anything spawned later inherit from there)."""
    probe = (
        "import os, sys\n"
        "import hand.aio.agent as agent\n"
        "async def probe(config, **kw):\n"
        "    print('still there' if 'MINDHAND_CREDENTIAL' in os.environ else 'scrubbed', config.credential.label)\n"
        "    return 0\n"
        "agent.run_agent = probe\n"
        "from hand.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    token = Credential(role="hand", label="envhand", secret=os.urandom(32)).token()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    env["MINDHAND_CREDENTIAL"] = token
    argv = ["run", "--mind", "ws://127.0.0.1:9", "--root", str(tmp_path), "--state-dir", str(tmp_path / "s")]
    r = subprocess.run([str(BIN / "python"), "-c", probe, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].split() == ["scrubbed", "envhand"], (r.stdout, r.stderr)


# --- item 19: MINDHAND_* in a request's env ----------------------------------------------------


def test_a_request_may_not_set_a_mindhand_variable(tmp_path):
    with running(tmp_path) as cl:
        r = cl.cli("exec", "--hand", "box", "--env", "MINDHAND_X=1", "--", "sh", "-c", "echo x=$MINDHAND_X")
        assert r.returncode == 125 and b"invalid_request" in r.stderr and b"x=1" not in r.stdout, r
        assert cl.cli("exec", "--hand", "box", "--env", "OTHER_X=1", "--", "true").returncode == 0


# --- item 16: Hand claims are shown escaped ------------------------------------------------------


async def test_a_hands_escape_sequences_never_reach_the_operators_terminal(tmp_path):
    evil = "box\x1b]0;pwned\x07\x1b[2J"
    with running(tmp_path, hand=None) as cl:
        cl.add_hand("evil")
        ws, _ = await fake_hand(cl.url, load_credential(tmp_path / "evil.cred"), hostname=evil)
        try:
            r = cl.cli("hands")
            assert r.returncode == 0 and b"\x1b" not in r.stdout and b"\x07" not in r.stdout, r.stdout
            assert b"box\\x1b]0;pwned\\x07\\x1b[2J" in r.stdout
            raw = json.loads(cl.cli("hands", "--json").stdout)  # JSON keeps the exact claim, JSON-escaped
            assert next(h for h in raw if h["name"] == "evil")["claims"]["hostname"] == evil
        finally:
            await ws.close()


def test_printable_escapes_every_control_character_and_keeps_the_rest():
    from mind.cli.formatting import printable

    assert printable("héllo wörld ✓") == "héllo wörld ✓"
    assert printable("a\x1b]0;x\x07b\x7f\x9b\nc\td") == "a\\x1b]0;x\\x07b\\x7f\\x9b\\nc\\td"
    assert all(not (ord(c) < 32 or 0x7F <= ord(c) <= 0x9F) for c in printable("".join(map(chr, range(0xA0)))))


# --- item 11: a hostile Hand --------------------------------------------------------------------


async def test_a_hostile_hand_neither_grows_the_minds_database_nor_keeps_the_pass_open(tmp_path):
    """Endless inventory pages (never "last page") and a flood of unsolicited `task_update`s: the pass
    ends at its bound with nothing applied, and no unsolicited id is adopted."""
    with running(tmp_path, hand=None) as cl:
        cl.add_hand("evil")
        ws, ch = await fake_hand(cl.url, load_credential(tmp_path / "evil.cred"))
        pages = 0
        try:
            for i in range(3000):  # before the pass even asks: ids nobody asked about
                await ws.send(ch.stamp(TaskUpdate(task=task_info(f"squat-{i:05d}"))))
            async with asyncio.timeout(120):
                while "reconcile_aborted" not in cl.mind.output():
                    try:
                        env = ch.receive(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    if isinstance(env.msg, TaskInventory):
                        pages += 1
                        ids = [f"inv-{pages:04d}-{j:04d}" for j in range(env.msg.limit)]
                        page = TaskInventoryPage(tasks=[task_info(t) for t in ids], next_after=ids[-1])
                        await ws.send(ch.stamp(page, env.id))
        finally:
            await ws.close()
        log = [json.loads(ln) for ln in cl.mind.output().splitlines() if ln.startswith("{")]
        aborted = next(e for e in log if e["event"] == "reconcile_aborted")
        assert aborted["error"] == "too_many_tasks" and aborted["tasks"] <= 21_000, aborted
        assert pages <= 21
        assert snapshot_count(cl.home) == 0  # neither the squatted ids nor the endless inventory
        assert any(e["event"] == "task_update_unsolicited" for e in log)
        # the squatted ids are free for a real client
        cl.add_hand("box")
        cl.start_hand("box")
        cl.wait_connected("box")
        r = cl.cli("task", "start", "--hand", "box", "--id", "squat-00001", "--shell", "true")
        assert r.returncode == 0, r.stderr
        audit = [json.loads(ln) for ln in (cl.home / "audit.jsonl").read_text().splitlines()]
        unsolicited = [a for a in audit if a["event"] == "task_update_unsolicited"]
        assert 1 <= len(unsolicited) <= 11  # 3,000 pushes: the burst, then one counted line at most


def test_reconciliation_adopts_within_the_hands_quota(tmp_path):
    from mind.store.snapshots import SnapshotStore

    store = SnapshotStore(tmp_path / "m.db")
    rows = {f"t{i}": task_info(f"t{i}") for i in range(5)}
    plan = store.reconcile("h", rows, time.time(), None, 3)
    assert len(plan.adopted) == 3 and plan.over_quota == 2
    assert len(store.reconcile("h", rows, time.time(), None, 3).adopted) == 0  # the quota is full


# --- item 12: audit volume and rotation ------------------------------------------------------


async def test_a_refusal_flood_writes_a_bounded_audit_and_the_file_follows_rotation(tmp_path):
    with running(tmp_path, hand=None) as cl:
        audit = cl.home / "audit.jsonl"
        wait_until(audit.exists, 10, "the audit file")
        audit.rename(tmp_path / "audit.jsonl.1")  # logrotate's move ...
        cl.mind.signal(signal.SIGHUP)  # ... and its postrotate
        await asyncio.sleep(1.2)
        assert cl.cli("hands").returncode == 0
        wait_until(audit.exists, 10, "a new audit file")
        assert '"handshake_ok"' in audit.read_text()
        assert '"handshake_ok"' not in (tmp_path / "audit.jsonl.1").read_text()
        stranger = Credential(role="client", label="stranger", secret=os.urandom(32))

        async def refused() -> None:
            with pytest.raises((ClientError, OSError)):
                await MindClient.connect(cl.url, stranger)

        for _ in range(6):  # a failed handshake is answered after a pause: 50 at a time
            await asyncio.gather(*(refused() for _ in range(50)))
        refusals = [json.loads(ln) for ln in audit.read_text().splitlines()]
        refusals = [r for r in refusals if r["event"] in ("handshake_failed", "handshake_refused")]
        assert len(refusals) <= 60, len(refusals)  # 300 refusals: at most 10 per (event, peer, why)
        cl.mind.stop()  # the counts not yet written are written at exit
        text = audit.read_text()
        counted = [json.loads(ln) for ln in text.splitlines() if '"repeated"' in ln]
        assert counted and sum(c["repeated"] for c in counted) + len(refusals) >= 300, counted
        assert all(c["peer"] == "127.0.0.1" and c["first"] and c["last"] for c in counted)


def test_audit_repeats_are_counted_per_interval(tmp_path, monkeypatch):
    from protocol.io import logs

    monkeypatch.setattr(logs, "AUDIT_INTERVAL_S", 0.0)
    a = logs.AuditLog(tmp_path / "a.jsonl")
    for i in range(25):
        a.write({"event": "handshake_failed", "peer": "10.0.0.1", "code": "auth_failed", "timestamp": str(i)})
    a.write({"event": "run_admitted", "client": "x"})  # never aggregated
    a._swept = 0.0
    time.sleep(0.01)
    a.write({"event": "run_admitted", "client": "y"})  # the sweep after the interval writes the count
    a.close()
    lines = [json.loads(ln) for ln in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [ln["event"] for ln in lines].count("handshake_failed") == 11
    count = next(ln for ln in lines if "repeated" in ln)
    assert count["repeated"] == 15 and count["first"] == "10" and count["last"] == "24"


# --- item 17: ids across scopes --------------------------------------------------------------


async def test_a_task_id_outside_a_clients_scope_reads_as_taken_or_unknown(tmp_path):
    with running(tmp_path) as cl:
        cl.add_hand("web-1")
        cl.start_hand("web-1")
        cl.wait_connected("web-1")
        web = add_client(cl, "web", "--hands", "web-*", "--tools", "exec,shell")
        box = add_client(cl, "boxer", "--hands", "box", "--tools", "exec,shell")
        async with await MindClient.connect(cl.url, box) as mc:
            res = await mc.task_start("box", "exec", {"argv": ["true"]}, task_id="deploy-1")
            assert res.outcome == "accepted"
            own_conflict = await mc.task_start("box", "exec", {"argv": ["false"]}, task_id="deploy-1")
        async with await MindClient.connect(cl.url, web) as mc:
            taken = await mc.task_start("web-1", "exec", {"argv": ["true"]}, task_id="deploy-1")
            assert (taken.outcome, taken.reject_code, taken.message) == (
                own_conflict.outcome,
                own_conflict.reject_code,
                own_conflict.message,
            )  # exactly what the owner hears for a conflict: "taken", not where or whose
            assert "box" not in taken.message
            with pytest.raises(ClientError) as err:
                await mc.task_get("deploy-1")
            assert err.value.code == ErrorCode.UNKNOWN_TASK.value  # the same as an id nobody holds
            with pytest.raises(ClientError) as err:
                await mc.task_get("no-such-id")
            assert err.value.code == ErrorCode.UNKNOWN_TASK.value
            assert (await mc.task_cancel("deploy-1")).status is TaskCancelStatus.UNKNOWN_TASK
        audit = (cl.home / "audit.jsonl").read_text()
        assert '"denied_by_scope"' in audit and "reuse task id deploy-1" in audit  # still audited


# --- item 18: full scope is stored, not a name -------------------------------------------------


async def test_a_client_named_admin_gets_the_scope_it_was_created_with(tmp_path):
    with running(tmp_path) as cl:
        assert cl.cli("client", "revoke", "admin").returncode == 0
        scoped = add_client(cl, "admin", "--hands", "web-*")
        rows = json.loads(cl.cli("client", "list", "--json").stdout)
        assert next(r for r in rows if r["label"] == "admin")["scope"].startswith("hands web-*"), rows
        async with await MindClient.connect(cl.url, scoped) as mc:
            assert await mc.hands() == []  # box is outside web-*
            end = await mc.exec("box", "exec", {"argv": ["true"]})
            assert end.reject_code.value == "denied_by_scope"


# --- item 19: status is scoped ---------------------------------------------------------------


async def test_status_counts_only_the_tasks_a_scoped_client_may_see(tmp_path):
    with running(tmp_path) as cl:
        for i in range(3):
            assert cl.cli("task", "start", "--hand", "box", "--id", f"a-{i}", "--shell", "true").returncode == 0
        other = add_client(cl, "other", "--hands", "web-*")
        async with await MindClient.connect(cl.url, other) as mc:
            st = await mc.status()
            assert st.task_counts == {} and st.stale_snapshots == 0
        async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:
            assert sum((await mc.status()).task_counts.values()) == 3
