"""Private files, written one hardened way by both daemons: credentials, the Mind's URL and pin,
the Hand's health address, both task databases.

- Never world-readable, not even for a moment: created 0600 (directories 0700) from the first byte.
- Never through a symlink: a link planted where we write (by anyone who can write that directory)
  must not make us truncate or chmod its target. Temporary names are unique and opened
  `O_EXCL | O_NOFOLLOW`; a final name that is a link is replaced, not followed.
- All or nothing: write to a temporary file, fsync, rename over the final name, fsync the
  directory, so a reader sees the old content or the new one, and a crash leaves one of them.

Before this module the Mind's writer followed symlinks and the Hand's did not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def private_dir(path: Path) -> None:
    """`path` exists as a directory with mode 0700 (created with its parents if missing)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def private_file(path: Path) -> None:
    """`path` exists with mode 0600, created empty if missing; a symlink there is refused (ELOOP).
    SQLite gives its -wal and -shm files the database's mode, so a database must be private before
    SQLite opens it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def write_private(path: Path, data: str | bytes, *, fsync: bool = True) -> None:
    """Replace `path` with `data`, atomically, 0600 (its directory is created 0700 if missing)."""
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        with contextlib.suppress(OSError):  # some filesystems refuse to fsync a directory
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
