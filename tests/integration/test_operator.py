"""What a new operator trips on when following the README (issue 14, items 6-11), with real processes:
`scripts/mkcerts` for a service user, a Hand given the wrong CA file, `hand add --out` to a place it
cannot write, `--json` when the Mind is unreachable, and "did you mean" for a Hand's name."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from mind.client.credentials import load_credential
from mind.testing.cluster import BIN, Cluster, running, wait_until

pytestmark = pytest.mark.slow  # real Minds, Hands, CLIs and scripts/mkcerts

ROOT = Path(__file__).resolve().parents[2]


def mkcerts(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "mkcerts"), *args, str(d)], capture_output=True, text=True)


def free_port() -> int:
    """A port nobody listens on: bound, then closed (loopback, no one else binds it meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- item 7: a leaf given as the CA, and configuration errors that cannot heal ------------------


def test_a_hand_given_the_minds_own_certificate_as_ca_says_so_once_and_exits_2(tmp_path):
    certs = tmp_path / "certs"
    assert mkcerts(certs).returncode == 0
    tls = ("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
    with running(tmp_path, hand=None, mind_args=tls) as cl:
        hand = cl.start_hand("box", "--ca", str(certs / "mind.crt"))
        wait_until(lambda: not hand.alive(), 30, "the Hand to give up")
        assert hand.p.returncode == 2
        out = hand.output()
        assert out.count("not retrying") == 1, out
        assert "holds no CA certificate, only a leaf" in out and "DIR/ca.crt" in out, out
        assert '"event":"hand_config_error"' in out.replace(" ", "")
        # a CA file that holds no certificate at all is refused before any dial, exit 2 as well
        junk = tmp_path / "junk.crt"
        junk.write_text("not a certificate\n")
        bad = cl.start_hand("box", "--ca", str(junk))
        assert bad.p.wait(timeout=30) == 2 and "cannot load CA file" in bad.output()
        # the right file works, and the same Hand name connects
        cl.start_hand("box", "--ca", str(certs / "ca.crt"))
        cl.wait_connected("box")


def test_a_hand_whose_credential_the_mind_refuses_exits_2_but_an_absent_mind_is_retried(tmp_path):
    with running(tmp_path) as cl:
        hand = cl.hands["box"]
        assert cl.cli("hand", "revoke", "box").returncode == 0
        wait_until(lambda: not hand.alive(), 30, "the revoked Hand to give up")
        assert hand.p.returncode == 2
        out = hand.output()
        assert out.count("not retrying") == 1 and "refused this Hand's credential (auth_failed" in out, out
        # Connection refused is transient: the Hand keeps trying (backoff), alive.
        cred = cl.add_hand("later")
        lonely = cl.start_hand("later", cred=cred, url=f"ws://127.0.0.1:{free_port()}")
        wait_until(lambda: lonely.output().count('"reconnect_wait"') >= 3, 30, "three reconnect waits")
        assert lonely.alive() and "not retrying" not in lonely.output()


# --- item 6: mkcerts for the service user --------------------------------------------------------


@pytest.fixture
def service_user(as_root):
    name = f"mh-svc-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", name], check=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)
        subprocess.run(["groupdel", name], capture_output=True, timeout=30)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_mkcerts_owner_lets_the_service_user_serve_tls_and_keeps_the_ca_key_apart(tmp_path, service_user):
    """README: `scripts/mkcerts --owner mindhand /etc/mindhand HOST`, the config installed 0644 beside
    it; the unit's `User=mindhand` must read the config, the key and the certificate. The CA's key is
    not beside the server's key, and the service user cannot read it."""
    base = Path(tempfile.mkdtemp(prefix="mh-etc-"))  # outside root's 0700 pytest tree: the user can enter it
    try:
        os.chmod(base, 0o755)
        etc = base / "etc"
        r = mkcerts(etc, "--owner", service_user)
        assert r.returncode == 0, r.stderr
        gid = grp.getgrnam(service_user).gr_gid
        assert (mode(etc), etc.stat().st_gid) == (0o750, gid)
        assert (mode(etc / "mind.key"), etc.stat().st_uid, (etc / "mind.key").stat().st_gid) == (0o640, 0, gid)
        assert mode(etc / "mind.crt") == mode(etc / "ca.crt") == 0o644
        assert not (etc / "ca.key").exists()
        assert (mode(etc / "ca"), (etc / "ca").stat().st_uid) == (0o700, 0)
        assert (mode(etc / "ca" / "ca.key"), (etc / "ca" / "ca.key").stat().st_uid) == (0o600, 0)
        assert "ca/ca.key" in r.stdout
        conf = etc / "mind.toml"
        conf.write_text(f'listen = "127.0.0.1:0"\ntls_cert = "{etc}/mind.crt"\ntls_key = "{etc}/mind.key"\n')
        os.chmod(conf, 0o644)  # `install -m 0644 contrib/config/mind.toml /etc/mindhand/mind.toml`
        as_user = {"user": service_user, "group": service_user, "extra_groups": []}
        # What `mind serve` reads at start (the config, then the key and certificate for its TLS
        # context), read by the service user's own processes. (This venv's interpreter lives under
        # root's 0700 home here, so the service user cannot run `mind` itself; `openssl` loads the
        # same PEM files the way `ssl.load_cert_chain` does.)
        read = subprocess.run(["cat", str(conf)], capture_output=True, timeout=10, **as_user)
        assert read.returncode == 0 and b"tls_key" in read.stdout, read.stderr
        for f in ("mind.key", "mind.crt", "ca.crt"):
            kind = "pkey" if f.endswith(".key") else "x509"
            r = subprocess.run(
                ["openssl", kind, "-in", str(etc / f), "-noout"], capture_output=True, timeout=10, **as_user
            )
            assert r.returncode == 0, (f, r.stderr)
        # the Hand's side: ca.crt is the CA's certificate, verified against the Mind's
        r = subprocess.run(
            ["openssl", "verify", "-CAfile", str(etc / "ca.crt"), str(etc / "mind.crt")], capture_output=True
        )
        assert r.returncode == 0, r.stderr
        denied = subprocess.run(["cat", str(etc / "ca" / "ca.key")], capture_output=True, timeout=10, **as_user)
        assert denied.returncode != 0 and b"Permission denied" in denied.stderr
        # an unknown owner changes nothing and says why
        r = mkcerts(base / "other", "--owner", "no-such-user-here")
        assert r.returncode == 2 and "no such user" in r.stderr and not (base / "other").exists()
    finally:
        shutil.rmtree(base)


