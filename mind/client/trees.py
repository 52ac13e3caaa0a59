"""A whole tree to or from a Hand in one run (`mind cp -r`, DESIGN §11 Files).

A tree used to cost two runs per file; 5,000 small files took 35-43 s where rsync takes half a
second. Now it is one listing of the other side and one run whose stream carries every entry
(`protocol.treestream`: a header per entry, the bytes, the sha256):

- Up: `list_tree` of the destination (with `sha256` under `--checksum`), then one `put_file` with
  `type: "tree"` whose stdin is the tree (`hand.system.copytree.TreeUpload` makes it).
- Down: `list_tree` of the source, then `get_file` with `paths` (the files that differ, in order;
  a very long list in a few runs, `protocol.copy.batch_paths`) whose stdout is the tree. The Hand
  may send only the paths asked for, in that order: anything else ends the copy.
- What is already the same is skipped (`protocol.copy.same_file`): size and modification time by
  default, size and sha256 with `checksum`. `TreeResult.skipped` says how many.
- Every per-file promise of a single copy holds: each file's sha256 is checked by its receiver
  before the rename; a file appears under its name only complete (a part file beside it, renamed);
  modes never carry setuid/setgid/sticky; symlinks are made last and only when they resolve inside
  the tree on the real tree. A run lost to a cut (or a closed connection, with `reconnect`) is run
  again: the second listing compares by digest, so what arrived whole is not sent again (file
  granularity; a file cut in the middle is sent again whole). A new `mind cp` after a failure does
  the same by its size and time comparison.
- Durability: one `syncfs` of the destination's filesystem at the end of a tree, not an fsync per
  file (see `hand.system.copytree` for why).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import posixpath
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from mind.client import localfs
from mind.client.files import (
    ATTEMPTS,
    RETRYABLE_REJECTS,
    TIMEOUT_S,
    CopyError,
    Progress,
    Reconnect,
    _Link,
    _pause,
    _retryable,
    _umask,
    failure,
)
from mind.errors import ClientCode, ClientError
from protocol import copy as rules
from protocol import limits
from protocol import treestream as ts
from protocol.codes import RejectCode
from protocol.io import tree
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

MindClient = Any
Fail = Callable[[str, str], None]
"""Told (what, why) for each entry that was not copied; the copy goes on."""
NOT_UTF8 = "not copied: its name is not UTF-8 (a Hand's paths travel as UTF-8, and a lossy name would be another)"
SPECIAL = "not copied: it is a special file (FIFO, socket or device)"


@dataclass
class TreeResult:
    path: str
    files: int = 0
    """Files in the tree (regular files this copy could read)."""
    sent: int = 0
    """Files sent and verified (in this call, all attempts)."""
    skipped: int = 0
    """Files already the same on the other side (not sent)."""
    failed: int = 0
    bytes: int = 0
    """Payload bytes of the stream (all attempts)."""
    attempts: int = 1
    duration_s: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "type": "tree",
            "files": self.files,
            "sent": self.sent,
            "skipped": self.skipped,
            "failed": self.failed,
            "bytes": self.bytes,
            "attempts": self.attempts,
            "duration_s": round(self.duration_s, 3),
        }


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- the local tree --------------------------------------------------------------------------


@dataclass
class LocalFile:
    rel: str
    src: str
    size: int
    mode: int
    mtime: float
    sha256: str | None = None


@dataclass
class LocalPlan:
    """A local tree as an upload sends it: directories (parents first), files, links inside it."""

    dirs: list[tuple[str, int, float]] = field(default_factory=list)
    files: list[LocalFile] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)


def plan_local(local: str) -> LocalPlan:
    """Walk `local` (never following a link): what an upload of it sends, and what it refuses
    (names that are not UTF-8, special files, links leading out of the tree: `errors`). What lies
    below a directory that is refused is not walked."""
    plan = LocalPlan()
    for here, subdirs, names in os.walk(local, followlinks=False):
        rel = os.path.relpath(here, local)
        every = sorted(subdirs + names)
        subdirs[:] = sorted(n for n in subdirs if _utf8(n))
        for name in every:
            src = os.path.join(here, name)
            relpath = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            if not _utf8(name):
                plan.errors.append((src, NOT_UTF8))
                continue
            try:
                st = os.lstat(src)
            except OSError as exc:
                plan.errors.append((src, exc.strerror or str(exc)))
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(src)
                if not _utf8(target):
                    plan.errors.append((src, "symlink not copied: its target is not UTF-8"))
                elif rules.link_stays_inside(relpath, target):
                    plan.links.append((relpath, target))
                else:
                    plan.errors.append((src, f"symlink to {target!r} not copied: it leads outside the copied tree"))
            elif stat.S_ISDIR(st.st_mode):
                plan.dirs.append((relpath, stat.S_IMODE(st.st_mode), st.st_mtime))
            elif stat.S_ISREG(st.st_mode):
                plan.files.append(LocalFile(relpath, src, st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime))
            else:
                plan.errors.append((src, SPECIAL))
    return plan


def local_sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


class TreeSource:
    """The stream of an upload (blocking `read`): directories, the files to send, links, the end.
    A file that cannot be opened is told to `fail` and left out; one that shrank while read is
    padded and sent with a digest the Hand refuses."""

    def __init__(self, plan: LocalPlan, files: list[LocalFile], preserve: bool, fail: Fail) -> None:
        self.items: list[Any] = [("dir", d) for d in plan.dirs]
        self.items += [("file", f) for f in files]
        self.items += [("link", ln) for ln in plan.links]
        self.preserve, self.fail = preserve, fail
        self.next = 0
        self.count = 0
        self.ended = False
        self.f: Any = None
        self.left = 0
        self.short = False
        self.hash: Any = None

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n and not self.ended:
            if self.f is not None:
                self._body(out, n)
            elif self.next < len(self.items):
                kind, item = self.items[self.next]
                self.next += 1
                self._start(kind, item, out)
            else:
                out += ts.end(self.count)
                self.ended = True
        return bytes(out)

    def _start(self, kind: str, item: Any, out: bytearray) -> None:
        mtime_ok = self.preserve
        if kind == "dir":
            rel, mode, mtime = item
            out += ts.header(ts.Entry(rel, "dir", mode=mode, mtime=mtime if mtime_ok else None))
        elif kind == "link":
            rel, target = item
            out += ts.header(ts.Entry(rel, "symlink", target=target))
        else:
            lf: LocalFile = item
            try:
                f = open(lf.src, "rb")
                st = os.fstat(f.fileno())
            except OSError as exc:
                self.fail(lf.src, f"cannot read it: {exc.strerror or exc}")
                return
            if not stat.S_ISREG(st.st_mode):
                f.close()
                self.fail(lf.src, SPECIAL)
                return
            mtime = rules.check_mtime(st.st_mtime) if mtime_ok else None
            out += ts.header(ts.Entry(lf.rel, "file", st.st_size, rules.safe_mode(st.st_mode), mtime))
            self.f, self.left, self.short, self.hash = f, st.st_size, False, hashlib.sha256()
        self.count += 1

    def _body(self, out: bytearray, n: int) -> None:
        while self.left and len(out) < n:
            want = min(self.left, max(n - len(out), 1 << 16))
            data = b"" if self.short else self.f.read(want)
            if not data:
                self.short = True
                data = bytes(want)
            else:
                self.hash.update(data)
            out += data
            self.left -= len(data)
        if not self.left:
            digest = self.hash.digest()
            if self.short:
                digest = hashlib.sha256(b"shrank:" + digest).digest()
            out += ts.trailer(digest)
            self.f.close()
            self.f = None

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


async def _chunks(
    source: TreeSource, counter: list[int], total: int, on_progress: Progress | None
) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(source.read, limits.STREAM_CHUNK_MAX):
            counter[0] += len(chunk)
            if on_progress is not None:
                on_progress(min(counter[0], total), total)
            yield chunk
    finally:
        source.close()


DENIED = (RejectCode.DENIED_BY_POLICY, RejectCode.DENIED_BY_SCOPE)


async def _listing(
    mc: MindClient, hand: str, path: str, checksum: bool, required: bool = True
) -> dict[str, Any] | None:
    """`list_tree` of `path` as {relative path: entry}; None when there is no directory to compare
    with (nothing there, or not a directory: the copy itself will say what). Unless `required`, a
    listing the Hand's policy or the credential's scope refuses is None too: an upload then sends
    everything, as it did before it compared (a drop box may allow `put_file` and deny listing)."""
    args: dict[str, Any] = {"path": path}
    if checksum:
        args["sha256"] = True
    end = await mc.exec(hand, "list_tree", args, timeout=TIMEOUT_S)
    if end.state is not RunState.SUCCEEDED:
        if end.state is RunState.REJECTED and (required or end.reject_code not in DENIED):
            raise failure(end)
        return None
    entries = end.value.get("entries") if isinstance(end.value, dict) else None
    if not isinstance(entries, list) or listed_type(end.value) != "dir":
        return None
    return {e["path"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("path"), str)}


def listed_type(value: Any) -> str | None:
    """What a `list_tree` answer says its path is: `dir`, None (nothing there), or another type.
    A Hand that answers only for directories (and fails the run otherwise) sends no `type`."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "dir")
    return kind if isinstance(kind, str) else None


