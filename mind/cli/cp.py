"""`mind cp`: files to and from Hands with scp's syntax (DESIGN §11 Files; `mind/client/files.py`).

    mind cp [-r] [-p] [-c] [--resume] [--json] SRC... DST

An operand `HAND:PATH` is on a Hand (PATH relative to its root; `HAND:` alone is the root), anything
else is local (write `./a:b` for a local name with a colon); a remote source's last part may be a
pattern (`box:logs/*.log`), matched on the Hand. `-` is standard input (as a source) or
standard output (as the destination). Local to Hand and Hand to local; Hand to Hand goes through
this machine (downloaded to a temporary file, then uploaded). With `-r` a directory travels as one
run (`mind.client.trees`), skipping files already the same on the other side (size and time, or
sha256 with `-c`), and says how many it sent and skipped; `dir/` (a trailing slash) is the
directory's contents, copied into the destination itself, as rsync reads it (`contents_only`), so
the same command line run again lands on the same files. A single file is compared the same way
with `-p` or `-c`, and one already the same is skipped and said so.

Exit codes (with the table in `mind/cli/exits.py`): 0 every file copied and verified; 1 a copy
failed (no such file, permission denied, disk full on the Hand, digest mismatch, a special file or
an outside symlink skipped); 125 refused (policy, path outside the root, over the Hand's size
limit, Mind unreachable); 255 the link did not come back within the retries; 130 interrupted by
Ctrl-C; 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import posixpath
import stat
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mind.cli import options
from mind.cli.connection import open_client, with_client
from mind.cli.exits import EXIT_COPY_FAILED, EXIT_LOST, EXIT_REFUSED, EXIT_USAGE
from mind.cli.formatting import byte_size, printable
from mind.cli.progress import Status, is_terminal
from mind.client import files, trees
from mind.client.files import CopyError, CopyResult
from mind.errors import ClientCode, ClientError, Code
from protocol import copy as rules
from protocol import limits
from protocol.io import heap

EXIT_FAILED = EXIT_COPY_FAILED


@dataclass(frozen=True)
class Operand:
    hand: str | None
    path: str

    @property
    def remote(self) -> bool:
        return self.hand is not None


def parse_operand(text: str) -> Operand:
    """`HAND:PATH` when the part before the first colon is a Hand name (no slash), else local."""
    head, sep, tail = text.partition(":")
    if sep and head and "/" not in head and limits.LABEL_RE.match(head):
        return Operand(head, tail or ".")
    return Operand(None, text)


COPY_TOOLS = ("put_file", "get_file", "stat_file", "list_tree")
"""The Hand's tools `mind cp` uses (DESIGN §11): a client credential's `--tools` must allow all four."""


def add_parsers(sub: Any) -> None:
    cp = options.command(
        sub,
        "cp",
        help="copy files to and from Hands (scp syntax: HAND:PATH), verified, atomic, resumable",
        description="Copy files between this machine and Hands. HAND:PATH is relative to the Hand's root; "
        "'-' is stdin/stdout; ./a:b is a local name with a colon. Exit: 0 ok, 1 a copy failed, 125 refused, "
        "255 link lost, 130 interrupted (Ctrl-C), 2 usage. Needs the tools " + ", ".join(COPY_TOOLS) + ".",
    )
    options.connection(cp)
    cp.add_argument(
        "-r", "--recursive", action="store_true", help="copy directories (symlinks inside the tree as links)"
    )
    cp.add_argument(
        "-p",
        "--preserve",
        action="store_true",
        help="keep modes and modification times; a file already there with the same size and time is skipped",
    )
    cp.add_argument(
        "-c",
        "--checksum",
        action="store_true",
        help="skip a file only when its sha256 is the same on the other side (default: size and time)",
    )
    cp.add_argument(
        "--resume", action="store_true", help="continue the part file an interrupted `mind cp` of the same file left"
    )
    options.json_output(cp, "one JSON object per copied file (per tree with -r) on stdout")
    cp.add_argument(
        "operands", nargs="+", metavar="PATH", help="sources, then the destination (HAND:PATH, a local path, or -)"
    )
    cp.set_defaults(handler=with_client(copy))


async def copy(mc: Any, args: argparse.Namespace) -> int:
    """The handler: `run` with a reconnect that dials the same Mind again (a copy survives a cut)."""
    return await run(mc, args, lambda: open_client(args))


class _Run:
    def __init__(self, mc: Any, args: argparse.Namespace, reconnect: Callable[[], Awaitable[Any]]) -> None:
        self.mc = mc
        self.first = mc
        self.args = args
        self.reconnect = reconnect
        self.status = Status(sys.stderr, enabled=is_terminal(sys.stderr))
        self.failures = 0
        self.worst = 0
        self.scope_hinted = False

    # --- reporting ---

    def progress(self, name: str, started: float) -> Callable[[int, int], None]:
        def show(done: int, total: int) -> None:
            dt = max(time.monotonic() - started, 1e-6)
            rate = done / dt
            eta = (total - done) / rate if rate > 0 else 0
            pct = 100 * done // total if total else 100
            self.status.show(
                f"{name}  {pct:3d}%  {byte_size(done)}/{byte_size(total)}  {byte_size(rate)}/s  ETA {int(eta)} s"
            )

        return show

    def done(self, res: CopyResult, shown: str) -> None:
        """The --json line; a file skipped as unchanged is also said on stderr, in the words of a
        tree's summary, so a copy that moved nothing says why."""
        self.status.clear()
        if self.args.json:
            out = res.summary()
            out["path"] = shown
            print(json.dumps(out), flush=True)
        if res.skipped:
            print(f"mind: cp: {printable(shown)}: 0 files sent, 1 skipped (unchanged)", file=sys.stderr)

    @property
    def compare(self) -> bool:
        """Whether a single file is compared with the other side before it is sent (-p: size and
        time, -c: sha256), as a tree's files always are."""
        return bool(self.args.preserve or self.args.checksum)

    def fail(self, what: str | None, exc: CopyError | str) -> None:
        self.status.clear()
        msg = exc if isinstance(exc, str) else exc.message
        where = f"{printable(what)}: " if what else ""
        print(f"mind: cp: {where}{printable(msg)}", file=sys.stderr)
        code = EXIT_FAILED
        if isinstance(exc, CopyError):
            codes: dict[Code, int] = {ClientCode.REJECTED: EXIT_REFUSED, ClientCode.LOST: EXIT_LOST}
            code = codes.get(exc.code, EXIT_FAILED)
        if "denied_by_scope" in msg and "tool" in msg and not self.scope_hinted:
            self.scope_hinted = True
            tools = ", ".join(COPY_TOOLS)
            print(
                f"mind: cp: a copy uses the tools {tools}: the credential's scope must allow all four", file=sys.stderr
            )
        self.failures += 1
        self.worst = max(self.worst, code)  # 1 < 125 (refused) < 255 (lost): the gravest one

    # --- the copies ---

    async def put(self, local: str, hand: str, remote: str, make_dirs: bool = False, shown: str | None = None) -> None:
        if not _utf8(remote):
            self.fail(shown or local, NOT_UTF8)
            return
        started = time.monotonic()
        try:
            res = await files.upload(
                self.mc,
                hand,
                local,
                remote,
                preserve=self.args.preserve,
                make_dirs=make_dirs,
                resume=self.args.resume,
                skip_unchanged=self.compare and shown is None,  # (Hand to Hand compared before)
                checksum=self.args.checksum and shown is None,
                on_progress=self.progress(os.path.basename(local), started),
                reconnect=self._reconnect,
            )
        except CopyError as exc:
            self.fail(f"{shown or local} -> {hand}:{remote}", exc)
            return
        self.done(res, f"{hand}:{remote}")

    async def get(self, hand: str, remote: str, local: str, into: int | None = None, shown: str | None = None) -> None:
        """`shown`: how the local side is named to the user (not a temporary file of ours)."""
        started = time.monotonic()
        try:
            res = await files.download(
                self.mc,
                hand,
                remote,
                local,
                preserve=self.args.preserve,
                resume=self.args.resume,
                skip_unchanged=self.compare and shown is None,  # (not into a temporary file of ours)
                checksum=self.args.checksum and shown is None,
                on_progress=self.progress(posixpath.basename(remote), started),
                reconnect=self._reconnect,
                into=into,
            )
        except CopyError as exc:
            self.fail(f"{hand}:{remote} -> {shown or local}", exc)
            return
        if shown is None:
            self.done(res, local)

    async def get_stdout(self, hand: str, remote: str) -> None:
        res = CopyResult(path=remote, size=0, sha256="")
        out = sys.stdout.buffer
        try:
            async for chunk in files.download_iter(self.mc, hand, remote, reconnect=self._reconnect, result=res):
                await asyncio.to_thread(out.write, chunk)
            out.flush()
        except CopyError as exc:
            self.fail(f"{hand}:{remote} -> -", exc)
            return
        except BrokenPipeError:
            self.fail(f"{hand}:{remote} -> -", "the reader of stdout went away")
            return
        if self.args.json:
            print(json.dumps(res.summary()), file=sys.stderr)

    async def _reconnect(self) -> Any:
        """A new connection to the Mind (the old one closed); the caller closes the first client."""
        fresh = await self.reconnect()
        if self.mc is not self.first:
            await self.mc.close()
        self.mc = fresh
        await _group(fresh)
        return fresh

    async def remote_dir(self, hand: str, path: str) -> bool:
        info = await files.stat_remote(self.mc, hand, path)
        return bool(info.get("type") == "dir")

    async def put_tree(self, local: str, hand: str, top: str) -> None:
        """A local directory to `top` on the Hand as one run (`mind.client.trees`): one listing of
        the Hand's side, then every entry that differs in one stream; what is not copied (special
        files, links leading out, names that are not UTF-8, what the Hand refused) is said, exit 1."""
        if not _utf8(top):
            self.fail(local, NOT_UTF8)
            return
        try:
            res = await trees.upload_tree(
                self.mc,
                hand,
                local,
                top,
                preserve=self.args.preserve,
                checksum=self.args.checksum,
                fail=self.fail,
                reconnect=self._reconnect,
                on_progress=self.progress(os.path.basename(local.rstrip("/")) or local, time.monotonic()),
            )
        except CopyError as exc:
            self.fail(f"{local} -> {hand}:{top}", exc)
            return
        self.tree_done(res, f"{hand}:{top}")

    async def get_tree(self, hand: str, remote: str, local: str) -> None:
        """A Hand's directory to `local` as one listing and one run (`mind.client.trees`), built
        through directory handles (`mind.client.localfs`): what the Hand lists is ordered and
        filtered by `protocol.copy.plan_tree`, and the Hand may send only the files asked for, in
        order. A hostile Hand cannot make this write outside `local` (issue 23, attack 1)."""
        try:
            res = await trees.download_tree(
                self.mc,
                hand,
                remote,
                local,
                preserve=self.args.preserve,
                checksum=self.args.checksum,
                fail=self.fail,
                reconnect=self._reconnect,
                on_progress=self.progress(posixpath.basename(remote.rstrip("/")) or hand, time.monotonic()),
            )
        except CopyError as exc:
            self.fail(f"{hand}:{remote} -> {local}", exc)
            return
        self.tree_done(res, local)

    def tree_done(self, res: trees.TreeResult, shown: str) -> None:
        """`N files sent, M skipped (unchanged)` on stderr (stdout is for --json), and the same in
        the --json line."""
        self.status.clear()
        if self.args.json:
            out = res.summary()
            out["path"] = shown
            print(json.dumps(out), flush=True)
        failed = f", {res.failed} not copied" if res.failed else ""
        files = "1 file" if res.sent == 1 else f"{res.sent} files"
        print(
            f"mind: cp: {printable(shown)}: {files} sent, {res.skipped} skipped (unchanged){failed}",
            file=sys.stderr,
        )

    async def call(self, what: str, hand: str, tool: str, targs: dict[str, Any]) -> Any:
        from protocol.states import RunState

        end = await self.mc.exec(hand, tool, targs, timeout=60)
        if end.state is not RunState.SUCCEEDED:
            self.fail(what, files.failure(end))
            return None
        return end.value