# --- item 8: `hand add --out` to a place that cannot be written ------------------------------------


def test_hand_add_out_to_an_unwritable_place_creates_nothing_and_a_retry_works(tmp_path):
    cl = Cluster(tmp_path)  # the credential admin opens the Mind's database: no daemon needed
    (tmp_path / "a-file").write_text("")
    for bad in (tmp_path, tmp_path / "a-file" / "web1.cred"):  # a directory; a path under a file
        r = cl.cli("hand", "add", "web1", "--out", str(bad))
        assert r.returncode == 2 and b"Traceback" not in r.stderr, r.stderr
        assert b"nothing was created" in r.stderr and r.stdout == b""
    listed = cl.cli("hand", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    good = tmp_path / "web1.cred"
    r = cl.cli("hand", "add", "web1", "--out", str(good))
    assert r.returncode == 0, r.stderr
    # with --out the secret goes to the file only, never to stdout (a log or a terminal: issue 24)
    assert r.stdout == b"" and b"written to" in r.stderr and mode(good) == 0o600
    assert load_credential(good).label == "web1"
    # rotate checks first too: a new secret that cannot be written would lock the Hand out
    before = good.read_text()
    r = cl.cli("hand", "rotate", "web1", "--out", str(tmp_path))
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    assert cl.cli("hand", "list", "--json").returncode == 0 and good.read_text() == before


# --- item 10: --json when the Mind is unreachable ------------------------------------------------


def test_every_json_command_prints_a_json_error_when_the_mind_is_unreachable(tmp_path):
    with running(tmp_path, hand=None) as cl:
        cred = str(cl.home / "admin.cred")
    nobody = f"ws://127.0.0.1:{free_port()}"
    cl = Cluster(tmp_path)
    commands = [
        ("hands", "--json"),
        ("status", "--json"),
        ("runs", "--json"),
        ("run", "get", "r1", "--json"),
        ("task", "list", "--json"),
        ("task", "get", "t1", "--json"),
        ("task", "start", "--hand", "box", "--json", "--", "true"),
        ("exec", "--hand", "box", "--json", "--mind", nobody, "--credential", cred, "--", "true"),
        ("exec", "--hand", "box", "--events", "--mind", nobody, "--credential", cred, "--", "true"),
    ]
    for argv in commands:
        if argv[0] != "exec":
            argv = (*argv, "--mind", nobody, "--credential", cred)
        r = cl.cli(*argv)
        assert r.returncode == 125, (argv, r.returncode, r.stderr)
        out = json.loads(r.stdout)
        assert out["code"] == "unreachable" and out["exit_code"] == 125, (argv, out)
        assert "cannot reach the Mind" in out["error"] and out["meaning"].startswith("refused"), out
        assert b"Traceback" not in r.stderr
    r = cl.cli("hands", "--json", "--no-such-flag")  # a usage error too, though argparse says it
    assert r.returncode == 2 and json.loads(r.stdout)["code"] == "usage" and b"--no-such-flag" in r.stderr


# --- item 11: "did you mean" for a Hand's name, within the client's scope -------------------------


def test_an_unknown_hand_gets_close_names_only_from_the_clients_scope(tmp_path):
    with running(tmp_path, hand=None) as cl:
        for name in ("web1", "xweb-1", "db"):
            cl.add_hand(name)
        bot = tmp_path / "bot.cred"
        assert cl.cli("client", "add", "bot", "--hands", "web*", "--out", str(bot)).returncode == 0
        scoped = ("--credential", str(bot))
        runs = [
            ("exec", "--hand", "web-1", "--", "true"),
            ("call", "--hand", "web-1", "list_dir"),
            ("task", "start", "--hand", "web-1", "--", "true"),
        ]
        for argv in runs:
            r = cl.cli(*argv)  # the admin sees every Hand
            assert r.returncode == 125 and b"did you mean 'xweb-1' or 'web1'?" in r.stderr, (argv, r.stderr)
            at = argv.index("--hand")
            r = cl.cli(*argv[:at], *scoped, *argv[at:])  # `web-1` is in bot's scope, `xweb-1` is not
            assert r.returncode == 125 and b"did you mean 'web1'?" in r.stderr, (argv, r.stderr)
            assert b"xweb" not in r.stderr and b"no hand named 'web-1'" in r.stderr
        r = cl.cli("exec", *scoped, "--hand", "web-1", "--json", "--", "true")
        assert r.returncode == 125 and json.loads(r.stdout)["did_you_mean"] == ["web1"]
        r = cl.cli("exec", "--hand", "zzzzzz", "--", "true")  # nothing close: no hint
        assert r.returncode == 125 and b"did you mean" not in r.stderr


# --- item 9: the README's "From another machine" works as written ---------------------------------


def test_an_operator_elsewhere_connects_with_the_documented_variables(tmp_path):
    certs = tmp_path / "certs"
    assert mkcerts(certs).returncode == 0
    tls = ("--tls-cert", str(certs / "mind.crt"), "--tls-key", str(certs / "mind.key"))
    with running(tmp_path, hand=None, mind_args=tls) as cl:
        alice = tmp_path / "alice.cred"
        assert cl.cli("client", "add", "alice", "--out", str(alice)).returncode == 0
        elsewhere = tmp_path / "elsewhere"  # no mind.url, no admin.cred, no pin file: nothing local
        elsewhere.mkdir()
        env = {k: v for k, v in cl.env.items() if not k.startswith("MINDHAND_")}
        env |= {"HOME": str(elsewhere), "MINDHAND_URL": cl.url, "MINDHAND_CREDENTIAL": str(alice)}
        for trust in ({"MINDHAND_CA": str(certs / "ca.crt")}, {"MINDHAND_PIN": pin_of(certs)}):
            r = subprocess.run([str(BIN / "mind"), "hands", "--json"], env=env | trust, capture_output=True, timeout=30)
            assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr
        r = subprocess.run([str(BIN / "mind"), "hands"], env=env, capture_output=True, timeout=30)
        assert r.returncode == 125 and b"certificate" in r.stderr  # no CA, no pin: the system trust refuses it


def pin_of(certs: Path) -> str:
    der = subprocess.run(["openssl", "x509", "-in", str(certs / "mind.crt"), "-outform", "DER"], capture_output=True)
    return "sha256:" + hashlib.sha256(der.stdout).hexdigest()


def test_the_readme_states_the_real_exec_timeout_default():
    r = subprocess.run([str(BIN / "mind"), "exec", "--help"], capture_output=True, text=True, timeout=30)
    assert "default 3600" in r.stdout
    assert "default --timeout is 3600 s" in (ROOT / "README.md").read_text()