def _away(exc: CopyError) -> bool:
    """A listing refused because the Hand is away (or the Mind stopping): try again after a pause."""
    return exc.code == ClientCode.REJECTED and any(code.value in exc.message for code in RETRYABLE_REJECTS)


# --- up --------------------------------------------------------------------------------------


async def upload_tree(
    mc: MindClient,
    hand: str,
    local: str,
    remote: str,
    *,
    preserve: bool = False,
    checksum: bool = False,
    fail: Fail,
    reconnect: Reconnect | None = None,
    attempts: int = ATTEMPTS,
    on_progress: Progress | None = None,
) -> TreeResult:
    """Copy the local directory `local` to `remote` on `hand` as one run; entries not copied are
    told to `fail` (the copy goes on); raises `CopyError` when the copy as a whole could not run."""
    started = time.monotonic()
    plan = await asyncio.to_thread(plan_local, local)
    for what, why in plan.errors:
        fail(what, why)
    try:
        st = os.stat(local)
    except OSError as exc:
        raise CopyError(ClientCode.LOCAL, f"cannot read {local!r}: {exc.strerror or exc}") from None
    top_args: dict[str, Any] = {"path": remote, "type": "tree", "preserve": preserve, "make_dirs": True}
    if posixpath.normpath(remote) != ".":
        top_args["mode"] = rules.safe_mode(st.st_mode)
        if preserve:
            top_args["mtime"] = rules.check_mtime(st.st_mtime)
    result = TreeResult(path=remote, files=len(plan.files), attempts=0)
    link = _Link(mc, reconnect)
    by_digest = checksum
    first = True
    first_todo = last_todo = 0
    failed_local: list[int] = [0]

    def local_fail(what: str, why: str) -> None:
        failed_local[0] += 1
        fail(what, why)

    for attempt in range(1, attempts + 1):
        result.attempts = attempt
        try:
            listed = await _listing(link.mc, hand, remote, by_digest, required=checksum)
            theirs = listed or {}
            todo = await asyncio.to_thread(_differ_up, plan.files, theirs, by_digest)
            if first:
                result.skipped = len(plan.files) - len(todo)
                first_todo = len(todo)
                first = False
            last_todo = len(todo)
            if listed is not None and not todo and _same_shape(plan, theirs, preserve) and not plan.errors:
                result.duration_s = time.monotonic() - started
                return result  # nothing to make: no run at all
            counter = [0]
            source = TreeSource(plan, todo, preserve, local_fail)
            handle = await link.mc.start(
                hand,
                "put_file",
                top_args,
                timeout=TIMEOUT_S,
                stdin=_chunks(source, counter, sum(f.size for f in todo), on_progress),
                stream=True,
                watch=False,
            )
            try:
                end = await handle.wait()
            finally:
                result.bytes += counter[0]
        except CopyError as exc:
            if _away(exc) and attempt < attempts:
                await _pause(attempt)
                by_digest = True
                continue
            raise
        except ClientError as exc:
            if attempt < attempts and await link.recover(exc):
                await _pause(attempt)
                by_digest = True
                continue
            raise CopyError(ClientCode.LOST, f"cannot copy to {hand}: {exc.message}") from None
        if end.state is RunState.SUCCEEDED:
            value = end.value or {}
            for path, why in value.get("failed", []):
                fail(f"{hand}:{posixpath.join(remote, path)}", why)
            shown = len(value.get("failed", []))
            extra = int(value.get("failed_count", shown)) - shown
            if extra > 0:
                fail(f"{hand}:{remote}", f"and {extra} more entries not copied")
            result.failed = int(value.get("failed_count", 0)) + failed_local[0] + len(plan.errors)
            result.sent = first_todo - last_todo + int(value.get("files", 0))  # earlier attempts' too
            result.duration_s = time.monotonic() - started
            return result
        if not _retryable(end) or attempt == attempts:
            raise failure(end)
        by_digest = True  # what arrived whole is found by its digest, whatever its time
        failed_local[0] = 0
        await _pause(attempt)
    raise CopyError(ClientCode.LOST, "the copy did not complete")  # pragma: no cover