# --- local file work (blocking, small: kept out of the coroutines) ---------------------------------


def _local_kind(path: str) -> str:
    """`missing`, `dir` (not a link to one), `file` (or a link to one), or `special`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing" if not os.path.lexists(path) else "special"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "special"


NOT_UTF8 = "not copied: its name is not UTF-8 (a Hand's paths travel as UTF-8, and a lossy name would be another)"


def _utf8(name: str) -> bool:
    """Whether `name` (surrogate-escaped by Python when its bytes are not UTF-8) can travel as is."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _group(mc: Any) -> None:
    """Every run of this copy in one group (a fleet id the Mind mints for this client), so `mind
    runs` lists the copy as one entry, `cp`, with its files and bytes (`mind runs --fleet ID`: its
    parts). A new connection opens a new group: a Mind that restarted knows no id minted before."""
    mc.group = await mc.open_fleet()


async def run(mc: Any, args: argparse.Namespace, reconnect: Callable[[], Awaitable[Any]]) -> int:
    ops = [parse_operand(o) for o in args.operands]
    if len(ops) < 2:
        print("mind: cp: need at least one source and a destination", file=sys.stderr)
        return EXIT_USAGE
    *srcs, dst = ops
    if any(o.remote and not _utf8(o.path) for o in ops):
        print("mind: cp: a HAND:PATH must be UTF-8 (a Hand's paths travel as UTF-8)", file=sys.stderr)
        return EXIT_USAGE
    heap.keep_large_buffers()  # a copy's chunks through this process: their pages kept, not faulted in anew
    job = _Run(mc, args, reconnect)
    try:
        await _group(mc)
        srcs = await _expand_globs(job, srcs)
        if not srcs:
            return job.worst
        return await _copy(job, srcs, dst)
    finally:
        if job.failures:
            _colon_hints(args.operands)


