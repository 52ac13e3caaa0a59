"""The fault proxy's control token (issue 23, attack 10): the control port is TCP on loopback, which
every local user can reach, so a command needs the token first, and the token is in a file only the
proxy's owner can read (0600, in a 0700 directory). One helper sends a command the same way for the
console script and the Python API."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path


def default_path(control_port: int) -> Path:
    """Where a proxy writes its token when not told (`--token-file`), and where `--send` looks:
    under the user's cache directory, by control port."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mindhand-faultproxy"
    return base / f"{control_port}.token"


def write_token(path: Path) -> str:
    """A fresh token in `path`, 0600 from its first byte, replacing any old file atomically (a
    proxy restarted on the same port) and never through a symlink planted in its place."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_hex(16)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def read_token(path: Path) -> str:
    return path.read_text().strip()


def send(addr: tuple[str, int], token: str | None, command: str, timeout: float = 10.0) -> str:
    """`command` on a proxy's control port (after `auth TOKEN` when a token is given): its reply
    line. Raises OSError when the port cannot be reached."""
    with socket.create_connection(addr, timeout=timeout) as s:
        f = s.makefile("rb")
        if token is not None:
            s.sendall(f"auth {token}\n".encode())
            answer = f.readline().decode().strip()
            if not answer.startswith("ok"):
                return answer or "error: the proxy closed the control connection"
        s.sendall(command.encode() + b"\n")
        return f.readline().decode().strip()