def _same_shape(plan: LocalPlan, theirs: dict[str, Any], preserve: bool) -> bool:
    """Every directory and link of `plan` is already there as it would be made (with `preserve`,
    a directory's time too)."""
    for rel, _, mtime in plan.dirs:
        other = theirs.get(rel)
        if other is None or other.get("type") != "dir":
            return False
        if preserve and not rules.same_file(0, mtime, None, {**other, "type": "file", "size": 0}, False):
            return False
    for rel, target in plan.links:
        other = theirs.get(rel)
        if other is None or other.get("type") != "symlink" or other.get("target") != target:
            return False
    return True


def _differ_up(files: list[LocalFile], theirs: dict[str, Any], checksum: bool) -> list[LocalFile]:
    todo: list[LocalFile] = []
    for lf in files:
        other = theirs.get(lf.rel)
        if checksum and other is not None and other.get("size") == lf.size:
            lf.sha256 = lf.sha256 or local_sha256(lf.src)
        if not rules.same_file(lf.size, lf.mtime, lf.sha256, other, checksum):
            todo.append(lf)
    return todo


# --- down ------------------------------------------------------------------------------------


class TreeSink:
    """The local end of a tree download (blocking `feed`): each file the Hand sends, exactly the
    paths asked for and in their order, is written to a private part beside its name in the
    directory handle `LocalTree` gives, checked against its sha256 and renamed."""

    def __init__(self, top: localfs.LocalTree, asked: list[str], preserve: bool, shown: str, fail: Fail) -> None:
        self.top, self.asked, self.preserve, self.shown, self.fail = top, asked, preserve, shown, fail
        self.reader = ts.TreeReader()
        self.next = 0
        self.done: set[str] = set()
        self.umask = _umask()
        self.part: localfs.TreePart | None = None
        self.entry: ts.Entry | None = None
        self.dirs: dict[str, int] = {}

    def feed(self, data: bytes) -> None:
        try:
            for ev in self.reader.feed(data):
                self._on(ev)
        except ts.TreeFrameError as exc:
            self.abort()
            raise CopyError(ClientCode.FAILED, f"{self.shown}: refused: {exc.message}") from None
        except OSError as exc:
            self.abort()
            raise CopyError(ClientCode.LOCAL, f"cannot write below {self.top.shown!r}: {exc.strerror or exc}") from None

    def close(self) -> None:
        try:
            self.reader.close()
        except ts.TreeFrameError as exc:
            raise CopyError(ClientCode.FAILED, f"{self.shown}: refused: {exc.message}") from None
        finally:
            self.abort()

    def _on(self, ev: ts.Event) -> None:
        if isinstance(ev, ts.Chunk):
            if self.part is not None:
                self.part.write(ev.data)
            return
        if isinstance(ev, ts.EntryEnd):
            self._end(ev.sha256)
            return
        if isinstance(ev, ts.TreeEnd):
            if self.next != len(self.asked):
                raise ts.TreeFrameError(f"the Hand sent {self.next} of the {len(self.asked)} files asked for")
            return
        entry = ev
        if self.next >= len(self.asked) or entry.path != self.asked[self.next]:
            raise ts.TreeFrameError(f"the Hand sent {entry.path[:200]!r}, which was not the next file asked for")
        self.next += 1
        if entry.type == "error":
            self.fail(f"{self.shown}/{entry.path}", entry.error or "the Hand could not read it")
            return
        if entry.type != "file":
            raise ts.TreeFrameError(f"the Hand sent {entry.path[:200]!r} as a {entry.type}, not a file")
        parts = entry.parts
        self.entry = entry
        try:
            fd = self._dir(parts[:-1])
            self.part = localfs.TreePart(fd, parts[-1])
        except localfs.LocalRefused as exc:
            self.fail(f"{self.shown}/{entry.path}", exc.message)
            self.part = None

    def _dir(self, parts: list[str]) -> int:
        key = "/".join(parts)
        fd = self.dirs.get(key)
        if fd is None:
            if len(self.dirs) >= 32:
                for old in self.dirs.values():
                    os.close(old)
                self.dirs.clear()
            fd = self.top.dir_handle(parts)
            self.dirs[key] = fd
        return fd

    def _end(self, sha256: str) -> None:
        entry, part = self.entry, self.part
        self.entry, self.part = None, None
        if entry is None or part is None:
            return
        mode = rules.safe_mode(entry.mode if entry.mode is not None else 0o644)
        if not self.preserve:
            mode &= ~self.umask
        mtime = entry.mtime if self.preserve else None
        try:
            ok = part.finish(entry.size, sha256, mode, mtime)
        except OSError as exc:
            part.drop()
            self.fail(f"{self.shown}/{entry.path}", f"cannot write it: {exc.strerror or exc}")
            return
        if not ok:
            self.fail(
                f"{self.shown}/{entry.path}", "sha256 mismatch (the file changed on the Hand, or bytes were damaged)"
            )
            return
        self.done.add(entry.path)

    def abort(self) -> None:
        if self.part is not None:
            self.part.drop()
            self.part = None
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()