GLOB = frozenset("*?[")


async def _expand_globs(job: _Run, srcs: list[Operand]) -> list[Operand]:
    """`box:logs/*.log`: a remote source whose last part is a pattern names the entries of its
    directory that match it, as scp's remote globs do (fnmatch; a leading `.` only by a pattern
    that starts with one), sorted. Only the last part: the directory is listed with `list_tree`,
    one of the four tools a copy uses anyway. A pattern that matches nothing is a failed copy."""
    import fnmatch

    out: list[Operand] = []
    for s in srcs:
        base = posixpath.basename(s.path)
        if s.hand is None or not GLOB.intersection(base) or GLOB.intersection(posixpath.dirname(s.path)):
            out.append(s)
            continue
        parent = posixpath.dirname(s.path)
        value = await job.call(f"{s.hand}:{s.path}", s.hand, "list_tree", {"path": parent or "."})
        if value is None:
            continue
        kind = trees.listed_type(value)
        if kind != "dir":
            why = "no such directory" if kind is None else "it is not a directory"
            job.fail(f"{s.hand}:{s.path}", f"cannot list {parent or '.'}: {why}")
            continue
        names: list[str] = []
        refused = 0
        for e in value["entries"]:
            name = e.get("path") if isinstance(e, dict) else None
            if not isinstance(name, str) or not fnmatch.fnmatchcase(name, base):
                continue
            if not base.startswith(".") and name.startswith("."):
                continue
            if entry_name(name) is None:
                # A Hand lists no `.`, `..`, empty or slashed name in a directory: one that does is
                # hostile or broken, and its name would move the local target (`out/..`).
                job.fail(f"{s.hand}:{s.path}", f"refused the name {name!r} the Hand listed: not one a copy may make")
                refused += 1
                continue
            names.append(name)
        if not names:
            if not refused:
                job.fail(f"{s.hand}:{s.path}", "no match")
            continue
        out += [Operand(s.hand, posixpath.join(parent, n)) for n in sorted(names)]
    return out


