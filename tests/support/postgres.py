"""A PostgreSQL server of the suite's own: the operating system's binaries, a temporary cluster.

`initdb` into a temp dir, `postgres` on a free loopback port with its unix socket in that dir,
stopped by its PID at the end (never by name). PostgreSQL refuses to run as root, and the suite
runs as root in CI: then the server runs as the `postgres` OS user (the Debian package makes it;
scripts/test installs the package when no server binaries are found), which owns the temp dir.

`PostgresServer.stop()` / `.start()` again on the same data directory is how the integration tests
take the database away and give it back (a restart, an outage).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from mind.testing import reaper

READY_TIMEOUT_S = 30.0
TOOLS = ("initdb", "postgres", "pg_isready", "createdb")


def find_bin_dir() -> Path | None:
    """Where `initdb` and `postgres` are: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        real = Path(os.path.realpath(on_path)).parent  # a symlink on PATH: its directory has the rest
        if all((real / tool).exists() for tool in TOOLS):
            return real
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self._demote = self._as_postgres if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/mindhand"

    def _as_postgres(self) -> None:
        entry = pwd.getpwnam("postgres")
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.root)}

    def init(self) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")  # KeyError: no postgres user (install the package)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
            env=self._env(),
            preexec_fn=self._demote,
            timeout=120,
        )

    def start(self) -> None:
        """Start the server (again, after `stop`: same data, same port) and wait until it answers;
        on any failure the process is stopped before the error is raised."""
        assert self.proc is None
        log = open(self.root / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.root),
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=log,
            env=self._env(),
            preexec_fn=self._demote,
            start_new_session=True,
        )
        reaper.track(self.proc)  # an interrupted run (Ctrl-C) leaves no server behind either
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}: {self.log_tail()}")
            r = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                capture_output=True,
                timeout=10,
            )
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres not ready in {READY_TIMEOUT_S:g} s: {self.log_tail()}")

    def createdb(self, name: str) -> str:
        """A fresh database on this server; its URL."""
        subprocess.run(
            [str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT: connections are cut, as when a database goes away)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        reaper.forget(self.proc)
        self.proc = None

    def log_tail(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def reachable_tmp() -> str:
    """Where the temp cluster goes: the temp directory, unless the server would run as `postgres`
    (we are root) and cannot reach it (a TMPDIR inside a private directory, such as pytest's
    tmp_path for `scripts/bench` run by tests/integration/test_bench_quick.py): then /tmp."""
    base = tempfile.gettempdir()
    if os.geteuid() != 0:
        return base
    path = Path(base).resolve()
    if all(os.stat(d).st_mode & 0o001 for d in (path, *path.parents)):
        return base
    return "/tmp"


def start_server() -> PostgresServer:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise RuntimeError(
            "no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin: "
            "install the `postgresql` package (scripts/test does, as root)"
        )
    root = Path(tempfile.mkdtemp(prefix="mindhand-pg-", dir=reachable_tmp()))
    os.chmod(root, 0o755)
    server = PostgresServer(bin_dir, root)
    try:
        server.init()
        server.start()
        server.createdb("mindhand")
    except BaseException:  # a server that started but did not become usable is stopped, not left behind
        remove(server)
        raise
    return server


def remove(server: PostgresServer) -> None:
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)
