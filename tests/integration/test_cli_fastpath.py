"""`mind exec`'s fast path (mind/client/blocking.py): what it does not load, and that it refuses, verifies and
gives up exactly where the full client does."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mind.testing.cluster import running

pytestmark = pytest.mark.slow  # a real Mind and Hand, and `mind exec` in its own interpreter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("fastpath")) as cl:
        yield cl


def test_exec_loads_neither_asyncio_nor_websockets_nor_pydantic(c):
    code = (
        "import sys\n"
        "from mind.main import main\n"
        "try:\n"
        "    main(['exec', '--hand', 'box', '--', 'echo', 'hi'])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = [m for m in ('asyncio', 'websockets', 'pydantic', 'structlog', 'prometheus_client') if m in sys.modules]\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=c.env, capture_output=True, timeout=60)
    assert r.stdout == b"hi\n"
    assert r.stderr.strip() == b"0 []", r.stderr


def test_the_local_credential_admin_loads_no_message_model_nor_client_command(c, tmp_path):
    """`mind hand add` runs once per Hand a test or a script sets up: it reads and writes the
    credential store only, so it starts without pydantic's models or the client's commands."""
    code = (
        "import sys\n"
        "from mind.main import main\n"
        "try:\n"
        f"    main(['hand', 'add', 'lean', '--out', {str(tmp_path / 'lean.cred')!r}])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = [m for m in ('pydantic', 'protocol.messages', 'websockets', 'mind.client.aio', 'mind.cli.cp') if m in sys.modules]\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=c.env, capture_output=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == b"0 []", r.stderr
    assert (tmp_path / "lean.cred").read_text().startswith("mh1:hand:lean:")


@pytest.mark.parametrize(
    "args,why",
    [
        (["--hand", "bad name", "--", "true"], b"--hand wants"),
        (["--hand", "box", "--timeout", "25h", "--", "true"], b"at most 86400"),
        (["--hand", "box", "--timeout", "1e9", "--", "true"], b"'1e9' is not a duration"),
        (["--hand", "box", "--grace", "-1", "--", "true"], b"--grace"),
    ],
)
def test_bad_arguments_are_usage_errors_with_a_sentence(c, args, why):
    r = c.cli("exec", *args)
    assert r.returncode == 2 and why in r.stderr and b"Traceback" not in r.stderr


def test_exec_stays_fast_path_after_global_options(c):
    r = c.cli("--home", str(c.home), "exec", "--hand", "box", "--json", "--", "echo", "x")
    assert r.returncode == 0 and json.loads(r.stdout)["stdout"] == "x\n"


def test_tls_pin_and_ca_are_checked_by_exec_like_by_every_client(tmp_path):
    d = tmp_path / "certs"
    out = subprocess.run([str(ROOT / "scripts" / "mkcerts"), str(d)], capture_output=True, text=True, check=True).stdout
    pin = next(ln.split()[-1] for ln in out.splitlines() if ln.startswith("pin:"))
    other = tmp_path / "other"
    subprocess.run([str(ROOT / "scripts" / "mkcerts"), str(other)], capture_output=True, check=True)
    tls = ("--tls-cert", str(d / "mind.crt"), "--tls-key", str(d / "mind.key"))
    with running(tmp_path, hand=None, mind_args=tls) as cl:
        cl.start_hand("box", "--pin", pin)
        cl.wait_connected("box")
        run = ("exec", "--hand", "box", "--", "echo", "over tls")
        assert cl.cli(*run).stdout == b"over tls\n"  # the local CLI pins the daemon's own certificate
        assert cl.cli("exec", "--mind", cl.url, "--pin", pin, *run[1:]).stdout == b"over tls\n"
        assert cl.cli("exec", "--mind", cl.url, "--ca", str(d / "ca.crt"), *run[1:]).stdout == b"over tls\n"
        r = cl.cli("exec", "--mind", cl.url, "--pin", "sha256:" + "0" * 64, *run[1:])
        assert r.returncode == 125 and b"does not match the pinned" in r.stderr
        r = cl.cli("exec", "--mind", cl.url, "--ca", str(other / "ca.crt"), *run[1:])
        assert r.returncode == 125 and b"certificate verification" in r.stderr
        r = cl.cli("exec", "--mind", cl.url.replace("wss://", "ws://"), *run[1:])
        assert r.returncode == 125 and b"cannot reach" in r.stderr
        r = cl.cli("exec", "--mind", cl.url.replace("wss://", "ws://"), "--pin", pin, *run[1:])
        assert r.returncode == 125 and b"need a wss://" in r.stderr


def test_a_mind_that_vanishes_mid_run_leaves_the_outcome_unknown(tmp_path):
    with running(tmp_path) as cl:
        p = cl.cli_popen("exec", "--hand", "box", "--", "sh", "-c", "echo started; exec sleep 60")
        assert p.stdout.readline() == b"started\n"
        cl.mind.kill9()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 255 and b"unknown" in err


def test_a_frozen_mind_is_noticed_by_the_keepalive(tmp_path, monkeypatch, capsys):
    """In-process, with the keepalive shortened: the Mind freezes right after the run is sent (its
    TCP connection stays open, nothing answers); the ping timeout ends the wait with 255."""
    from mind.cli import execloop
    from mind.cli import main as cli
    from mind.cli.connection import connection_params
    from mind.client import blocking as link
    from mind.client.credentials import load_credential

    monkeypatch.setattr(link, "PING_INTERVAL_S", 0.2)
    monkeypatch.setattr(link, "PING_TIMEOUT_S", 0.5)
    with running(tmp_path) as cl:
        monkeypatch.setenv("MINDHAND_HOME", str(cl.home))
        args = cli.parse(["exec", "--hand", "box", "--", "sleep", "60"])
        url, cred_path, ca, pin = connection_params(args)
        lk = link.Link.connect(url, load_credential(cred_path), ca=ca, pin=pin)
        send = lk.send

        def send_then_freeze(msg, id_=None):
            send(msg, id_)
            cl.mind.signal(signal.SIGSTOP)

        lk.send = send_then_freeze
        try:
            code = execloop.ExecSession(lk, args).run("exec", {"argv": ["sleep", "60"]}, 60_000, None)
        finally:
            lk.abort()
            cl.mind.signal(signal.SIGCONT)
    assert code == 255
    assert "stopped answering" in capsys.readouterr().err


def test_a_poll_with_no_time_left_still_reads_what_arrived(tmp_path):
    """`Link.poll(0)` looks at the socket once. It returned before reading anything, so `mind exec
    --wait` (whose loop polls with 0 once its time has passed) re-attached after a cut of its leg
    and never heard the `attached`: the run, still there, was given up as unreachable (exit 255)."""
    from mind.client import blocking as link
    from mind.client import wire
    from mind.client.credentials import load_credential

    with running(tmp_path) as cl:
        lk = link.Link.connect(cl.url, load_credential(cl.client_credential()))
        try:
            asked = lk.request(wire.cancel_run(run_id="r0000000000000000"), "cancel_run_result")
            deadline = time.monotonic() + 10
            got = []
            while not got and time.monotonic() < deadline:
                got = [ev for ev in lk.poll(0) if ev.id == asked]
            assert got, "poll(0) never read the answer that had arrived"
        finally:
            lk.abort()