def entry_name(name: str) -> str | None:
    """`name` when it is one directory entry a copy may make on this side (the rule a tree's entries
    obey, `protocol.copy.split_rel`: not empty, `.` or `..`, no `/` or NUL), else None. Every name
    that came from a Hand and becomes part of a local target passes here first."""
    parts = rules.split_rel(name)
    return name if parts is not None and len(parts) == 1 else None


def target_name(src: Operand) -> str | None:
    """The name a source gets inside a destination directory: its last part (scp's rule), `.` for
    the Hand's name for its root, None when it would lead out (`..`)."""
    name = posixpath.basename(src.path.rstrip("/")) or src.hand or "."
    return name if name == "." or entry_name(name) is not None else None


def _colon_hints(operands: list[str]) -> None:
    """After a failure: an operand read as `HAND:PATH` that is also a local file was probably meant
    as the file (`mind cp a:b web1:`); scp's rule is ours, and so is its way out, `./a:b`."""
    for text in operands:
        if parse_operand(text).remote and os.path.lexists(text):
            print(
                f"mind: cp: {printable(text)} was read as HAND:PATH; for the local file write ./{printable(text)}",
                file=sys.stderr,
            )


async def _copy(job: _Run, srcs: list[Operand], dst: Operand) -> int:
    try:
        if dst.remote:
            return await _copy_up(job, srcs, dst)
        return await _copy_down(job, srcs, dst)
    except CopyError as exc:
        job.fail(None, exc)  # (the message names the path)
        return job.worst
    finally:
        job.status.clear()
        if job.mc is not job.first:
            await job.mc.close()


