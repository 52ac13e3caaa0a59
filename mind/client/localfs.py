"""The local end of a download (`mind cp HAND:... LOCAL`), built through directory handles: what a
Hand sends never writes outside the destination (issue 23, attacks 1 and 8).

- A tree copied down (`LocalTree`) is made below one handle on its top: every directory is made and
  entered with `mkdirat` / `openat(O_DIRECTORY | O_NOFOLLOW)` from its parent's handle, every file
  is written in the handle of its directory, so no link (planted, or made by the copy itself) is
  ever followed. Symlinks are made last, each only if its target resolves inside the top on the
  real tree (`protocol.io.tree.target_stays_inside`); which entries are made at all, and in which
  order, is `protocol.copy.plan_tree`. Modes and times are set by descriptor.
- A file's part (`LocalPart`) is created `O_EXCL | O_NOFOLLOW` under an unpredictable name
  (`protocol.copy.private_part_name`), owner-only until the rename: a name planted in a shared
  directory is never opened, and a 0600 source is never readable by others on the way. A resume
  continues only a part that is a regular file of ours with one link; stale parts of ours are pruned.

Only the top, the path the operator typed, is looked up by name (a link the operator made to a
directory is theirs to follow; a dangling one is an error, not a traceback).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import time
from typing import Any

from protocol import copy as rules
from protocol.errors import MindhandError
from protocol.io import tree
from protocol.io.writeback import Writeback

HASH_CHUNK = 1 << 20
_FILE = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class LocalRefused(MindhandError):
    """This machine's side of a copy refused or failed; `message` says what and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def open_parent(local: str) -> tuple[int, str]:
    """A handle on the directory `local` is to be written in, and its name there."""
    parent, name = os.path.split(os.path.abspath(local))
    try:
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    except OSError as exc:
        raise LocalRefused(f"cannot write {local!r}: {_why(exc)}") from None


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1


def prune_parts(dir_fd: int, now: float) -> int:
    """Remove stale part files of ours (regular, one link, older than `STALE_PART_S`) in `dir_fd`."""
    removed = 0
    try:
        with os.scandir(dir_fd) as it:
            names = [e.name for e in it if rules.is_part_name(e.name)]
    except OSError:
        return 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if _ours(st) and rules.is_stale(st.st_mtime, now):
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
        except OSError:
            continue
    return removed


