"""Files to and from Hands (`mind cp`, DESIGN §11 Files): streaming, verified, atomic, resumable.

```python
async with await MindClient.connect(url, cred) as mc:
    await mc.upload("box", "big.iso", "isos/big.iso")
    await mc.download("box", "logs/app.log", "app.log")
    await mc.upload_bytes("box", some_async_iterator, "data.bin")
    async for chunk in mc.download_iter("box", "data.bin"): ...
```
A file travels as a run's stream (the Hand's `put_file` reads `stdin`, `get_file` writes `stdout`),
so it has the data plane's flow control: the Mind holds at most a window, whatever the size.

- Verified: an upload's sha256 is computed as its bytes are sent and follows them in the stream
  (the Hand checks it before the rename; a source that changed meanwhile ends without it, refused);
  a download's is sent back with it (checked here before the rename).
- Atomic: each side writes a part file beside the destination and renames it only when complete.
- Resumable: the copy's identity (`protocol.copy.copy_id`) is derived from the Hand, the
  destination, and the source's size, device, inode and mtime (for a download: the remote size and
  mtime), so
  a new invocation finds the part file of an interrupted one. Within one call a lost run (Hand
  link cut), a refused start while the Hand is away, or a closed connection to the Mind (with a
  `reconnect`) is retried from what the receiver holds; bytes it acknowledged are not sent again.
  `CopyResult.sent` counts the payload bytes that went over the wire, for checking exactly that.

An in-memory upload (`upload_bytes`) is spooled to a temporary file first: a resume needs the bytes
again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from mind.client import localfs
from mind.errors import ClientCode, ClientError
from protocol import copy as rules
from protocol import limits
from protocol.codes import ErrorCode, RejectCode
from protocol.io.writeback import DropBehind, was_cached
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

MindClient = Any
"""`mind.client.aio.MindClient` (not imported: aio exposes these functions as its methods)."""
Progress = Callable[[int, int], None]
"""Called with (bytes done, total) as a copy goes."""
Reconnect = Callable[[], Awaitable[Any]]

TIMEOUT_S = limits.RUN_TIMEOUT_MAX_MS / 1000
ATTEMPTS = 40
"""Tries of one copy: with the pauses below, about two and a half minutes for a Hand to come back."""
RETRYABLE_REJECTS = {RejectCode.HAND_OFFLINE, RejectCode.SHUTTING_DOWN}
HASH_CHUNK = 1 << 20
KINDS = {"dir": "a directory", "symlink": "a symlink", "fifo": "a FIFO", "socket": "a socket", "device": "a device"}


class CopyError(ClientError):
    """A copy failed. `code`: `rejected` (refused before anything ran: policy, path outside the root,
    too large), `failed` (the Hand's tool failed: no such file, permission denied, disk full),
    `mismatch` (the digest did not match), `lost` (retries gave up), `local` (this machine's side)."""


@dataclass
class CopyResult:
    path: str
    size: int
    sha256: str
    duration_s: float = 0.0
    resumed_from: list[int] = field(default_factory=list)
    """The offsets later attempts started at (empty: one attempt from the start, or a new
    invocation's first attempt at 0)."""
    sent: int = 0
    """Payload bytes that crossed the wire in this call (all attempts)."""
    attempts: int = 1
    mode: int | None = None
    mtime: float | None = None
    skipped: bool = False
    """Nothing was sent: the other side already had the same file (`skip_unchanged`)."""

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256 or None,  # (a file skipped by size and time was never hashed)
            "duration_s": round(self.duration_s, 3),
            "resumed_from": self.resumed_from,
            "sent": self.sent,
            "attempts": self.attempts,
            "skipped": self.skipped,
        }


class _Link:
    """The client a copy uses, replaced by `reconnect` when its connection to the Mind closed."""

    def __init__(self, mc: MindClient, reconnect: Reconnect | None) -> None:
        self.mc = mc
        self.reconnect = reconnect

    async def recover(self, exc: ClientError) -> bool:
        if exc.code != ClientCode.CLOSED or self.reconnect is None:
            return False
        try:
            self.mc = await self.reconnect()
        except ClientError:
            return True  # not yet: the retry loop waits and tries again
        return True


def failure(end: RunEnd) -> CopyError:
    if end.state is RunState.REJECTED:
        code = end.reject_code.value if end.reject_code else "rejected"
        return CopyError(ClientCode.REJECTED, f"{end.error or end.reason} ({code})")
    if end.state is RunState.FAILED:
        return CopyError(ClientCode.FAILED, end.error or end.reason or "failed")
    return CopyError(ClientCode(end.state.value), f"the copy ended {end.state.value}: {end.reason}")


def _retryable(end: RunEnd) -> bool:
    if end.state is RunState.LOST:
        return True
    if end.state is RunState.CANCELLED and end.reason in ("connection_lost", "client_disconnected", "shutdown"):
        return True
    return end.state is RunState.REJECTED and end.reject_code in RETRYABLE_REJECTS


async def _pause(attempt: int) -> None:
    await asyncio.sleep(min(0.25 * attempt, 5.0))


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Size and sha256 of a local file (blocking)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


async def stat_remote(mc: MindClient, hand: str, path: str, copy_id: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"path": path}
    if copy_id is not None:
        args["copy_id"] = copy_id
    end = await mc.exec(hand, "stat_file", args, timeout=60)
    if end.state is not RunState.SUCCEEDED:
        raise failure(end)
    value: dict[str, Any] = end.value
    return value


async def remote_sha256(mc: MindClient, hand: str, path: str) -> str | None:
    """The sha256 of the regular file `path` on `hand`, hashed there (`list_tree` with `sha256` of
    a file answers that file alone), or None when it cannot be had: not a file, or a Hand whose
    `list_tree` lists only directories. `stat_file` carries no digest, and hashing the file's
    whole directory to learn one digest would cost what the comparison saves."""
    try:
        end = await mc.exec(hand, "list_tree", {"path": path, "sha256": True}, timeout=TIMEOUT_S)
    except ClientError:
        return None
    value = end.value if end.state is RunState.SUCCEEDED and isinstance(end.value, dict) else {}
    digest = value.get("sha256")
    return digest if value.get("type") == "file" and isinstance(digest, str) else None


def is_unchanged(mine: dict[str, Any], theirs: dict[str, Any], checksum: bool) -> bool:
    """The rule a tree's files are skipped by (`protocol.copy.same_file`), for one file: `mine`
    and `theirs` as `stat_file` describes a file (`sha256` added when `checksum`)."""
    size, mtime = mine.get("size"), mine.get("mtime")
    if mine.get("type") != "file" or not isinstance(size, int):
        return False
    when = float(mtime) if isinstance(mtime, (int, float)) and not isinstance(mtime, bool) else None
    return rules.same_file(size, when, mine.get("sha256"), theirs, checksum)


def _local_info(st: os.stat_result) -> dict[str, Any]:
    kind = "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"type": kind, "size": st.st_size, "mtime": st.st_mtime}


def _skipped(path: str, info: dict[str, Any], sha256: str | None, started: float) -> CopyResult:
    return CopyResult(
        path=path,
        size=int(info["size"]),
        sha256=sha256 or "",
        duration_s=time.monotonic() - started,
        attempts=0,
        mode=info.get("mode"),
        mtime=info.get("mtime"),
        skipped=True,
    )


# --- upload ------------------------------------------------------------------------------------


async def _unchanged_up(
    mc: MindClient, hand: str, local: str | os.PathLike[str], remote: str, checksum: bool, started: float
) -> CopyResult | None:
    """A skipped result when `remote` already holds the same file as `local`, else None. A probe
    that cannot answer (a Hand's policy denies it, the link dropped) is no reason to fail the copy:
    the file is then sent, as it would have been without the comparison."""
    try:
        mine = _local_info(await asyncio.to_thread(os.stat, local))
        theirs = await stat_remote(mc, hand, remote)
    except (OSError, ClientError):
        return None
    if theirs.get("type") != "file" or theirs.get("size") != mine["size"]:
        return None
    if checksum:
        theirs["sha256"] = await remote_sha256(mc, hand, remote)
        if theirs["sha256"] is None:
            return None
        try:
            mine["sha256"] = (await asyncio.to_thread(file_digest, local))[1]
        except OSError:
            return None
    if not is_unchanged(mine, theirs, checksum):
        return None
    return _skipped(remote, theirs, mine.get("sha256"), started)


class _Source:
    """The file an upload reads, hashed as it is sent (one pass: the digest follows the bytes in
    the stream, `put_file`'s `digest_follows`). The digest covers exactly what was sent, so the
    file must not change meanwhile: its size and modification time are read again after the last
    byte, and if either moved the stream ends without the digest, which the Hand refuses (nothing
    is renamed there) and the copy fails saying why (`changed`)."""

    def __init__(self, f: BinaryIO, st: os.stat_result) -> None:
        self.f, self.st = f, st
        self.changed = False
        self.digest = ""
        self.drop = None if was_cached(f.fileno(), st.st_size) else DropBehind(f.fileno(), 0)
        """A file nobody had in the page cache leaves it as it found it (`protocol.io.writeback`)."""

    def _read(self, h: Any, pos: int, n: int) -> bytes:
        data = os.pread(self.f.fileno(), n, pos)
        h.update(data)  # on the reading thread: hashlib lets go of the GIL for a chunk
        if self.drop is not None:
            self.drop.read(pos + len(data))
        return data

    def _unchanged(self) -> bool:
        now = os.fstat(self.f.fileno())
        return (now.st_size, now.st_mtime_ns) == (self.st.st_size, self.st.st_mtime_ns)

    async def chunks(self, offset: int, done: Callable[[int], None]) -> AsyncIterator[bytes]:
        """The stream from `offset` (the Hand holds what is before it: hashed here, not sent)."""
        h = hashlib.sha256()  # this attempt's: an abandoned attempt's read may still finish on its thread
        self.changed = False
        pos = 0
        while pos < offset:  # what the Hand's part file holds: read and hashed, not sent
            got = await asyncio.to_thread(self._read, h, pos, min(HASH_CHUNK, offset - pos))
            if not got:
                break
            pos += len(got)
        while pos >= offset and (chunk := await asyncio.to_thread(self._read, h, pos, limits.STREAM_CHUNK_MAX)):
            pos += len(chunk)
            done(len(chunk))
            yield chunk
        if pos != self.st.st_size or not await asyncio.to_thread(self._unchanged):
            self.changed = True
            return  # no digest: the Hand refuses the part file
        self.digest = h.hexdigest()
        yield h.digest()


async def upload(
    mc: MindClient,
    hand: str,
    local: str | os.PathLike[str],
    remote: str,
    *,
    preserve: bool = False,
    make_dirs: bool = False,
    resume: bool = True,
    skip_unchanged: bool = False,
    checksum: bool = False,
    on_progress: Progress | None = None,
    reconnect: Reconnect | None = None,
    attempts: int = ATTEMPTS,
) -> CopyResult:
    """Copy the local file `local` to `remote` on `hand` (a path relative to its root). With
    `resume`, a part file an earlier call left for the same copy is continued. With
    `skip_unchanged` (or `checksum`), a file already the same at `remote` is not sent
    (`CopyResult.skipped`): the same size and modification time, or with `checksum` the same size
    and sha256, the rule a tree's files are skipped by, so `mind cp -p` twice sends nothing."""
    started = time.monotonic()
    if skip_unchanged or checksum:
        same = await _unchanged_up(mc, hand, local, remote, checksum, started)
        if same is not None:
            return same
    try:
        st, f = await asyncio.to_thread(_open_source, local)
    except OSError as exc:
        raise CopyError(ClientCode.LOCAL, f"cannot read {os.fspath(local)!r}: {exc.strerror or exc}") from None
    size = st.st_size
    # The same file, unchanged since (device, inode, modification time): its part file is continued.
    cid = rules.copy_id(hand, remote, size, f"stat:{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}")
    source = _Source(f, st)
    args: dict[str, Any] = {
        "path": remote,
        "size": size,
        "digest_follows": True,
        "copy_id": cid,
        "mode": rules.safe_mode(st.st_mode),
        "preserve": preserve,
        "make_dirs": make_dirs,
    }
    if preserve:
        args["mtime"] = st.st_mtime
    link = _Link(mc, reconnect)
    result = CopyResult(path=remote, size=size, sha256="", attempts=0, mode=args["mode"])
    try:
        offset = 0
        ask = resume
        for attempt in range(1, attempts + 1):
            result.attempts = attempt
            try:
                if ask:
                    info = await stat_remote(link.mc, hand, remote, cid)
                    offset = rules.sender_offset(info.get("part"), size)
                if attempt > 1 or offset:
                    result.resumed_from.append(offset)
                moved = [offset]  # this attempt's position in the file, for the progress callback

                def done(n: int, moved: list[int] = moved) -> None:
                    moved[0] += n
                    if on_progress is not None:
                        on_progress(min(size, moved[0]), size)

                handle = await link.mc.start(
                    hand,
                    "put_file",
                    {**args, "offset": offset},
                    timeout=TIMEOUT_S,
                    stdin=source.chunks(offset, done),
                    stream=True,
                    watch=False,
                )
                try:
                    end = await handle.wait()
                finally:
                    result.sent += min(handle.stdin_sent, size - offset)  # the file's bytes, not the digest after them
            except CopyError as exc:
                if exc.code == ClientCode.REJECTED and "hand_offline" in exc.message and attempt < attempts:
                    await _pause(attempt)
                    ask = True
                    continue
                raise
            except ClientError as exc:
                if attempt < attempts and await link.recover(exc):
                    await _pause(attempt)
                    ask = True
                    continue
                raise CopyError(ClientCode.LOST, f"cannot copy to {hand}: {exc.message}") from None
            if end.state is RunState.SUCCEEDED:
                result.sha256 = source.digest
                result.duration_s = time.monotonic() - started
                return result
            if source.changed:
                raise CopyError(
                    ClientCode.LOCAL,
                    f"{os.fspath(local)!r} changed while it was being copied: nothing was written at {remote}",
                )
            if not _retryable(end) or attempt == attempts:
                raise failure(end)
            ask = True
            await _pause(attempt)
        raise CopyError(ClientCode.LOST, "the copy did not complete")  # pragma: no cover
    finally:
        f.close()


def _open_source(local: str | os.PathLike[str]) -> tuple[os.stat_result, BinaryIO]:
    f = open(local, "rb")
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CopyError(ClientCode.LOCAL, f"cannot copy {os.fspath(local)!r}: not a regular file")
    except BaseException:
        f.close()
        raise
    return st, f


async def upload_bytes(
    mc: MindClient,
    hand: str,
    data: bytes | AsyncIterable[bytes],
    remote: str,
    **kw: Any,
) -> CopyResult:
    """Upload in-memory data (bytes or an async iterator of bytes): spooled to a temporary file
    (a retry needs the bytes again)."""
    fd, spool = tempfile.mkstemp(prefix="mindhand-cp-")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                async for chunk in data:
                    await asyncio.to_thread(f.write, chunk)
        return await upload(mc, hand, spool, remote, **kw)
    finally:
        os.unlink(spool)


# --- download ----------------------------------------------------------------------------------


async def _start_get(mc: MindClient, hand: str, remote: str, offset: int) -> Any:
    """A `get_file` run (its `RunHandle`) whose bytes come as the `stdout` stream, from `offset`."""
    return await mc.start(
        hand,
        "get_file",
        {"path": remote, "offset": offset},
        timeout=TIMEOUT_S,
        stream=True,
        verify=False,  # the file's (or each tree entry's) own sha256 is checked
        output_limit=1 << 50,
        watch=False,
    )


async def _get_attempt(
    mc: MindClient, hand: str, remote: str, offset: int, write: Callable[[bytes], None]
) -> tuple[RunEnd, int]:
    handle = await _start_get(mc, hand, remote, offset)
    got = 0
    async for ev in handle.events():
        if isinstance(ev, StreamData) and ev.stream == "stdout" and ev.data:
            write(ev.data)
            got += len(ev.data)
        elif isinstance(ev, RunEnd):
            return ev, got
    raise ClientError(ErrorCode.INTERNAL_ERROR, "event stream ended without run_end")  # pragma: no cover


async def download_iter(
    mc: MindClient,
    hand: str,
    remote: str,
    *,
    reconnect: Reconnect | None = None,
    attempts: int = ATTEMPTS,
    result: CopyResult | None = None,
) -> AsyncIterator[bytes]:
    """The bytes of `remote` on `hand`, in order, each exactly once (a lost run is resumed where
    the last chunk ended). The whole file's sha256 is checked at the end: a mismatch raises
    `CopyError(ClientCode.MISMATCH)` after the last chunk (a consumer that must not act on unverified
    bytes should use `download`, which renames only verified files)."""
    link = _Link(mc, reconnect)
    h = hashlib.sha256()
    pos = 0
    res = result if result is not None else CopyResult(path=remote, size=0, sha256="")
    res.attempts = 0
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        res.attempts = attempt
        if attempt > 1:
            res.resumed_from.append(pos)
        try:
            handle = await _start_get(link.mc, hand, remote, pos)
            end: RunEnd | None = None
            async for ev in handle.events():
                if isinstance(ev, StreamData) and ev.stream == "stdout" and ev.data:
                    h.update(ev.data)
                    pos += len(ev.data)
                    res.sent += len(ev.data)
                    yield ev.data
                elif isinstance(ev, RunEnd):
                    end = ev
        except ClientError as exc:
            if attempt < attempts and await link.recover(exc):
                await _pause(attempt)
                continue
            raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
        assert end is not None
        if end.state is RunState.SUCCEEDED:
            value = end.value or {}
            res.size, res.sha256 = int(value.get("size", pos)), str(value.get("sha256", ""))
            res.mode, res.mtime = value.get("mode"), value.get("mtime")
            res.duration_s = time.monotonic() - started
            if pos != res.size or h.hexdigest() != res.sha256:
                raise CopyError(
                    ClientCode.MISMATCH,
                    f"{remote}: got {pos} bytes with sha256 {h.hexdigest()[:16]}..., the Hand says {res.size} bytes, {res.sha256[:16]}...",
                )
            return
        if not _retryable(end) or attempt == attempts:
            raise failure(end)
        await _pause(attempt)


async def _source_file(link: _Link, hand: str, remote: str) -> dict[str, Any]:
    """What `stat_file` says of a download's source, which must be a regular file."""
    try:
        info = await stat_remote(link.mc, hand, remote)
    except CopyError:
        raise
    except ClientError as exc:
        raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
    if info.get("type") is None:
        raise CopyError(ClientCode.FAILED, f"cannot read {remote!r} on {hand}: no such file")
    if info["type"] != "file":
        kind = KINDS.get(info["type"], "not a regular file")
        hint = " (use -r)" if info["type"] == "dir" else ""
        raise CopyError(ClientCode.FAILED, f"cannot read {remote!r} on {hand}: it is {kind}{hint}")
    return info


async def _unchanged_down(
    mc: MindClient, hand: str, remote: str, theirs: dict[str, Any], dir_fd: int, name: str, checksum: bool
) -> str | None:
    """Whether the local `name` in `dir_fd` (never through a link) is already the file `theirs`
    describes: None if not, else its sha256 ("" when compared by size and time only)."""
    try:
        mine = _local_info(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except OSError:
        return None
    if mine["type"] != "file" or mine["size"] != theirs.get("size"):
        return None
    if checksum:
        mine["sha256"] = await asyncio.to_thread(localfs.sha256_at, dir_fd, name)
        if mine["sha256"] is None:
            return None
        theirs = {**theirs, "sha256": await remote_sha256(mc, hand, remote)}
    return str(mine.get("sha256") or "") if is_unchanged(mine, theirs, checksum) else None


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _final_mode_time(result: CopyResult, preserve: bool) -> tuple[int, float | None]:
    """The mode (never setuid; through the umask unless `preserve`) and time a download gets.
    A time no file can have (NaN, 1e300: a Hand's lie) is refused before the rename."""
    mode = rules.safe_mode(result.mode if isinstance(result.mode, int) else 0o644)
    if not preserve:
        return mode & ~_umask(), None
    if result.mtime is None:
        return mode, None
    try:
        return mode, rules.check_mtime(float(result.mtime))
    except (TypeError, ValueError) as exc:
        raise CopyError(ClientCode.FAILED, f"{result.path}: the Hand sent a bad modification time ({exc})") from None


async def download(
    mc: MindClient,
    hand: str,
    remote: str,
    local: str | os.PathLike[str],
    *,
    preserve: bool = False,
    resume: bool = True,
    skip_unchanged: bool = False,
    checksum: bool = False,
    on_progress: Progress | None = None,
    reconnect: Reconnect | None = None,
    attempts: int = ATTEMPTS,
    into: int | None = None,
) -> CopyResult:
    """Copy `remote` on `hand` to the local file `local`: a part file beside it, renamed only once
    the whole file's sha256 matches. With `resume`, a part file an earlier call left is continued.
    With `skip_unchanged` (or `checksum`), a file already the same at `local` is not fetched, by
    `upload`'s rule (`CopyResult.skipped`).
    `into`: a handle on `local`'s directory (a tree copied down gives the one it made), so the
    file is written there whatever its path now leads to (`mind.client.localfs`)."""
    started = time.monotonic()
    local = _absolute(local)
    link = _Link(mc, reconnect)
    info = await _source_file(link, hand, remote)
    cid = rules.copy_id(f"{hand}:{remote}", local, int(info["size"]), f"mtime:{info['mtime']!r}")
    try:
        if into is None:
            dir_fd, name = await asyncio.to_thread(localfs.open_parent, local)
        else:
            dir_fd, name = os.dup(into), os.path.basename(local)
    except localfs.LocalRefused as exc:
        raise CopyError(ClientCode.LOCAL, exc.message) from None
    try:
        if skip_unchanged or checksum:
            sha = await _unchanged_down(link.mc, hand, remote, info, dir_fd, name, checksum)
            if sha is not None:
                return _skipped(local, info, sha, started)
        part = localfs.LocalPart(dir_fd, name, local, cid)
    finally:
        os.close(dir_fd)
    try:
        pos = await asyncio.to_thread(part.open, resume)
    except OSError as exc:
        part.close()
        raise CopyError(ClientCode.LOCAL, f"cannot write {local!r}: {exc.strerror or exc}") from None
    result = CopyResult(path=local, size=int(info["size"]), sha256="", attempts=0)
    if pos:
        result.resumed_from.append(pos)
    try:
        for attempt in range(1, attempts + 1):
            result.attempts = attempt
            if attempt > 1:
                result.resumed_from.append(part.pos)

            def write(data: bytes) -> None:
                part.write(data)
                result.sent += len(data)
                if on_progress is not None:
                    on_progress(part.pos, result.size)

            try:
                end, _ = await _get_attempt(link.mc, hand, remote, part.pos, write)
            except OSError as exc:
                raise CopyError(ClientCode.LOCAL, f"cannot write {local!r}: {exc.strerror or exc}") from None
            except ClientError as exc:
                if attempt < attempts and await link.recover(exc):
                    await _pause(attempt)
                    continue
                raise CopyError(ClientCode.LOST, f"cannot copy from {hand}: {exc.message}") from None
            if end.state is RunState.SUCCEEDED:
                value = end.value or {}
                result.size, result.sha256 = int(value["size"]), str(value["sha256"])
                result.mode, result.mtime = value.get("mode"), value.get("mtime")
                mode, mtime = _final_mode_time(result, preserve)
                try:
                    verified = await asyncio.to_thread(part.finish, result.size, result.sha256, mode, mtime)
                except OSError as exc:
                    raise CopyError(ClientCode.LOCAL, f"cannot write {local!r}: {exc.strerror or exc}") from None
                if not verified:
                    raise CopyError(
                        ClientCode.MISMATCH,
                        f"{local}: sha256 mismatch (the file changed on the Hand, or bytes were damaged)",
                    )
                result.duration_s = time.monotonic() - started
                return result
            if not _retryable(end) or attempt == attempts:
                if end.state is not RunState.LOST:
                    part.drop()  # a failure, not an interruption: nothing to resume
                raise failure(end)
            await _pause(attempt)
        raise CopyError(ClientCode.LOST, "the copy did not complete")  # pragma: no cover
    finally:
        part.close()


def _absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))