async def download_tree(
    mc: MindClient,
    hand: str,
    remote: str,
    local: str,
    *,
    preserve: bool = False,
    checksum: bool = False,
    fail: Fail,
    reconnect: Reconnect | None = None,
    attempts: int = ATTEMPTS,
    on_progress: Progress | None = None,
) -> TreeResult:
    """Copy the directory `remote` on `hand` to the local `local` (made if missing) as one listing
    and one run (or a few, for a very long list); entries not copied are told to `fail`.
    In the order a tree must be made: the listing judged (`_remote_plan`), the directories
    (`_make_dirs`), the files, retried across cuts (`_fetch_files`), then links and the
    directories' modes and times (`_finish_tree`), and one flush."""
    started = time.monotonic()
    link = _Link(mc, reconnect)
    shown = f"{hand}:{remote}"
    plan = await _remote_plan(link, hand, remote, checksum, shown)
    for path, why in plan.refused:
        fail(f"{hand}:{posixpath.join(remote, path)}", why)
    try:
        top = localfs.LocalTree(local)
    except localfs.LocalRefused as exc:
        raise CopyError(ClientCode.LOCAL, exc.message) from None
    result = TreeResult(path=local, files=len(plan.files), attempts=0)
    with top:
        made = _make_dirs(top, plan.dirs, hand, remote, fail)
        files = [e for e in plan.files if "/".join(e["path"].split("/")[:-1]) in made]
        failed = await _fetch_files(
            link, hand, remote, top, files, result, preserve, checksum, shown, fail, attempts, on_progress
        )
        _finish_tree(top, plan, made, hand, remote, preserve, fail)
        if result.sent:  # one flush for the whole tree (nothing written: nothing to flush)
            await asyncio.to_thread(_sync, top.top)
    result.failed = failed + len(plan.refused)
    result.duration_s = time.monotonic() - started
    return result


