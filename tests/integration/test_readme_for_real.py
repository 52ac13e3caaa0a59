"""docs/operations.md, "Running mindhand for real" (the README's "Running it for real" until the README
became a front door), run as written for a Mind and a Hand on ONE machine, with TLS (issue 24 item
3): the usual first try, where the Hand's `install -d` once re-moded the Mind's config directory and
`install ca.crt` met itself.

The commands are read from docs/operations.md itself (the code blocks from "The Mind's server" to
"Configuration", and the inline commands of "From another machine"), so the test fails when the
guide drifts from what works. Root is needed (users, `--owner`, `run_as`) and systemd is not:
`systemctl enable --now UNIT` is performed from the unit file the guide copied (its `User=`, `Group=`,
`Environment=`, `StateDirectory=`, `UMask=` and `ExecStart=`, run as that user and its groups, as
systemd does), and `journalctl -f` is read as the unit's log file.

What is parameterized, and only that: the install paths live under a temporary prefix (`/etc/mindhand`
is `$P/etc/mindhand`, ...), the users get unique names (`mindhand` -> `mh-svc-XXXX`), the ports are
free ones, the placeholder host `mind.example.internal` is 127.0.0.1, `/path/to/mindhand` is a copy
of this checkout, and `python3` is an interpreter the service user may run. Everything is removed at
the end (processes by PID, users, the prefix)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mind.testing.cluster import wait_until

pytestmark = pytest.mark.slow  # pip install, useradd, a real Mind and Hand as service users

ROOT = Path(__file__).resolve().parents[2]
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_PATHS = ("/opt/mindhand", "/etc/mindhand", "/var/lib/mindhand", "/srv/mindhand", "/etc/systemd/system")


# --- reading the guide ----------------------------------------------------------------------------

GUIDE = ROOT / "docs" / "operations.md"


def section(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i)]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def split_comment(line: str) -> tuple[str, str]:
    """`cmd args   # what it prints` -> ("cmd args", "what it prints")."""
    m = re.search(r"\s+#\s", line)
    return (line[: m.start()], line[m.end() :]) if m else (line, "")


def readme_steps() -> tuple[list[tuple[str, str]], list[tuple[str, str]], str, list[tuple[str, str]]]:
    """(the Mind's lines, the Hand's lines, the prose of "From another machine", the client's lines)."""
    text = GUIDE.read_text()
    real = section(text, "## The Mind's server", "## Configuration")
    blocks = code_blocks(real)
    assert len(blocks) == 3, "docs/operations.md: the Mind's, the Hand's and the client's blocks"
    mind, hand, client = ([split_comment(ln) for ln in b.splitlines() if ln.strip()] for b in blocks)
    another = " ".join(section(real, "## From another machine", "```").split())
    return mind, hand, another, client


# --- the site: a prefix, users, ports ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shared_python() -> str:
    """A Python >= 3.11 that an unprivileged user may run (this venv's may sit under root's 0700 home)."""
    tried = []
    for cand in (os.path.realpath(getattr(sys, "_base_executable", sys.executable)), "/usr/bin/python3"):
        if not os.path.exists(cand) or cand in tried:
            continue
        tried.append(cand)
        probe = [cand, "-c", "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"]
        try:
            r = subprocess.run(probe, timeout=60, user=65534, group=65534, extra_groups=[])
        except PermissionError:
            continue
        if r.returncode == 0:
            return cand
    pytest.fail(f"no Python >= 3.11 with venv that an unprivileged user may run (tried {tried})", pytrace=False)


class Site:
    """One machine's worth of install, under a temporary prefix, with its own users and ports."""

    def __init__(self, prefix: Path) -> None:
        self.p = prefix
        tag = uuid.uuid4().hex[:6]
        self.svc = f"mh-svc-{tag}"  # the guide's `mindhand`
        self.runu = f"mh-run-{tag}"  # the guide's `mindhand-run`
        self.mind_port = free_port()
        self.hand_port = free_port()
        self.stage = prefix / "checkout"  # where the guide's relative paths (contrib/, scripts/) are
        self.src = prefix / "src"  # /path/to/mindhand
        self.client_home = prefix / "alice"  # "another machine"'s ~
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = prefix / "journal"
        self.python = ""

    def sub(self, text: str) -> str:
        """The guide's (and contrib's) text with this site's paths, users, ports and host."""
        for path in INSTALL_PATHS:
            text = re.sub(rf"(?<![\w./-]){re.escape(path)}(?![\w])", f"{self.p}{path}", text)
        # the users (not a unit's StateDirectory=mindhand, which names /var/lib/mindhand)
        text = re.sub(r"(?<![\w./-])(?<!Directory=)mindhand-run(?![\w/.-])", self.runu, text)
        text = re.sub(r"(?<![\w./-])(?<!Directory=)mindhand(?![\w/.-])", self.svc, text)
        text = text.replace("/path/to/mindhand", str(self.src)).replace("mind.example.internal", "127.0.0.1")
        text = re.sub(r"0\.0\.0\.0:7470\b", f"127.0.0.1:{self.mind_port}", text)
        text = re.sub(r":7470\b", f":{self.mind_port}", text)
        return re.sub(r":7471\b", f":{self.hand_port}", text)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # this machine's package index
        env.update(PATH=STD_PATH, HOME="/root", LANG="C.UTF-8")
        env.update(extra)
        return env

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env())
        r = subprocess.run(
            argv,
            cwd=self.stage,
            capture_output=True,
            text=True,
            timeout=300,
            umask=0o022,
            stdin=subprocess.DEVNULL,
            **kw,
        )
        assert r.returncode == 0, f"{shlex.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r

    # --- systemd, performed -------------------------------------------------------------------------

    def unit(self, name: str) -> dict[str, list[str]]:
        keys: dict[str, list[str]] = {}
        for line in (self.p / "etc/systemd/system" / f"{name}.service").read_text().splitlines():
            if "=" in line and not line.lstrip().startswith(("#", "[")):
                k, v = line.split("=", 1)
                keys.setdefault(k.strip(), []).append(v.strip())
        return keys

    def start(self, name: str) -> subprocess.Popen:
        """`systemctl start NAME` without systemd: the unit's own user, environment, state dir and umask."""
        u = self.unit(name)
        user, group = u["User"][0], u.get("Group", u["User"])[0]
        pw = pwd.getpwnam(user)
        for state in u.get("StateDirectory", []):
            d = self.p / "var/lib" / state
            d.mkdir(parents=True, exist_ok=True)
            shutil.chown(d, user, group)
            os.chmod(d, int(u.get("StateDirectoryMode", ["0755"])[0], 8))
        env = {"PATH": STD_PATH, "HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8"}
        for assignment in u.get("Environment", []):
            for item in shlex.split(assignment):
                k, v = item.split("=", 1)
                env[k] = v
        (exec_start,) = u["ExecStart"]
        argv = shlex.split(exec_start)
        self.logs.mkdir(exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # the daemon's journal (its own copy of the fd)
        p = subprocess.Popen(
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            umask=int(u.get("UMask", ["0022"])[0], 8),
            # as systemd does it: setresuid/setresgid and the user's groups in the child, then execve
            user=pw.pw_uid,
            group=grp.getgrnam(group).gr_gid,
            extra_groups=os.getgrouplist(user, pw.pw_gid),
            start_new_session=True,
        )
        log.close()
        self.procs[name] = p
        return p

    def journal(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str) -> None:
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    def cleanup(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        subprocess.run(["userdel", "--remove", self.runu], capture_output=True, timeout=60)
        subprocess.run(["userdel", self.svc], capture_output=True, timeout=60)
        for g in (self.runu, self.svc):
            subprocess.run(["groupdel", g], capture_output=True, timeout=60)
        shutil.rmtree(self.p, ignore_errors=True)


@pytest.fixture
def site(as_root) -> Iterator[Site]:
    for tool in ("runuser", "curl", "openssl", "install"):
        if shutil.which(tool) is None:
            pytest.fail(f"the guide's steps need {tool} on PATH", pytrace=False)
    prefix = Path(tempfile.mkdtemp(prefix="mh-real-", dir="/tmp"))  # outside root's 0700 pytest tree
    os.chmod(prefix, 0o755)
    s = Site(prefix)
    try:
        # The checkout the guide's relative paths are read from (contrib/, scripts/mkcerts), with the
        # site's names in contrib's files; and /path/to/mindhand, a clean copy to pip install from.
        for d in ("contrib/config", "contrib/systemd"):
            for f in (ROOT / d).iterdir():
                (s.stage / d).mkdir(parents=True, exist_ok=True)
                (s.stage / d / f.name).write_text(s.sub(f.read_text()))
        for there in ("etc/systemd/system", "var/lib", "srv"):  # there on a machine with systemd, 0755
            (s.p / there).mkdir(parents=True)
            for d in (s.p / there, *(s.p / there).parents):
                if d == s.p:
                    break
                os.chmod(d, 0o755)
        (s.stage / "scripts").mkdir()
        shutil.copy2(ROOT / "scripts" / "mkcerts", s.stage / "scripts" / "mkcerts")
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        s.src.mkdir()
        for f in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / f, s.src / f)
        for pkg in ("protocol", "mind", "hand"):
            shutil.copytree(ROOT / pkg, s.src / pkg, ignore=skip)
        s.python = shared_python()
        yield s
    finally:
        s.cleanup()


# --- performing a line of the guide ----------------------------------------------------------------


def expected_json(comment: str) -> dict[str, object]:
    """`{"status": "ok", "version": ..., "hands_connected": 0, ...}` -> {status: "ok", version: ..., ...}:
    the keys the guide shows, with the values it shows (`...`: any value)."""
    return {k: (... if v.strip() == "..." else json.loads(v)) for k, v in re.findall(r'"(\w+)": ([^,}]+)', comment)}


def check_curl(out: str, comment: str) -> None:
    if "{" in comment:
        got = json.loads(out)
        for k, v in expected_json(comment).items():
            assert k in got and (v is ... or got[k] == v), (k, v, got)
    else:
        assert "Prometheus" in comment and "\nmindhand_" in out and "# TYPE mindhand_" in out, out[:2000]


def perform(site: Site, line: str, comment: str, *, user_env: dict[str, str] | None = None) -> str:
    """One line of the guide (`a && b` too), performed on the site; returns what the last command printed."""
    out = ""
    tokens = shlex.split(site.sub(line))
    commands: list[list[str]] = [[]]
    for t in tokens:
        if t == "&&":
            commands.append([])
        else:
            commands[-1].append(t)
    for argv in commands:
        if user_env is not None:
            home = str(site.client_home)
            argv = [a.replace("~/", home + "/") for a in argv]
            argv[0] = argv[0].replace(f"{home}/mindhand/bin/", f"{site.p}/opt/mindhand/bin/")
        if argv[0] == "systemctl":
            assert argv[1:3] == ["enable", "--now"], argv
            site.start(argv[3])
            wait_ready(site, argv[3])
            continue
        if argv[0] == "journalctl":
            assert argv[1] == "-u" and argv[-1] == "-f", argv
            journal = [json.loads(ln) for ln in site.journal(argv[2]).splitlines() if ln.startswith("{")]
            assert any(e.get("event") == "welcome" for e in journal), journal  # what -f shows: it is in
            continue
        if argv[0] == "python3":
            argv[0] = site.python
        r = site.run(argv, env=site.env(**(user_env or {})))
        out = r.stdout
        if argv[0] == "curl" and comment:
            check_curl(out, comment)
    return out


def wait_ready(site: Site, unit: str) -> None:
    """What a person does after `systemctl enable --now`: look until it is up (Type=simple returns at once)."""
    p = site.procs[unit]

    def up() -> bool:
        assert p.poll() is None, f"{unit} exited {p.returncode}:\n{site.journal(unit)}"
        if unit.endswith("-mind"):
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex(("127.0.0.1", site.mind_port)) == 0
        r = subprocess.run(
            ["curl", "-sS", f"http://127.0.0.1:{site.hand_port}/healthz"], capture_output=True, text=True, timeout=10
        )
        return r.returncode == 0 and json.loads(r.stdout).get("connected") is True

    wait_until(up, 60, f"{unit} to come up")


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# --- the test ---------------------------------------------------------------------------------------


def test_the_readme_for_real_works_for_a_mind_and_a_hand_on_one_machine_with_tls(site):
    mind_lines, hand_lines, another, client_lines = readme_steps()
    install = "python3 -m venv /opt/mindhand && /opt/mindhand/bin/pip install /path/to/mindhand"

    # The Mind's server, line by line.
    assert mind_lines[0][0] == install
    for line, comment in mind_lines:
        perform(site, line, comment)
    mind_dir = site.p / "etc/mindhand/mind"
    assert (mode(mind_dir), mind_dir.stat().st_gid) == (0o750, pwd.getpwnam(site.svc).pw_gid)

    # The Hand, on the same machine. Its install line is the same (done already: its comment says so).
    assert hand_lines[0][0] == install and "already" in hand_lines[0][1]
    for line, comment in hand_lines[1:]:
        perform(site, line, comment)
    hand_dir = site.p / "etc/mindhand/hand"
    assert mode(hand_dir) == 0o700 and mode(site.p / "etc/mindhand/hand/hand.cred") == 0o600
    assert (mode(mind_dir), mind_dir.stat().st_gid) == (0o750, pwd.getpwnam(site.svc).pw_gid)  # untouched
    hand_log = site.journal("mindhand-hand")
    assert "WARNING" not in hand_log, hand_log  # run_as is set: commands never share the Hand's identity

    # The Mind's next start (where the shared directory used to fail with "Permission denied").
    site.stop("mindhand-mind")
    site.start("mindhand-mind")
    wait_ready(site, "mindhand-mind")
    healthz = next((ln, c) for ln, c in mind_lines if ln.startswith("curl") and "/healthz" in ln)
    wait_until(lambda: json.loads(perform(site, healthz[0], ""))["hands_connected"] == 1, 60, "the Hand to reconnect")

    # From another machine: a client credential made on the Mind's server, copied (0600) with ca.crt.
    m = re.search(r"`(runuser -u mindhand -- env MINDHAND_HOME=\S+ \S+ client add alice --out (\S+))`", another)
    assert m, another
    assert "pip install /path/to/mindhand" in another and "/bin/mind" in another
    perform(site, m.group(1), "")
    site.client_home.mkdir()
    site.run(["install", "-m", "0600", site.sub(m.group(2)), str(site.client_home / "alice.cred")])
    site.run(["install", "-m", "0644", str(mind_dir / "ca.crt"), str(site.client_home / "ca.crt")])
    export, comment = client_lines[0]
    assert export.startswith("export ") and not comment
    env = {}
    for item in shlex.split(site.sub(export))[1:]:
        k, v = item.split("=", 1)
        env[k] = v.replace("~/", f"{site.client_home}/")
    hands = perform(site, client_lines[1][0], client_lines[1][1], user_env=env)
    assert any(ln.split()[:2] == ["web1", "yes"] for ln in hands.splitlines()), hands
    exec_line, comment = client_lines[2]
    assert comment.split(":")[0] == "mindhand-run"
    assert perform(site, exec_line, comment, user_env=env) == f"{site.runu}\n"


def test_the_readme_links_the_guide_it_runs():
    """The README's front door sends an operator to these steps."""
    assert "docs/operations.md" in (ROOT / "README.md").read_text()


def test_mkcerts_names_every_host_and_ip_and_a_rerun_keeps_the_ca(tmp_path):
    """The certificate names the addresses the Hands dial (DNS names and IPs) and always loopback; a
    re-run signs with the CA already there (the Hands' ca.crt stays valid); --new-ca replaces it."""
    d = tmp_path / "etc" / "mind"
    mk = ROOT / "scripts" / "mkcerts"

    def sans() -> str:
        r = subprocess.run(
            ["openssl", "x509", "-in", str(d / "mind.crt"), "-noout", "-ext", "subjectAltName"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return r.stdout

    def verify() -> bool:
        r = subprocess.run(
            ["openssl", "verify", "-CAfile", str(d / "ca.crt"), str(d / "mind.crt")], capture_output=True
        )
        return r.returncode == 0

    r = subprocess.run([str(mk), str(d), "mind.example.internal", "192.0.2.10"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sans()
    for want in ("DNS:mind.example.internal", "IP Address:192.0.2.10", "DNS:localhost", "IP Address:127.0.0.1"):
        assert want in names, names
    assert mode(tmp_path / "etc") == 0o755  # a directory made above DIR: the service can reach DIR
    ca = (d / "ca.crt").read_bytes()
    r = subprocess.run([str(mk), str(d), "other.example"], capture_output=True, text=True)
    assert r.returncode == 0 and "reused" in r.stdout, r.stdout + r.stderr
    assert (d / "ca.crt").read_bytes() == ca and verify() and "DNS:other.example" in sans()
    r = subprocess.run([str(mk), "--new-ca", str(d)], capture_output=True, text=True)
    assert r.returncode == 0 and (d / "ca.crt").read_bytes() != ca and verify()
    # a CA certificate without its key cannot sign: said, nothing changed
    (d / "ca" / "ca.key").unlink()
    before = (d / "mind.crt").read_bytes()
    r = subprocess.run([str(mk), str(d)], capture_output=True, text=True)
    assert r.returncode == 2 and "--new-ca" in r.stderr and (d / "mind.crt").read_bytes() == before
    r = subprocess.run([str(mk), "--bogus", str(d)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr
