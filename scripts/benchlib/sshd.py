"""Our own sshd on a free loopback port, for the ssh references. Never the system's.

A temporary host key and a temporary client key (authorized for root, key only), every option on
the command line (`-f /dev/null`: the system's sshd_config is not read), killed by PID at the end.
If there is no sshd: `--install-ssh` (full mode only) may `apt-get install openssh-server`; otherwise
the ssh references are n/a with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


class SshUnavailable(Exception):
    pass


def ensure_installed(allow_install: bool, quick: bool = False) -> None:
    """sshd and ssh for the ssh/scp references, and rsync for the tree reference (`cptree`)."""
    have_ssh = SSHD.exists() and shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None
    if have_ssh and (shutil.which("rsync") is not None or not allow_install):
        return  # without rsync only the tree figure goes without its reference (it says so)
    if not allow_install:
        how = "not installed in --quick mode" if quick else "pass --install-ssh to apt-get install openssh-server"
        raise SshUnavailable(f"no {SSHD} ({how})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server", "openssh-client", "rsync"]
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        r = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    if r.returncode != 0 or not SSHD.exists():
        raise SshUnavailable("apt-get install openssh-server failed: " + r.stderr.decode(errors="replace")[-200:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnSshd:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.key = tmp / "client_key"
        # A unix socket path must stay under 108 bytes, and $TMPDIR may be deep: a short directory.
        self._cdir = Path(tempfile.mkdtemp(prefix="mh-ssh.", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.control = self._cdir / "cm"
        self._log = None

    def start(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        os.chmod(self.tmp, 0o700)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.tmp / name)],
                check=True,
                capture_output=True,
                timeout=30,
            )
        (self.tmp / "authorized_keys").write_text((self.tmp / "client_key.pub").read_text())
        os.chmod(self.tmp / "authorized_keys", 0o600)
        # sshd insists on its privilege separation directory (normally made by the package's service).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.port = _free_port()
        self._log = open(self.tmp / "sshd.log", "ab")
        argv = [
            str(SSHD),
            "-D",
            "-e",
            "-f",
            "/dev/null",
            "-p",
            str(self.port),
            "-h",
            str(self.tmp / "host_key"),
            "-o",
            "ListenAddress=127.0.0.1",
            "-o",
            f"AuthorizedKeysFile={self.tmp / 'authorized_keys'}",
            "-o",
            "PermitRootLogin=prohibit-password",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "UsePAM=no",
            "-o",
            "StrictModes=no",
            "-o",
            "PidFile=none",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "UseDNS=no",
            "-o",
            "PrintMotd=no",
            "-o",
            "PermitUserRC=no",
            "-o",
            "AcceptEnv=SHLVL",
        ]
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    log = (self.tmp / "sshd.log").read_text()[-300:]
                    raise SshUnavailable("our sshd did not start: " + log) from exc
                time.sleep(0.05)
        r = subprocess.run(self.argv("true"), capture_output=True, timeout=20, env=self.env)
        if r.returncode != 0:
            self.stop()
            raise SshUnavailable("ssh to our sshd failed: " + r.stderr.decode(errors="replace")[-300:])

    def version(self) -> str:
        r = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=10)
        return (r.stderr or r.stdout).split(",")[0].strip() or "OpenSSH"

    @property
    def env(self) -> dict[str, str]:
        """The ssh client's environment. SHLVL=1 is sent along so that the remote bash does not
        source ~/.bashrc (bash does for a top-level shell run by sshd): the reference is ssh's own
        cost, not the cost of root's dotfiles on this machine (here `pyenv init`, ~110 ms)."""
        return dict(os.environ, SHLVL="1")

    def argv(self, *cmd: str, mux: bool = False, kex: str | None = None) -> list[str]:
        opts = [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(self.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "SendEnv=SHLVL",
        ]
        if kex:
            opts += ["-o", f"KexAlgorithms={kex}"]
        if mux:
            opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control}", "-o", "ControlPersist=60"]
        else:
            opts += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        return opts + ["root@127.0.0.1", *cmd]

    def stop_master(self) -> None:
        """End the ControlPersist master (by the PID it reports, if `-O exit` does not do it)."""
        base = self.argv(mux=True)[:-1]
        r = subprocess.run([*base, "-O", "check", "root@127.0.0.1"], capture_output=True, timeout=10, env=self.env)
        m = re.search(rb"pid=(\d+)", r.stderr + r.stdout)
        subprocess.run([*base, "-O", "exit", "root@127.0.0.1"], capture_output=True, timeout=10, env=self.env)
        if m:
            pid = int(m.group(1))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        if self.proc is None:
            shutil.rmtree(self._cdir, ignore_errors=True)
            return
        try:
            self.stop_master()
        except (OSError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self._cdir, ignore_errors=True)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log is not None:
            self._log.close()
        self.proc = None