async def _remote_plan(link: _Link, hand: str, remote: str, checksum: bool, shown: str) -> rules.TreePlan:
    """The first `list_tree` of `remote`, judged by `protocol.copy.plan_tree`: a malformed listing
    ends the copy before anything local is made."""
    try:
        end = await link.mc.exec(
            hand, "list_tree", {"path": remote, **({"sha256": True} if checksum else {})}, timeout=60
        )
    except ClientError as exc:
        raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
    if end.state is not RunState.SUCCEEDED:
        raise failure(end)
    value = end.value if isinstance(end.value, dict) else {}
    kind = listed_type(value)
    if value and kind != "dir":
        why = "no such directory" if kind is None else "it is not a directory"
        raise CopyError(ClientCode.FAILED, f"cannot copy {shown}: {why}")
    entries = value.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CopyError(ClientCode.FAILED, f"{shown}: refused: the Hand's listing is malformed")
    return rules.plan_tree(entries)


def _make_dirs(top: localfs.LocalTree, dirs: list[dict[str, Any]], hand: str, remote: str, fail: Fail) -> set[str]:
    """The directories (parents first) made below `top`: the relative paths made, "" for the top.
    One that cannot be made is told to `fail` once, and nothing below it is attempted."""
    made: set[str] = {""}
    for e in dirs:
        parts = e["path"].split("/")
        if "/".join(parts[:-1]) not in made:
            continue  # its parent failed (said once)
        try:
            top.make_dir(parts)
            made.add(e["path"])
        except localfs.LocalRefused as exc:
            fail(f"{hand}:{posixpath.join(remote, e['path'])}", exc.message)
    return made