def contents_only(path: str) -> bool:
    """rsync's rule for a directory given as a source: `tree/` (a trailing slash) stands for what
    `tree` holds, copied into the destination itself, whether it exists or not; `tree` without one
    is copied as `DEST/tree` into an existing directory (scp's and rsync's rule). So the same
    command line lands on the same target every time, and a second run finds the first's files to
    skip."""
    return path.endswith("/")


def _local_contents_only(path: str) -> bool:
    """`contents_only` for a local directory; `.` and `..` have no name of their own to give
    (`..` as a name would have put the tree beside the destination, not in it)."""
    path = path.replace(os.sep, "/")
    return contents_only(path) or posixpath.basename(path) in (".", "..")


async def _copy_up(job: _Run, srcs: list[Operand], dst: Operand) -> int:
    assert dst.hand is not None
    into_dir = dst.path.endswith("/") or await job.remote_dir(dst.hand, dst.path)
    if len(srcs) > 1 and not into_dir:
        print(f"mind: cp: {printable(dst.hand)}:{printable(dst.path)} is not a directory", file=sys.stderr)
        return EXIT_FAILED
    for s in srcs:
        if s.remote:
            await _hand_to_hand(job, s, dst, into_dir)
            continue
        kind = "stdin" if s.path == "-" else _local_kind(s.path)
        named = into_dir and not (kind == "dir" and _local_contents_only(s.path))
        target = posixpath.join(dst.path, os.path.basename(s.path.rstrip("/"))) if named else dst.path
        if kind == "stdin":
            await _put_stdin(job, dst.hand, dst.path)
        elif kind == "dir":
            if not job.args.recursive:
                job.fail(s.path, "is a directory (use -r)")
                continue
            await job.put_tree(s.path, dst.hand, target)
        elif kind == "missing":
            job.fail(s.path, "no such file or directory")
        elif kind == "special":
            job.fail(s.path, "not copied: it is a special file (FIFO, socket or device)")
        else:
            await job.put(s.path, dst.hand, target)
    return job.worst


async def _copy_down(job: _Run, srcs: list[Operand], dst: Operand) -> int:
    args = job.args
    if any(not s.remote for s in srcs):
        print("mind: cp: one side must be HAND:PATH (local to local is `cp`'s job)", file=sys.stderr)
        return EXIT_USAGE
    if dst.path == "-":
        if len(srcs) > 1 or args.recursive:
            print("mind: cp: '-' takes one file", file=sys.stderr)
            return EXIT_USAGE
        assert srcs[0].hand is not None
        await job.get_stdout(srcs[0].hand, srcs[0].path)
        return job.worst
    into_dir = _local_kind(dst.path) == "dir"
    if len(srcs) > 1 and not into_dir:
        print(f"mind: cp: {printable(dst.path)} is not a directory", file=sys.stderr)
        return EXIT_FAILED
    for s in srcs:
        assert s.hand is not None
        name = target_name(s)
        if into_dir and name is None and not contents_only(s.path):
            job.fail(f"{s.hand}:{s.path}", f"refused: its name would lead out of {dst.path}")
            continue
        if args.recursive:
            info = await files.stat_remote(job.mc, s.hand, s.path)
            if info.get("type") == "dir":
                await _get_tree_into(job, s, dst.path, into_dir)
                continue
        if into_dir and name is None:
            job.fail(f"{s.hand}:{s.path}", f"refused: its name would lead out of {dst.path}")
            continue
        target = os.path.join(dst.path, name or ".") if into_dir else dst.path
        await job.get(s.hand, s.path, target)
    return job.worst