class LocalPart:
    """A download's part file in the directory `dir_fd` (a handle it duplicates), renamed over `name`
    only once the whole file's sha256 matches."""

    def __init__(self, dir_fd: int, name: str, shown: str, cid: str) -> None:
        self.dir_fd = os.dup(dir_fd)
        self.name, self.shown, self.cid = name, shown, cid
        self.part = ""
        self.fd = -1
        self.hash = hashlib.sha256()
        self.pos = 0
        self.writeback: Writeback | None = None
        """Set once the part file is open (`protocol.io.writeback`)."""

    def _mine(self) -> list[str]:
        with os.scandir(self.dir_fd) as it:
            return sorted(e.name for e in it if rules.part_copy_id(e.name) == self.cid)

    def open(self, resume: bool) -> int:
        """Continue a part of ours when `resume` (returns where), else start a new one at 0."""
        prune_parts(self.dir_fd, time.time())
        for name in self._mine():
            try:
                fd = os.open(name, _FILE, dir_fd=self.dir_fd)
            except OSError:
                continue  # a link or a FIFO someone planted: never ours
            st = os.fstat(fd)
            if not _ours(st):
                os.close(fd)
                continue
            if resume and self.fd < 0:
                self.fd, self.part = fd, name
                continue
            os.close(fd)
            if not resume or self.fd >= 0:
                os.unlink(name, dir_fd=self.dir_fd)  # an older part of ours for this copy
        if self.fd >= 0:
            while chunk := os.read(self.fd, HASH_CHUNK):
                self.hash.update(chunk)
                self.pos += len(chunk)
            self.writeback = Writeback(self.fd, self.pos)
            return self.pos
        self.part = rules.private_part_name(self.cid, secrets.token_hex(8))
        self.fd = os.open(self.part, _FILE | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=self.dir_fd)
        self.writeback = Writeback(self.fd, 0)
        return 0

    def write(self, data: bytes) -> None:
        """Page cache writes of at most a chunk: done inline (a thread hop would cost more)."""
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.hash.update(data)
        self.pos += len(data)
        if self.writeback is not None:
            self.writeback.wrote(self.pos)

    def finish(self, size: int, sha256: str, mode: int, mtime: float | None) -> bool:
        """Verify, set the mode (never setuid) and time by descriptor, fsync, rename, fsync the
        directory. False: it did not verify, and the part is gone (of no use to a resume)."""
        if self.pos != size or self.hash.hexdigest() != sha256:
            self.drop()
            return False
        os.fchmod(self.fd, rules.safe_mode(mode))
        if mtime is not None:
            os.utime(self.fd, (mtime, mtime))
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        os.replace(self.part, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.part = ""
        os.fsync(self.dir_fd)
        return True

    def drop(self) -> None:
        self._close_file()
        if self.part:
            try:
                os.unlink(self.part, dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
            self.part = ""

    def _close_file(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Keep what was written (for a resume), but never an empty part file."""
        self._close_file()
        if self.part:
            try:
                if os.stat(self.part, dir_fd=self.dir_fd, follow_symlinks=False).st_size == 0:
                    os.unlink(self.part, dir_fd=self.dir_fd)
            except OSError:
                pass
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


class TreePart:
    """A file of a tree copied down (`mind.client.trees`): a private part (`O_EXCL | O_NOFOLLOW`,
    0600, unpredictable name) in the directory handle `dir_fd` (not owned), renamed over `name`
    only once its size and sha256 match. No fsync per file: the tree ends with one sync."""

    def __init__(self, dir_fd: int, name: str) -> None:
        self.dir_fd, self.name = dir_fd, name
        self.part = rules.private_part_name(secrets.token_hex(16), secrets.token_hex(8))
        self.hash = hashlib.sha256()
        self.pos = 0
        try:
            self.fd = os.open(self.part, _FILE | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise LocalRefused(f"cannot write {name!r}: {_why(exc)}") from None

    def write(self, data: Any) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.hash.update(data)
        self.pos += len(data)

    def finish(self, size: int, sha256: str, mode: int, mtime: float | None) -> bool:
        if self.pos != size or self.hash.hexdigest() != sha256:
            self.drop()
            return False
        os.fchmod(self.fd, rules.safe_mode(mode))
        if mtime is not None:
            os.utime(self.fd, (mtime, mtime))
        os.close(self.fd)
        self.fd = -1
        os.replace(self.part, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.part = ""
        return True

    def drop(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.part:
            try:
                os.unlink(self.part, dir_fd=self.dir_fd)
            except OSError:
                pass
            self.part = ""


def sha256_at(dir_fd: int, name: str) -> str | None:
    """The sha256 of the regular file `name` in `dir_fd` (never through a link), None if unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, HASH_CHUNK):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


class LocalTree:
    """The top of a tree copied down, and the entries made below it through handles. `parts` are a
    path's components below the top, as `protocol.copy.split_rel` gives them."""

    def __init__(self, local: str) -> None:
        self.shown = local
        self.top = self._open_top(local)

    @staticmethod
    def _open_top(local: str) -> int:
        try:
            if os.path.islink(local) and not os.path.exists(local):
                raise LocalRefused(f"cannot make {local!r}: it is a symlink that leads nowhere")
            try:
                return os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the operator's own path
            except FileNotFoundError:
                pass
            parent, name = open_parent(local)
            try:
                if name in ("", ".", ".."):
                    raise LocalRefused(f"cannot make {local!r}: no such directory")
                fd, _ = tree.make_dir(parent, name, 0o777)
                return fd
            finally:
                os.close(parent)
        except NotADirectoryError:
            raise LocalRefused(f"cannot make {local!r}: it exists and is not a directory") from None
        except OSError as exc:
            raise LocalRefused(f"cannot make {local!r}: {_why(exc)}") from None

    def _where(self, parts: list[str]) -> str:
        return os.path.join(self.shown, *parts)

    def dir_handle(self, parts: list[str]) -> int:
        """A handle on the directory `parts` (made by this copy, or already there as a real
        directory: never through a link). The caller closes it."""
        try:
            return tree.walk_dirs(self.top, parts)
        except OSError as exc:
            raise LocalRefused(f"cannot enter {self._where(parts)!r}: {self._not_dir(exc)}") from None

    @staticmethod
    def _not_dir(exc: OSError) -> str:
        if isinstance(exc, NotADirectoryError) or exc.errno == 40:  # ELOOP: O_NOFOLLOW met a link
            return "it is not a directory (a symlink or a file is never written through)"
        return _why(exc)

    def make_dir(self, parts: list[str]) -> None:
        """The directory `parts` (owner-writable until `set_mode_time`): an existing directory is
        kept; an existing link or file there is an error, never followed."""
        parent = self.dir_handle(parts[:-1])
        try:
            fd, _ = tree.make_dir(parent, parts[-1], 0o777)
            os.close(fd)
        except OSError as exc:
            raise LocalRefused(f"cannot make {self._where(parts)!r}: {self._not_dir(exc)}") from None
        finally:
            os.close(parent)

    def set_mode_time(self, parts: list[str], mode: int | None, mtime: float | None) -> None:
        fd = self.dir_handle(parts)
        try:
            if mode is not None:
                os.fchmod(fd, rules.safe_mode(mode))
            if mtime is not None:
                os.utime(fd, (rules.check_mtime(mtime), mtime))
        except (OSError, ValueError, TypeError) as exc:  # a Hand's lie (NaN, a string) included
            why = _why(exc) if isinstance(exc, OSError) else str(exc)
            raise LocalRefused(f"cannot set the mode or time of {self._where(parts)!r}: {why}") from None
        finally:
            os.close(fd)

    def make_link(self, parts: list[str], target: str) -> None:
        """The symlink `parts` -> `target`, only if the target resolves inside the top on the real
        tree; an existing symlink there is replaced, anything else is an error."""
        parent = self.dir_handle(parts[:-1])
        name = parts[-1]
        try:
            if not tree.target_stays_inside(self.top, parent, target):
                raise LocalRefused(f"symlink to {target!r} not copied: it leads outside the copied tree")
            try:
                st: Any = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if not stat.S_ISLNK(st.st_mode):
                    raise LocalRefused(f"symlink not copied: {self._where(parts)!r} exists and is not a symlink")
                os.unlink(name, dir_fd=parent)
            os.symlink(target, name, dir_fd=parent)
        except OSError as exc:
            raise LocalRefused(f"cannot make {self._where(parts)!r}: {_why(exc)}") from None
        finally:
            os.close(parent)

    def close(self) -> None:
        if self.top >= 0:
            os.close(self.top)
            self.top = -1

    def __enter__(self) -> LocalTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