async def _fetch_files(
    link: _Link,
    hand: str,
    remote: str,
    top: localfs.LocalTree,
    files: list[dict[str, Any]],
    result: TreeResult,
    preserve: bool,
    checksum: bool,
    shown: str,
    fail: Fail,
    attempts: int,
    on_progress: Progress | None,
) -> int:
    """The files that differ, fetched in `get_file` runs; after a cut, listed again and compared
    by digest, so only what did not arrive whole is asked again. Answers how many were not copied."""
    by_digest = checksum
    first = True
    failed = 0
    for attempt in range(1, attempts + 1):
        result.attempts = attempt
        if not first:
            try:
                fresh = await _listing(link.mc, hand, remote, True) or {}
            except CopyError as exc:
                if _away(exc) and attempt < attempts:
                    await _pause(attempt)
                    continue
                raise
            except ClientError as exc:
                if attempt < attempts and await link.recover(exc):
                    await _pause(attempt)
                    continue
                raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
            files = [fresh.get(e["path"], e) for e in files]
        todo = await asyncio.to_thread(_differ_down, top, files, by_digest)
        wanted = set(todo)
        sizes = sum(int(e.get("size") or 0) for e in files if e["path"] in wanted)
        if first:
            result.skipped = len(files) - len(todo)
            first = False
        failures: list[tuple[str, str]] = []
        try:
            end_ = await _get_batches(
                link.mc, hand, remote, top, todo, preserve, shown, _collect(failures), result, on_progress, sizes
            )
        except CopyError:
            raise
        except ClientError as exc:
            if attempt < attempts and await link.recover(exc):
                await _pause(attempt)
                by_digest = True
                continue
            raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
        if end_ is None or end_.state is RunState.SUCCEEDED:
            for what, why in failures:
                fail(what, why)
            failed = len(failures)
            break
        if not _retryable(end_) or attempt == attempts:
            raise failure(end_)
        by_digest = True
        await _pause(attempt)
    return failed


