"""The blocking file work of a copy (`put_file`, `get_file`, `stat_file`, `list_tree`; DESIGN §11 Files).

Everything here runs on a file thread: the run's user's (`hand.system.fsuser`) with `--run-as`, so
the kernel checks access as that user and what is created is theirs. Paths are walked from a handle
on the root (`paths.locate`) and the last name is opened relative to its parent's handle with
`O_NOFOLLOW`, exactly as the other file tools do: a directory swapped for a symlink cannot lead out.

An upload writes `.mindhand-cp.<copy_id>.part` beside the destination (`protocol.copy`), hashes as it
writes, and at the end of the stream checks size and sha256 of the WHOLE file (a resumed prefix is
re-hashed from the part file), fsyncs, renames over the name and fsyncs the directory: the name only
ever shows the old file or the complete new one. A failure (digest mismatch, disk full, too many
bytes) removes the part file; an interruption (the stream did not end: link cut, client gone) fsyncs
and keeps it for a resume. No mode set here carries setuid, setgid or sticky bits.

A download reads a regular file (special files are refused: a FIFO would block, a device never
ends) up to the size it had when opened, hashing from byte 0 (the prefix a resumed download skips
is read and hashed too), so the digest the client checks covers the whole file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from hand.system.paths import (
    PATH_MAX_BYTES,
    Located,
    PathRefused,
    describe_kind,
    entry_type,
    locate,
    open_root,
    wire_name,
)
from protocol import copy as rules
from protocol import limits
from protocol.errors import MindhandError
from protocol.io import tree
from protocol.io.writeback import DropBehind, Writeback, was_cached

READ_CHUNK = limits.STREAM_CHUNK_MAX
"""A download's read, and so its data frame: the largest a stream carries, as an upload's. At 256 KiB
(half of it) every hop paid its per-frame Python twice per MiB: interleaved, 1 GiB from the page
cache went 307-352 MiB/s at 256 KiB and 315-386 at 512, the Mind's user CPU 0.59-0.76 ns/B against
0.43-0.65."""
TREE_MAX_ENTRIES = 20_000
TREE_MAX_BYTES = 4 << 20
"""What a listing may weigh, counted while it is built (each entry's path and target plus
`TREE_ENTRY_BYTES`): 250 nested 250-character directories with 19,000 files at the bottom once cost
the Hand 3.5 GiB and its loop 5-9 s of encoding before the answer was refused as too large to send.
A listing over this is refused early, having held at most this much."""
TREE_ENTRY_BYTES = 64
"""An entry's keys, type, mode, size and mtime as msgpack encodes them, rounded up."""
"""Entries of one `list_tree` answer (it must fit in one frame): a larger tree is refused, not cut."""


class CopyFailed(MindhandError):
    """A copy failed; `message` names the caller's path, never the Hand's absolute one."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _why(exc: OSError) -> str:
    if exc.errno is not None and exc.errno == 28:  # ENOSPC
        return "no space left on the Hand's disk (any old file is intact)"
    return exc.strerror or type(exc).__name__


def _locate(
    what: str, root: Path, user_path: str, shown: str, *, follow_last: bool, make_dirs: bool = False
) -> Located:
    try:
        return locate(root, user_path, follow_last=follow_last, make_dirs=make_dirs)
    except PathRefused as exc:
        raise CopyFailed(f"cannot {what}: {exc.message}") from None
    except FileNotFoundError:
        raise CopyFailed(f"cannot {what} {shown}: its directory does not exist") from None
    except OSError as exc:
        raise CopyFailed(f"cannot {what} {shown}: {_why(exc)}") from None


def _locate_probe(what: str, root: Path, user_path: str, shown: str, *, follow_last: bool) -> Located | None:
    """`_locate` for a probe (`stat_file`, `list_tree`): None when a directory on the way does not
    exist. A copy asks what is at its destination before it makes it; "nothing, not even its
    directory" is an answer to that question, not a failed run (a failed probe once showed in
    `mind status` as a failure of a copy that succeeded)."""
    try:
        return locate(root, user_path, follow_last=follow_last)
    except FileNotFoundError:
        return None
    except PathRefused as exc:
        raise CopyFailed(f"cannot {what}: {exc.message}") from None
    except OSError as exc:
        raise CopyFailed(f"cannot {what} {shown}: {_why(exc)}") from None


def _lstat(at: Located) -> os.stat_result | None:
    try:
        return os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _dir_fd(at: Located) -> int:
    """A readable handle on the directory `at` is in (its handle is O_PATH: no fsync, no listing)."""
    return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=at.parent)


def prune_stale(at: Located, now: float) -> int:
    """Remove part files older than `STALE_PART_S` in `at`'s directory (copies nobody resumed)."""
    removed = 0
    try:
        fd = _dir_fd(at)
    except OSError:
        return 0
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it if rules.is_part_name(e.name)]
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and rules.is_stale(st.st_mtime, now):
                    os.unlink(name, dir_fd=fd)
                    removed += 1
            except OSError:
                continue
    finally:
        os.close(fd)
    return removed


