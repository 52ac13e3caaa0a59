"""Where the Mind keeps its state, and how a local CLI finds the Mind and its admin credential."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:7470"


def home(override: str | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("MINDHAND_HOME")
    if env:
        return Path(env).expanduser()
    return Path("~/.local/state/mindhand").expanduser()


def db_path(h: Path) -> Path:
    return h / "mind.db"


def url_file(h: Path) -> Path:
    return h / "mind.url"


def pin_file(h: Path) -> Path:
    """The daemon's own certificate fingerprint, when it serves TLS: the local CLI pins it."""
    return h / "mind.pin"


def admin_cred_file(h: Path) -> Path:
    return h / "admin.cred"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` with mode 0600 from the first byte (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
