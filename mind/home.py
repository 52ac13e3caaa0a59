"""Where the Mind keeps its state, and how a local CLI finds the Mind and its admin credential."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.io.files import write_private  # noqa: F401 - the Mind's files are written with it

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


def endings_path(h: Path) -> Path:
    """The endings the Mind decided by itself (`mind.store.endings`)."""
    return h / "endings.db"


def node_file(h: Path) -> Path:
    """This node's name in a shared database (`mind.store.engines.node_name`)."""
    return h / "node.id"


def url_file(h: Path) -> Path:
    return h / "mind.url"


def pin_file(h: Path) -> Path:
    """The daemon's own certificate fingerprint, when it serves TLS: the local CLI pins it."""
    return h / "mind.pin"


def database_file(h: Path) -> Path:
    """The shared database this home's Mind serves from (written 0600 by `mind serve --database`:
    the URL may hold a password), so the admin commands on this home act on the same database."""
    return h / "mind.database"


def admin_cred_file(h: Path) -> Path:
    return h / "admin.cred"