async def _get_tree_into(job: _Run, src: Operand, dest: str, into_dir: bool) -> None:
    """A Hand's directory to `dest` (`contents_only`'s rule), and, when a copy of `tree` went into
    `DEST/tree` while DEST already held what tree holds (the result of `mind cp -r box:tree DEST`
    run once before, when DEST did not exist), a hint that `box:tree/` updates DEST itself."""
    assert src.hand is not None
    if not into_dir or contents_only(src.path):
        await job.get_tree(src.hand, src.path, dest)
        return
    name = target_name(src)
    assert name is not None  # (refused by the caller)
    target = os.path.join(dest, name)
    new = not await asyncio.to_thread(os.path.lexists, target)
    await job.get_tree(src.hand, src.path, target)
    if new and _mirrors(target, dest, name):
        print(
            f"mind: cp: {printable(dest)} already held what {printable(src.hand)}:{printable(src.path)} holds, "
            f"so this copy made {printable(target)}; to update {printable(dest)} itself, write "
            f"{printable(src.hand)}:{printable(src.path)}/ (a trailing slash: its contents, as rsync reads it)",
            file=sys.stderr,
        )


def _mirrors(made: str, dest: str, name: str) -> bool:
    """Whether every top-level name of the directory `made` (just copied into `dest` as `name`) is
    also in `dest`: then `dest` is most likely an earlier copy of the same tree."""
    try:
        ours = set(os.listdir(made))
        there = set(os.listdir(dest)) - {name}
    except OSError:
        return False
    return bool(ours) and ours <= there


async def _put_stdin(job: _Run, hand: str, remote: str) -> None:
    """Standard input is spooled to a temporary file (its digest is needed before the first byte)."""
    fd, spool = tempfile.mkstemp(prefix="mindhand-cp-stdin-")
    try:
        with os.fdopen(fd, "wb") as f:
            while chunk := await asyncio.to_thread(os.read, sys.stdin.fileno(), 1 << 20):
                f.write(chunk)
        await job.put(spool, hand, remote)
    finally:
        os.unlink(spool)


async def _hand_to_hand(job: _Run, src: Operand, dst: Operand, into_dir: bool) -> None:
    assert src.hand is not None and dst.hand is not None
    if job.args.recursive:
        job.fail(f"{src.hand}:{src.path}", "-r between two Hands is not supported")
        return
    name = target_name(src)
    if into_dir and name is None:
        job.fail(f"{src.hand}:{src.path}", f"refused: its name would lead out of {dst.hand}:{dst.path}")
        return
    target = posixpath.join(dst.path, name or ".") if into_dir else dst.path
    if job.compare and await _same_on_both(job, src.hand, src.path, dst.hand, target):
        return
    with tempfile.TemporaryDirectory(prefix="mindhand-cp-") as tmp:
        local = os.path.join(tmp, "file")
        before = job.failures
        await job.get(src.hand, src.path, local, shown=f"{dst.hand}:{target}")
        if job.failures == before:
            await job.put(local, dst.hand, target, shown=f"{src.hand}:{src.path}")


async def _same_on_both(job: _Run, hand: str, path: str, other: str, target: str) -> bool:
    """Hand to Hand with -p or -c: whether `target` on `other` is already the file `path` on
    `hand` (compared on the Hands, before a byte comes through this machine); said as skipped."""
    try:
        mine = await files.stat_remote(job.mc, hand, path)
        theirs = await files.stat_remote(job.mc, other, target)
    except ClientError:
        return False  # the copy itself will say what is wrong
    if theirs.get("type") != "file" or mine.get("size") != theirs.get("size"):
        return False
    if job.args.checksum:
        mine["sha256"] = await files.remote_sha256(job.mc, hand, path)
        theirs["sha256"] = await files.remote_sha256(job.mc, other, target)
    if not files.is_unchanged(mine, theirs, job.args.checksum):
        return False
    res = CopyResult(path=target, size=int(theirs["size"]), sha256=mine.get("sha256") or "", attempts=0, skipped=True)
    job.done(res, f"{other}:{target}")
    return True