def _finish_tree(
    top: localfs.LocalTree,
    plan: rules.TreePlan,
    made: set[str],
    hand: str,
    remote: str,
    preserve: bool,
    fail: Fail,
) -> None:
    """The links, once every file is in place, then (with `preserve`) the directories' modes and
    times, deepest first: writing into a directory changes its time."""
    for e in plan.links:
        parts = e["path"].split("/")
        if "/".join(parts[:-1]) in made:
            try:
                top.make_link(parts, str(e.get("target") or ""))
            except localfs.LocalRefused as exc:
                fail(f"{hand}:{posixpath.join(remote, e['path'])}", exc.message)
    if preserve:
        for e in reversed(plan.dirs):
            if e["path"] in made:
                try:
                    top.set_mode_time(e["path"].split("/"), e.get("mode"), e.get("mtime"))
                except localfs.LocalRefused as exc:
                    fail(f"{hand}:{posixpath.join(remote, e['path'])}", exc.message)


def _collect(into: list[tuple[str, str]]) -> Fail:
    def note(what: str, why: str) -> None:
        into.append((what, why))

    return note


def _sync(fd: int) -> None:
    try:
        tree.sync_filesystem(fd)
    except OSError:
        pass


def _differ_down(top: localfs.LocalTree, files: list[dict[str, Any]], checksum: bool) -> list[str]:
    """The paths of `files` (listing entries) not already the same below `top`."""
    todo: list[str] = []
    for e in files:
        path = e["path"]
        parts = path.split("/")
        mine: dict[str, Any] | None = None
        try:
            fd = top.dir_handle(parts[:-1])
        except localfs.LocalRefused:
            fd = -1
        if fd >= 0:
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    mine = {"type": "file", "size": st.st_size, "mtime": st.st_mtime}
                    if checksum and st.st_size == e.get("size"):
                        mine["sha256"] = localfs.sha256_at(fd, parts[-1])
            except OSError:
                mine = None
            finally:
                os.close(fd)
        theirs_t = e.get("mtime")
        theirs_mtime = (
            float(theirs_t) if isinstance(theirs_t, (int, float)) and not isinstance(theirs_t, bool) else None
        )
        size = e.get("size")
        if not isinstance(size, int) or mine is None:
            todo.append(path)
            continue
        if not rules.same_file(size, theirs_mtime, e.get("sha256"), mine, checksum):
            todo.append(path)
    return todo


async def _get_batches(
    mc: MindClient,
    hand: str,
    remote: str,
    top: localfs.LocalTree,
    todo: list[str],
    preserve: bool,
    shown: str,
    fail: Fail,
    result: TreeResult,
    on_progress: Progress | None = None,
    total: int = 0,
) -> RunEnd | None:
    """One `get_file` run per batch of paths; the first end that is not a success, or the last."""
    last: RunEnd | None = None
    for batch in rules.batch_paths(todo):
        sink = TreeSink(top, batch, preserve, shown, fail)
        handle = await mc.start(
            hand,
            "get_file",
            {"path": remote, "paths": batch},
            timeout=TIMEOUT_S,
            stream=True,
            verify=False,  # each entry's own sha256 is checked (protocol/treestream.py)
            output_limit=1 << 50,
            watch=False,
        )
        end: RunEnd | None = None
        try:
            async for ev in handle.events():
                if isinstance(ev, StreamData) and ev.stream == "stdout" and ev.data:
                    result.bytes += len(ev.data)
                    if on_progress is not None:
                        on_progress(min(result.bytes, total), total)
                    await asyncio.to_thread(sink.feed, ev.data)
                elif isinstance(ev, RunEnd):
                    end = ev
        except BaseException:
            sink.abort()
            raise
        finally:
            result.sent += len(sink.done)
        assert end is not None
        if end.state is not RunState.SUCCEEDED:
            sink.abort()
            return end
        sink.close()
        last = end
    return last