DIGEST_BYTES = 32
"""A sha256 as the stream carries it after a file's bytes (`put_file` with `digest_follows`)."""


def _hash_prefix(fd: int, n: int, h: Any) -> None:
    pos = 0
    while pos < n:
        chunk = os.pread(fd, min(1 << 20, n - pos), pos)
        if not chunk:
            raise CopyFailed("the part file shrank while it was being re-read")
        h.update(chunk)
        pos += len(chunk)


class Upload:
    """One `put_file` of a regular file: open (or resume) the part file, write, finish or stop."""

    def __init__(
        self,
        root: Path,
        user_path: str,
        shown: str,
        copy_id: str,
        size: int,
        sha256: str | None,
        offset: int,
        mode: int | None,
        mtime: float | None,
        preserve: bool,
        make_dirs: bool,
    ) -> None:
        self.root, self.user_path, self.shown = root, user_path, shown
        self.part = rules.part_name(copy_id)
        self.size, self.sha256, self.offset = size, sha256, offset
        """`sha256` None: the digest follows the file's bytes in the stream (`tail`)."""
        self.mode, self.mtime, self.preserve, self.make_dirs = mode, mtime, preserve, make_dirs
        self.at: Located | None = None
        self.fd = -1
        self.pos = offset
        self.hash = hashlib.sha256()
        self.tail = b""
        """The stream's bytes after the file's: its digest, when it follows (`DIGEST_BYTES`)."""
        self.existing: os.stat_result | None = None
        self.writeback: Writeback | None = None
        """Set once the part file is open (`protocol.io.writeback`)."""

    def open(self) -> int:
        """Returns the offset the stream starts at (the resume point)."""
        at = _locate("write", self.root, self.user_path, self.shown, follow_last=False, make_dirs=self.make_dirs)
        self.at = at
        try:
            existing = _lstat(at)
            if at.name == "." or (existing is not None and not stat.S_ISREG(existing.st_mode)):
                kind = "a directory" if at.name == "." else describe_kind(existing.st_mode)  # type: ignore[union-attr]
                raise CopyFailed(f"cannot write {self.shown}: it is {kind}")
            self.existing = existing
            prune_stale(at, time.time())
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
            if self.offset == 0:  # a new part: whatever has its name (a planted link) goes first
                try:
                    os.unlink(self.part, dir_fd=at.parent)
                except FileNotFoundError:
                    pass
                self.fd = os.open(self.part, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=at.parent)
            else:
                try:
                    self.fd = os.open(self.part, flags | os.O_NONBLOCK, dir_fd=at.parent)
                except FileNotFoundError:
                    rules.resume_point(None, self.offset, self.size)  # raises: nothing to resume
                st = os.fstat(self.fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a FIFO, or a hard link to another file
                    kind = describe_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file with other names"
                    raise CopyFailed(f"cannot resume {self.shown}: its part file is {kind}")
                rules.resume_point(st.st_size, self.offset, self.size)
                os.ftruncate(self.fd, self.offset)
                _hash_prefix(self.fd, self.offset, self.hash)
            os.lseek(self.fd, self.offset, os.SEEK_SET)
            self.writeback = Writeback(self.fd, self.offset)
        except ValueError as exc:  # the resume rule: the client asks again
            self._close()
            raise CopyFailed(f"cannot resume {self.shown}: {exc}") from None
        except OSError as exc:
            self.abort()
            raise CopyFailed(f"cannot write {self.shown}: {_why(exc)}") from None
        except CopyFailed:
            self._close()
            raise
        return self.offset

    def write(self, chunks: list[bytes]) -> int:
        """Append `chunks`; returns the stream's bytes this run took (what may be acknowledged):
        the file's, then the digest's when it follows them."""
        try:
            for data in chunks:
                room = self.size - self.pos
                if len(data) > room:  # past the file: its digest, if one follows, and nothing else
                    extra = data[room:]
                    if self.sha256 is not None or len(self.tail) + len(extra) > DIGEST_BYTES:
                        raise CopyFailed(f"cannot write {self.shown}: more bytes came than the {self.size} announced")
                    self.tail += bytes(extra)
                    data = data[:room]
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
                self.hash.update(data)
                self.pos += len(data)
            if self.writeback is not None:
                self.writeback.wrote(self.pos)
        except OSError as exc:
            self.abort()
            raise CopyFailed(f"cannot write {self.shown}: {_why(exc)}") from None
        except CopyFailed:
            self.abort()
            raise
        return self.pos - self.offset + len(self.tail)

    def finish(self) -> dict[str, Any]:
        """The stream ended: verify, fix the mode, fsync, rename, fsync the directory."""
        assert self.at is not None
        try:
            if self.pos != self.size:
                raise CopyFailed(f"cannot write {self.shown}: the stream ended at {self.pos} of {self.size} bytes")
            expected = self.sha256
            if expected is None:
                if len(self.tail) != DIGEST_BYTES:
                    raise CopyFailed(f"cannot write {self.shown}: the stream ended without the file's sha256")
                expected = self.tail.hex()
            digest = self.hash.hexdigest()
            if digest != expected:
                raise CopyFailed(
                    f"cannot write {self.shown}: sha256 mismatch (got {digest[:16]}..., expected {expected[:16]}...)"
                )
            if self.mode is not None and (self.preserve or self.existing is None):
                mode = rules.safe_mode(self.mode)
            elif self.existing is not None:
                mode = rules.safe_mode(self.existing.st_mode)
            else:
                mode = 0o644
            os.fchmod(self.fd, mode)
            if self.mtime is not None:
                os.utime(self.fd, (self.mtime, self.mtime))
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            os.replace(self.part, self.at.name, src_dir_fd=self.at.parent, dst_dir_fd=self.at.parent)
            dfd = _dir_fd(self.at)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            self.abort()
            raise CopyFailed(f"cannot write {self.shown}: {_why(exc)}") from None
        except CopyFailed:
            self.abort()
            raise
        self._close()
        return {"path": self.user_path, "size": self.size, "sha256": digest, "mode": mode}

    def interrupt(self) -> None:
        """The stream stopped before its end: keep what was written, durably, for a resume."""
        if self.fd >= 0:
            try:
                os.fsync(self.fd)
            except OSError:
                pass
        self._close()

    def abort(self) -> None:
        """The copy failed: no part file stays behind."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.at is not None and self.at.parent >= 0:
            try:
                os.unlink(self.part, dir_fd=self.at.parent)
            except OSError:
                pass
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.at is not None:
            self.at.close()


class Download:
    """One `get_file`: the file's bytes from `offset`, and the digest of all of it."""

    def __init__(self, root: Path, user_path: str, shown: str, offset: int) -> None:
        self.root, self.user_path, self.shown, self.offset = root, user_path, shown, offset
        self.fd = -1
        self.size = 0
        self.pos = offset
        self.hash: Any = hashlib.sha256()
        self._hash_reads = True
        self.st: os.stat_result | None = None
        self.drop: DropBehind | None = None
        """Set for a file that was not in the page cache when opened (`protocol.io.writeback`)."""

    def open(self) -> int:
        """Returns the bytes to send."""
        with _locate("read", self.root, self.user_path, self.shown, follow_last=True) as at:
            try:
                st = os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    hint = " (use -r)" if stat.S_ISDIR(st.st_mode) else ""
                    raise CopyFailed(f"cannot read {self.shown}: it is {describe_kind(st.st_mode)}{hint}")
                self.fd = os.open(at.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.parent)
            except FileNotFoundError:
                raise CopyFailed(f"cannot read {self.shown}: no such file") from None
            except OSError as exc:
                raise CopyFailed(f"cannot read {self.shown}: {_why(exc)}") from None
        try:
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode):
                raise CopyFailed(f"cannot read {self.shown}: it is {describe_kind(st.st_mode)}")
            self.st, self.size = st, st.st_size
            if self.offset > self.size:
                raise CopyFailed(f"cannot resume {self.shown} at {self.offset}: the file has {self.size} bytes")
            if not was_cached(self.fd, self.size):  # asked before the prefix below is read
                self.drop = DropBehind(self.fd, self.offset)
            _hash_prefix(self.fd, self.offset, self.hash)
        except OSError as exc:
            self.close()
            raise CopyFailed(f"cannot read {self.shown}: {_why(exc)}") from None
        except CopyFailed:
            self.close()
            raise
        return self.size - self.offset

    def read(self, n: int = READ_CHUNK) -> bytes:
        want = min(n, self.size - self.pos)
        try:
            data = os.pread(self.fd, want, self.pos) if want > 0 else b""
        except OSError as exc:
            raise CopyFailed(f"cannot read {self.shown}: {_why(exc)}") from None
        if want > 0 and not data:
            raise CopyFailed(f"cannot read {self.shown}: it shrank while being read")
        if self._hash_reads:
            self.hash.update(data)
        self.pos += len(data)
        if self.drop is not None:
            self.drop.read(self.pos)
        return data

    def hash_as_sent(self, sent: Any) -> None:
        """From byte 0 the bytes sent are the whole file, and the stream hashes them as it sends
        them (its `sha256` in the result's tail): take the file's digest from that hash instead of
        hashing every byte twice. `finish` is called once every byte has been sent."""
        assert self.offset == 0
        self.hash, self._hash_reads = sent, False

    def finish(self) -> dict[str, Any]:
        assert self.st is not None
        st = self.st
        self.close()
        return {
            "path": self.user_path,
            "size": self.size,
            "sha256": self.hash.hexdigest(),
            "mode": stat.S_IMODE(st.st_mode),
            "mtime": st.st_mtime,
        }

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def stat_file(root: Path, user_path: str, shown: str, copy_id: str | None) -> dict[str, Any]:
    """What is at `user_path` (the name itself: a symlink is reported, not followed; `type` None
    when nothing is, its directory included), and how many bytes the part file of `copy_id` beside
    it holds (None: no part file): where a copy resumes."""
    found = _locate_probe("stat", root, user_path, shown, follow_last=False)
    if found is None:
        return {"type": None, "part": None}  # its directory does not exist either
    with found as at:
        try:
            if at.name == ".":
                st: os.stat_result | None = os.stat(".", dir_fd=at.parent)
            else:
                st = _lstat(at)
            part: int | None = None
            if copy_id is not None:
                try:
                    pst = os.stat(rules.part_name(copy_id), dir_fd=at.parent, follow_symlinks=False)
                    part = pst.st_size if stat.S_ISREG(pst.st_mode) else None
                except FileNotFoundError:
                    part = None
        except OSError as exc:
            raise CopyFailed(f"cannot stat {shown}: {_why(exc)}") from None
    if st is None:
        return {"type": None, "part": part}
    return {
        "type": entry_type(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
        "part": part,
    }


def _file_sha256(dir_fd: int, name: str) -> str | None:
    """The sha256 of the regular file `name` in `dir_fd` (never through a link), None if unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_listed(root: Path, user_path: str, shown: str, digests: bool) -> int | dict[str, Any]:
    """A handle on the directory `list_tree` lists, or, when `user_path` is not a directory, the
    whole answer: `type` None when nothing is there (its directory included), else the top
    described as `stat_file` describes it (a file's `sha256` too, with `digests`), no entries.
    A copy probes its destination this way before making it (a missing one must not fail the run),
    and a single file's digest comes this way for `mind cp -c` (one file hashed, not its directory)."""
    found = _locate_probe("list", root, user_path, shown, follow_last=True)
    if found is None:
        return {"type": None, "entries": []}
    with found as at:
        try:
            st = os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                return os.open(at.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.parent)
            top: dict[str, Any] = {
                "type": entry_type(st.st_mode),
                "size": st.st_size,
                "mode": stat.S_IMODE(st.st_mode),
                "mtime": st.st_mtime,
                "entries": [],
            }
            if digests and stat.S_ISREG(st.st_mode):
                top["sha256"] = _file_sha256(at.parent, at.name)
            return top
        except FileNotFoundError:
            return {"type": None, "entries": []}
        except OSError as exc:
            raise CopyFailed(f"cannot list {shown}: {_why(exc)}") from None


def list_tree(root: Path, user_path: str, shown: str, digests: bool = False) -> dict[str, Any]:
    """Every entry under the directory `user_path`, depth first, paths relative to it, with `type:
    "dir"` (what is not a directory answers its `type` and no entries: `_open_listed`). Symlinks are
    reported with their target, never followed; special files as `fifo`, `socket` or `device` (the
    client refuses them by name). More than `TREE_MAX_ENTRIES` is refused: a copy must not miss files.
    `digests`: each regular file's `sha256` too (`mind cp --checksum` compares them in one call)."""
    entries: list[dict[str, Any]] = []
    weight = 0
    base = len(user_path.encode("utf-8", "surrogateescape")) + 1
    top = _open_listed(root, user_path, shown, digests)
    if isinstance(top, dict):
        return top
    stack: list[tuple[int, str]] = [(top, "")]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                with os.scandir(fd) as it:
                    names = sorted(e.name for e in it)
                for name in names:
                    shown_name = wire_name(name)
                    path = f"{rel}{shown_name}"
                    if base + len(path.encode("utf-8", "surrogateescape")) > PATH_MAX_BYTES:
                        raise CopyFailed(
                            f"cannot list {shown}: {path[:60]}... is longer than {PATH_MAX_BYTES} bytes,"
                            " which no file tool takes, so it could not be copied"
                        )
                    try:
                        est = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    kind = entry_type(est.st_mode)
                    entry: dict[str, Any] = {
                        "path": path,
                        "type": kind,
                        "mode": stat.S_IMODE(est.st_mode),
                        "size": est.st_size if kind == "file" else 0,
                        "mtime": est.st_mtime,
                    }
                    if digests and kind == "file":
                        entry["sha256"] = _file_sha256(fd, name)
                    if shown_name != name:
                        entry["lossy"] = True  # not UTF-8 here: the receiver cannot name it exactly
                    if kind == "symlink":
                        link_target = os.readlink(name, dir_fd=fd)
                        entry["target"] = wire_name(link_target)
                        if entry["target"] != link_target:
                            entry["lossy"] = True
                    weight += len(path) + len(entry.get("target", "")) + TREE_ENTRY_BYTES
                    if weight > TREE_MAX_BYTES:
                        raise CopyFailed(f"cannot list {shown}: the listing is over {TREE_MAX_BYTES >> 20} MiB")
                    entries.append(entry)
                    if len(entries) > TREE_MAX_ENTRIES:
                        raise CopyFailed(f"cannot list {shown}: more than {TREE_MAX_ENTRIES} entries")
                    if kind == "dir":
                        if path.count("/") >= 255:
                            raise CopyFailed(f"cannot list {shown}: too deep")
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                        stack.append((sub, path + "/"))
            except OSError as exc:
                raise CopyFailed(f"cannot list {shown}/{rel}: {_why(exc)}") from None
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
    return {"type": "dir", "entries": entries}


def make_dir(root: Path, user_path: str, shown: str, mode: int | None, mtime: float | None) -> dict[str, Any]:
    """A directory of a copied tree (parents made as needed). `mode` applies only to a directory
    this call makes: an existing one (a shared 1777 directory) keeps its mode and its sticky bit,
    and a mode for the root itself is refused (issue 23, attack 9: the root became 0777). Its time
    is set when given. Never setgid or sticky."""
    with _locate("make", root, user_path, shown, follow_last=False, make_dirs=True) as at:
        try:
            if at.name != ".":
                fd, created = tree.make_dir(at.parent, at.name, 0o700)
            else:
                if mode is not None:  # no copy needs it; only a probe would (attack 9)
                    raise CopyFailed(f"cannot set the mode of {shown}: it is the root, the Hand's own")
                created = False
                fd = _dir_fd(at)
            try:
                if created:
                    os.fchmod(fd, rules.safe_mode(mode if mode is not None else 0o755))
                if mtime is not None:
                    os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW | O_DIRECTORY met a link or a file
                existing = _lstat(at)
                kind = describe_kind(existing.st_mode) if existing is not None else "not a directory"
                raise CopyFailed(f"cannot make {shown}: it exists and is {kind} (never followed)") from None
            raise CopyFailed(f"cannot make {shown}: {_why(exc)}") from None
    return {"path": user_path, "type": "dir", "created": created}


def make_link(root: Path, user_path: str, shown: str, target: str) -> dict[str, Any]:
    """A symlink of a copied tree, only if its target resolves inside the root, judged on the real
    tree from the directory the link lands in (`protocol.io.tree.target_stays_inside`), never by
    its text: a link is data, but one leading out would be a door out for every other program that
    works in the root (issue 23, attack 2: `d1/.../d30/up -> ../..(30)`, then `.../up/escape`)."""
    with _locate("make", root, user_path, shown, follow_last=False, make_dirs=True) as at:
        if at.name == ".":
            raise CopyFailed(f"cannot make {shown}: it is a directory")
        try:
            ceiling = open_root(root)
            try:
                inside = tree.target_stays_inside(ceiling, at.parent, target)
            finally:
                os.close(ceiling)
            if not inside:
                raise CopyFailed(f"cannot make {shown}: its target leads outside the root")
            existing = _lstat(at)
            if existing is not None:
                if not stat.S_ISLNK(existing.st_mode):
                    raise CopyFailed(f"cannot make {shown}: it exists and is {describe_kind(existing.st_mode)}")
                os.unlink(at.name, dir_fd=at.parent)
            os.symlink(target, at.name, dir_fd=at.parent)
        except OSError as exc:
            raise CopyFailed(f"cannot make {shown}: {_why(exc)}") from None
    return {"path": user_path, "type": "symlink", "target": target}
