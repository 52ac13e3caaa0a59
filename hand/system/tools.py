"""The tools a Hand offers, their argument models, and their implementations.

`prepare(tool, args, root)` validates everything that can be known before anything runs (the
arguments, every path against the root) and returns what to execute: a `ProcessSpec` for the
command tools, a `FileCall` (run in a thread) for the file tools. Refusals raise `Refusal` with
the reject code, so the run table answers `rejected` BEFORE `accepted` and nothing half-starts.

Command tools run sandboxed (`hand.system.sandbox`): a scrubbed environment (`child_env`), the run's
resource `limits` within the Hand's caps (a request over a cap is refused here, before anything
runs), and the `--run-as` user. File tools refuse special files (devices, FIFOs, sockets): a read
must never block on a FIFO or stream a device forever, and a write never goes through a symlink.

File tools act on what `paths.locate` finds by walking from a handle on the root (never on a path
string checked earlier: issue 13, item 2), and, on a Hand with `--run-as`, on threads whose
filesystem identity is that user (`hand.system.fsuser`): the kernel checks access as the user, and
what they create is the user's. Nothing they write carries setuid, setgid or sticky bits (item 1):
an overwrite keeps only the old file's permission bits, and an append to a file that has them clears
them.

A tool that ran and failed raises `ToolFailed` (or an `OSError`) whose message names the caller's
own path, never the Hand's absolute one; the run table sanitises it once more on the way out.
"""

from __future__ import annotations

import heapq
import os
import secrets
import stat
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from hand.core.forwards import allowed, endpoint
from hand.core.policy import KNOWN_TOOLS
from hand.system import copy, copytree
from hand.system.cgroups import CgroupHost
from hand.system.fsuser import as_user
from hand.system.paths import (
    Located,
    PathRefused,
    describe_kind,
    entry_type,
    locate,
    resolve,
    resolve_entry,
    show,
    wire_name,
)
from hand.system.sandbox import OverCap, ResourceLimits, RunAs, Sandbox
from protocol import copy as copy_rules
from protocol import limits
from protocol.codes import RejectCode
from protocol.errors import MindhandError

READ_FILE_DEFAULT = 1 << 20


class Refusal(MindhandError):
    """The run is refused before anything ran. `message` is safe to send."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ToolFailed(MindhandError):
    """A tool ran and failed. `message` is meant for the caller (no absolute Hand paths)."""


# --- argument models --------------------------------------------------------------------------


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _env_key(value: str) -> str:
    if not value or "=" in value or "\x00" in value:
        raise ValueError("environment names must be non-empty, without '=' or NUL")
    if value.startswith("MINDHAND_"):
        # The README promises MINDHAND_* never reaches a child; a request may not set one either.
        raise ValueError("MINDHAND_* variables are the Hand's own and never reach a command")
    return value


NoNul = Annotated[str, AfterValidator(_no_nul)]
EnvKey = Annotated[str, AfterValidator(_env_key)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _ProcessArgs(_Args):
    cwd: str | None = None
    env: dict[EnvKey, NoNul] | None = None
    stdin: bytes | None = None
    limits: ResourceLimits | None = None


class ExecArgs(_ProcessArgs):
    argv: list[NoNul] = Field(min_length=1)

    @pydantic.field_validator("argv")
    @classmethod
    def _program(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("argv[0] must name a program")
        return argv


class ShellArgs(_ProcessArgs):
    command: Annotated[NoNul, Field(min_length=1)]


class ReadFileArgs(_Args):
    path: str
    offset: int = Field(0, ge=0)
    limit: int = Field(READ_FILE_DEFAULT, ge=0, le=limits.READ_FILE_MAX)


class WriteFileArgs(_Args):
    path: str
    data: bytes | str
    mode: Literal["overwrite", "append", "create"] = "overwrite"
    make_dirs: bool = False


class ListDirArgs(_Args):
    path: str = "."


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
CopyId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class PutFileArgs(_Args):
    """`put_file` (`mind cp` to a Hand): a regular file's bytes come as the run's `stdin` stream
    from `offset` (a resume point `stat_file` gave); `type` dir/symlink make a tree's other entries;
    `type: "tree"`: a whole tree comes as the stream (`protocol.treestream`), `path` its top, `mode`
    and `mtime` the top's. A tree is a `put_file` so that the Hand's policy and a credential's
    scope for `put_file` govern it exactly as they govern its files one by one."""

    path: str
    type: Literal["file", "dir", "symlink", "tree"] = "file"
    size: int = Field(0, ge=0)
    sha256: Sha256 | None = None
    digest_follows: bool = False
    """Instead of `sha256`: the stream ends with the file's sha256 (32 bytes) after its `size`
    bytes, so the sender hashes as it sends (one pass over the file, not two)."""
    copy_id: CopyId | None = None
    offset: int = Field(0, ge=0)
    mode: int | None = Field(None, ge=0, le=0o7777)
    mtime: float | None = None
    preserve: bool = False
    make_dirs: bool = False
    target: str | None = None

    @pydantic.field_validator("mtime")
    @classmethod
    def _mtime(cls, mtime: float | None) -> float | None:
        """Checked before anything is made: 1e300 or NaN once failed in `utime` after the
        directory was created (issue 23)."""
        return None if mtime is None else copy_rules.check_mtime(mtime)


class GetFileArgs(_Args):
    """`paths`: a tree's files below the directory `path`, sent in this order as one stream
    (`protocol.treestream`); a `get_file` for the same reason a tree upload is a `put_file`."""

    path: str
    offset: int = Field(0, ge=0)
    paths: list[str] | None = Field(None, max_length=copy_rules.TREE_PATHS_MAX)


class ForwardArgs(_Args):
    """One tunnelled connection (`mind forward`): to `host:port` as seen from the Hand, or to the
    Unix socket `path` inside its root. `check`: only say whether it is allowed (and where it goes),
    connecting nothing: what `mind forward` asks before it listens."""

    host: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    port: int | None = Field(None, ge=1, le=65535)
    path: str | None = None
    check: bool = False

    @pydantic.model_validator(mode="after")
    def _one(self) -> ForwardArgs:
        if (self.path is None) == (self.host is None):
            raise ValueError("give host and port, or path (a Unix socket)")
        if self.host is not None and self.port is None:
            raise ValueError("host needs a port")
        if self.path is not None and self.port is not None:
            raise ValueError("a Unix socket path takes no port")
        return self


class ListenArgs(_Args):
    """`mind forward -R`: the Hand listens on `bind:port` (its loopback: a wider bind is refused)
    and says on the run's stdout, one JSON line each, where it listens and every connection it
    accepts (a token the client claims with a `forward` run of `accepted`)."""

    listen: Literal[True]
    bind: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)


class ClaimArgs(_Args):
    """A connection the Hand accepted for a `-R` forward, taken by the client's run: its bytes are
    then carried as a `forward` run's (`close`: the client could not reach its side; reset it)."""

    accepted: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    close: bool = False


@dataclass(frozen=True)
class ListenTarget:
    bind: str
    port: int


@dataclass(frozen=True)
class ClaimTarget:
    token: str
    close: bool
    shown: str = "the accepted connection"


LOOPBACK_BINDS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class ForwardTarget:
    """Where a `forward` run connects (`hand.aio.forwardrun`), checked against `allow` there, after
    the lookup (the addresses checked are the ones connected to)."""

    host: str | None
    port: int | None
    path: Path | None
    shown: str
    allow: tuple[str, ...]


class StatFileArgs(_Args):
    path: str
    copy_id: CopyId | None = None


class ListTreeArgs(_Args):
    path: str = "."
    sha256: bool = False
    """Each file's sha256 too (`mind cp --checksum`: one call hashes the whole tree)."""


# --- what prepare() returns ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessSpec:
    argv: tuple[str, ...]
    cwd: Path
    env: dict[str, str]
    stdin: bytes | None
    limits: ResourceLimits | None = None
    """The effective limits (the request within the Hand's caps); None: unlimited."""
    run_as: RunAs | None = None
    executable: str | None = None
    """Run this program with `argv` as given (a login shell's argv[0] is `-bash`)."""
    cgroups: CgroupHost | None = None
    """Where the run gets a cgroup of its own (None: this Hand has none: process-group kill)."""


@dataclass(frozen=True)
class FileCall:
    call: Callable[[], dict[str, Any]]
    """Blocking: the run table runs it with `asyncio.to_thread`..."""
    quick: bool = False
    """...unless it is known to be small (a read of at most QUICK_READ_BYTES): then inline, since a
    thread hop costs more than the read, and the loop is not blocked for longer than ~0.1 ms."""
    executor: Executor | None = None
    """Where to run it instead of the default pool: the run's user's threads (`hand.system.fsuser`);
    then never inline, since the loop's thread is the Hand's (root's) identity."""


@dataclass(frozen=True)
class StreamCall:
    """A file tool whose bytes are a stream (`put_file` of a file reads `stdin`, `get_file` writes
    `stdout`): `hand.aio.copyrun` drives `make()`'s object, each blocking step on `executor` (None:
    the default pool) through `guard` (the run-as check)."""

    kind: Literal["put", "get", "forward", "listen", "claim"]
    make: Callable[[], Any]
    executor: Executor | None = None
    guard: Callable[[Callable[[], Any]], Callable[[], Any]] = lambda call: call
    copy_id: str | None = None
    tree: bool = False
    """A whole tree in the stream (`hand.system.copytree`)."""


Prepared = ProcessSpec | FileCall | StreamCall


DEFAULT_SANDBOX = Sandbox()


def child_env(extra: dict[str, str] | None, sandbox: Sandbox = DEFAULT_SANDBOX) -> dict[str, str]:
    """The environment a command gets (DESIGN §9): the allowed part of the Hand's own environment
    (never `MINDHAND_*`, never a value holding a secret), the `--run-as` identity, then the run's
    `env` on top. See `hand.system.sandbox`."""
    return sandbox.child_env(extra)


def _describe(exc: pydantic.ValidationError) -> str:
    """First error's location and message, never the input value (it may be a secret or huge)."""
    errs = exc.errors(include_input=False, include_url=False, include_context=False)
    if not errs:
        return "invalid arguments"
    first = errs[0]
    loc = ".".join(str(x)[:32] for x in first.get("loc", ())) or "(args)"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {first.get('msg', 'invalid')}{more}"[:300]


def _validate(model: type[_Args], tool: str, args: dict[str, Any]) -> Any:
    try:
        return model.model_validate(args)
    except pydantic.ValidationError as exc:
        raise Refusal(RejectCode.INVALID_REQUEST, f"invalid {tool} arguments: {_describe(exc)}") from None


def _path(root: Path, user_path: str) -> Path:
    try:
        return resolve(root, user_path)
    except PathRefused as exc:
        raise Refusal(RejectCode.PATH_OUTSIDE_ROOT, exc.message) from None


def _cwd(root: Path, user_cwd: str | None) -> Path:
    cwd = _path(root, user_cwd) if user_cwd is not None else Path(os.path.realpath(root))
    if not cwd.is_dir():
        raise Refusal(RejectCode.INVALID_REQUEST, f"cwd {show(user_cwd or '.')} is not a directory")
    return cwd


def _process(argv: tuple[str, ...], a: _ProcessArgs, root: Path, sandbox: Sandbox) -> ProcessSpec:
    try:
        granted = sandbox.limits_for(a.limits)
    except OverCap as exc:
        raise Refusal(RejectCode.INVALID_REQUEST, str(exc)) from None
    return ProcessSpec(
        argv,
        _cwd(root, a.cwd),
        child_env(a.env, sandbox),
        a.stdin,
        granted,
        sandbox.run_as,
        cgroups=sandbox.cgroups if sandbox.cgroups.enabled else None,
    )


def _prepare_exec(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: ExecArgs = _validate(ExecArgs, "exec", args)
    return _process(tuple(a.argv), a, root, sandbox)


def _prepare_shell(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: ShellArgs = _validate(ShellArgs, "shell", args)
    return _process(("/bin/sh", "-c", a.command), a, root, sandbox)


def _entry(root: Path, user_path: str) -> Path:
    try:
        return resolve_entry(root, user_path)
    except PathRefused as exc:
        raise Refusal(RejectCode.PATH_OUTSIDE_ROOT, exc.message) from None


def _file_call(call: Callable[[], dict[str, Any]], sandbox: Sandbox, quick: Callable[[], bool]) -> FileCall:
    """Where a file call runs: on the run's user's threads with `--run-as`, else inline if `quick`,
    else on the default pool."""
    if sandbox.run_as is not None:
        pool = as_user(sandbox.run_as)
        return FileCall(pool.wrap(call), executor=pool.executor)
    return FileCall(call, quick=quick())


def _prepare_read_file(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: ReadFileArgs = _validate(ReadFileArgs, "read_file", args)
    path = _path(root, a.path)  # the admission check; the read walks again from the root's handle
    return _file_call(
        lambda: read_file(root, a.path, a.offset, a.limit, show(a.path)), sandbox, lambda: _small(path, a.limit)
    )


QUICK_READ_BYTES = 64 << 10


def _small(path: Path, limit: int) -> bool:
    if limit <= QUICK_READ_BYTES:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return True  # it will fail fast
    return stat.S_ISREG(st.st_mode) and st.st_size <= QUICK_READ_BYTES


def _prepare_write_file(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: WriteFileArgs = _validate(WriteFileArgs, "write_file", args)
    _entry(root, a.path)  # the last component as named: a symlink there is refused
    data = a.data.encode("utf-8") if isinstance(a.data, str) else a.data
    return _file_call(lambda: write_file(root, a.path, data, a.mode, a.make_dirs, show(a.path)), sandbox, _never)


def _prepare_list_dir(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: ListDirArgs = _validate(ListDirArgs, "list_dir", args)
    _path(root, a.path)
    return _file_call(lambda: list_dir(root, a.path, show(a.path)), sandbox, _never)


def _never() -> bool:
    return False


def _stream_call(
    kind: Literal["put", "get"], make: Callable[[], Any], sandbox: Sandbox, cid: str | None, tree: bool = False
) -> StreamCall:
    if sandbox.run_as is not None:
        pool = as_user(sandbox.run_as)
        return StreamCall(kind, make, pool.executor, pool.wrap, cid, tree)
    return StreamCall(kind, make, copy_id=cid, tree=tree)


def _copy_errors(call: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        try:
            return call()
        except copy.CopyFailed as exc:
            raise ToolFailed(exc.message) from None

    return run


def _prepare_put_file(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: PutFileArgs = _validate(PutFileArgs, "put_file", args)
    _entry(root, a.path)  # the last component as named; the write walks again from the root's handle
    shown = show(a.path)
    if a.type == "dir":
        return _file_call(_copy_errors(lambda: copy.make_dir(root, a.path, shown, a.mode, a.mtime)), sandbox, _never)
    if a.type == "symlink":
        if a.target is None or os.path.isabs(a.path):
            raise Refusal(RejectCode.INVALID_REQUEST, "a symlink needs a target and a path relative to the root")
        target = a.target
        return _file_call(_copy_errors(lambda: copy.make_link(root, a.path, shown, target)), sandbox, _never)
    if a.type == "tree":
        cap_tree = sandbox.max_upload_bytes

        def make_tree() -> copytree.TreeUpload:
            return copytree.TreeUpload(root, a.path, shown, a.mode, a.mtime, a.preserve, cap_tree)

        return _stream_call("put", make_tree, sandbox, None, tree=True)
    if a.copy_id is None or (a.sha256 is None) != a.digest_follows:
        raise Refusal(
            RejectCode.INVALID_REQUEST, "put_file of a file needs size, copy_id, and sha256 or digest_follows (one)"
        )
    cap = sandbox.max_upload_bytes
    if cap is not None and a.size > cap:  # refused before a byte is written
        raise Refusal(
            RejectCode.INVALID_REQUEST, f"{shown} is {a.size} bytes, over this hand's max_upload_bytes ({cap})"
        )
    if a.offset > a.size:
        raise Refusal(RejectCode.INVALID_REQUEST, f"offset {a.offset} is past the size {a.size}")
    sha, cid = a.sha256, a.copy_id

    def make() -> copy.Upload:
        return copy.Upload(root, a.path, shown, cid, a.size, sha, a.offset, a.mode, a.mtime, a.preserve, a.make_dirs)

    return _stream_call("put", make, sandbox, cid)


def _prepare_get_file(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: GetFileArgs = _validate(GetFileArgs, "get_file", args)
    _path(root, a.path)
    shown = show(a.path)
    if a.paths is not None:
        bad = next((p for p in a.paths if copy_rules.split_rel(p) is None), None)
        if bad is not None:
            raise Refusal(
                RejectCode.INVALID_REQUEST, f"get_file paths: {show(bad)} is not a plain path inside the tree"
            )
        paths = list(a.paths)
        return _stream_call("get", lambda: copytree.TreeDownload(root, a.path, shown, paths), sandbox, None, tree=True)
    return _stream_call("get", lambda: copy.Download(root, a.path, shown, a.offset), sandbox, None)


def _prepare_forward(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    if "listen" in args:
        lis: ListenArgs = _validate(ListenArgs, "forward", args)
        literal = ip_literal(lis.bind)
        if lis.bind not in LOOPBACK_BINDS and not (literal is not None and literal.startswith("127.")):
            raise Refusal(RejectCode.DENIED_BY_POLICY, f"this hand listens for -R only on its loopback, not {lis.bind}")
        return StreamCall("listen", lambda: ListenTarget(lis.bind, lis.port))
    if "accepted" in args:
        claim: ClaimArgs = _validate(ClaimArgs, "forward", args)
        return StreamCall("claim", lambda: ClaimTarget(claim.accepted, claim.close))
    a: ForwardArgs = _validate(ForwardArgs, "forward", args)
    if a.path is not None:
        where = _path(root, a.path)  # inside the root, as every path a peer names
        target = ForwardTarget(None, None, where, a.path, sandbox.forward_allow)
    else:
        assert a.host is not None and a.port is not None
        target = ForwardTarget(a.host, a.port, None, endpoint(a.host, a.port), sandbox.forward_allow)
        literal = ip_literal(a.host)
        if literal is not None and not allowed(target.allow, a.host, a.port, [literal]):
            raise Refusal(RejectCode.DENIED_BY_POLICY, _not_allowed(target))
    if a.check:
        return FileCall(lambda: check_forward(target))
    return StreamCall("forward", lambda: target)


def check_forward(target: ForwardTarget) -> dict[str, Any]:
    """Blocking (a name lookup): the destination allowed, and where it goes; ToolFailed if not."""
    if target.path is not None:
        if not stat.S_ISSOCK(_stat_or_fail(target).st_mode):
            raise ToolFailed(f"{target.shown} is not a Unix socket")
        return {"to": target.shown}
    assert target.host is not None and target.port is not None
    addresses = resolve_forward(target)
    return {"to": target.shown, "addresses": addresses}


def _stat_or_fail(target: ForwardTarget) -> os.stat_result:
    assert target.path is not None
    try:
        return os.stat(target.path)
    except OSError as exc:
        raise ToolFailed(f"{target.shown}: {exc.strerror or exc}") from None


def resolve_forward(target: ForwardTarget) -> list[str]:
    """Blocking: the addresses `target` resolves to, all allowed by the Hand's `--forward-allow`
    (or the name itself is); ToolFailed otherwise."""
    import socket

    assert target.host is not None and target.port is not None
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolFailed(f"cannot resolve {target.host}: {exc.strerror}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allowed(target.allow, target.host, target.port, addresses):
        raise ToolFailed(_not_allowed(target))
    return addresses


def _not_allowed(target: ForwardTarget) -> str:
    return f"{target.shown} is not a destination this hand allows (--forward-allow; default: its loopback)"


def ip_literal(host: str) -> str | None:
    """`host` as an address when it is one (then the policy is decided at admission: `rejected`)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def _prepare_stat_file(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: StatFileArgs = _validate(StatFileArgs, "stat_file", args)
    _entry(root, a.path)
    shown = show(a.path)
    return _file_call(_copy_errors(lambda: copy.stat_file(root, a.path, shown, a.copy_id)), sandbox, _never)


def _prepare_list_tree(args: dict[str, Any], root: Path, sandbox: Sandbox) -> Prepared:
    a: ListTreeArgs = _validate(ListTreeArgs, "list_tree", args)
    _path(root, a.path)
    shown = show(a.path)
    return _file_call(_copy_errors(lambda: copy.list_tree(root, a.path, shown, a.sha256)), sandbox, _never)


_PREPARE: dict[str, Callable[[dict[str, Any], Path, Sandbox], Prepared]] = {
    "exec": _prepare_exec,
    "shell": _prepare_shell,
    "read_file": _prepare_read_file,
    "write_file": _prepare_write_file,
    "list_dir": _prepare_list_dir,
    "put_file": _prepare_put_file,
    "get_file": _prepare_get_file,
    "stat_file": _prepare_stat_file,
    "list_tree": _prepare_list_tree,
    "forward": _prepare_forward,
}
assert frozenset(_PREPARE) == KNOWN_TOOLS, "policy.KNOWN_TOOLS and the tool table disagree"


def prepare(tool: str, args: dict[str, Any], root: Path, sandbox: Sandbox = DEFAULT_SANDBOX) -> Prepared:
    builder = _PREPARE.get(tool)
    if builder is None:
        raise Refusal(RejectCode.UNKNOWN_TOOL, f"this hand has no tool {tool!r}")
    return builder(args, root, sandbox)


# --- file tools (blocking; run in a thread) -------------------------------------------------------


def _failed(what: str, shown: str, exc: OSError) -> ToolFailed:
    return ToolFailed(f"cannot {what} {shown}: {exc.strerror or type(exc).__name__}")


def _locate(
    what: str, root: Path, user_path: str, shown: str, *, follow_last: bool, make_dirs: bool = False
) -> Located:
    """`paths.locate`, with a refusal (a link swapped in since admission) as this tool's failure."""
    try:
        return locate(root, user_path, follow_last=follow_last, make_dirs=make_dirs)
    except PathRefused as exc:
        raise ToolFailed(f"cannot {what}: {exc.message}") from None


def read_file(root: Path, user_path: str, offset: int, limit: int, shown: str) -> dict[str, Any]:
    """Read up to `limit` bytes at `offset`. Special files are refused before opening: opening a
    FIFO for reading would block until a writer appears, and a device may never end."""
    try:
        with _locate("read", root, user_path, shown, follow_last=True) as at:
            st = os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                hint = "; use list_dir" if stat.S_ISDIR(st.st_mode) else ""
                raise ToolFailed(f"cannot read {shown}: it is {describe_kind(st.st_mode)}{hint}")
            fd = os.open(at.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.parent)
    except OSError as exc:
        raise _failed("read", shown, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between stat and open
            raise ToolFailed(f"cannot read {shown}: it is {describe_kind(st.st_mode)}")
        size = st.st_size
        chunks: list[bytes] = []
        got = 0
        while got < limit:
            chunk = os.pread(fd, limit - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise _failed("read", shown, exc) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return {"data": data, "size": size, "offset": offset, "eof": offset + len(data) >= size}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


def write_file(root: Path, user_path: str, data: bytes, mode: str, make_dirs: bool, shown: str) -> dict[str, Any]:
    """`overwrite` is atomic (a temp file in the same directory, then `rename`): a reader sees the
    old content or the new one, never half of it, and a crash leaves the old file intact."""
    try:
        try:
            at = _locate("write", root, user_path, shown, follow_last=False, make_dirs=make_dirs)
        except FileNotFoundError:
            raise ToolFailed(f"cannot write {shown}: its directory does not exist (set make_dirs)") from None
        with at:
            try:
                existing: os.stat_result | None = os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and mode == "create":
                raise ToolFailed(f"cannot create {shown}: it already exists")
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise ToolFailed(f"cannot write {shown}: it is {describe_kind(existing.st_mode)}")
            if mode == "overwrite":
                _replace_atomically(at, data, existing)
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                flags |= os.O_APPEND if mode == "append" else os.O_EXCL
                fd = os.open(at.name, flags, 0o666, dir_fd=at.parent)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise ToolFailed(f"cannot write {shown}: it is {describe_kind(st.st_mode)}")
                    if st.st_mode & _SPECIAL_BITS:  # never leave a setuid file behind a write
                        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
                    _write_all(fd, data)
                finally:
                    os.close(fd)
    except FileExistsError:
        raise ToolFailed(f"cannot create {shown}: it already exists") from None
    except OSError as exc:
        raise _failed("write", shown, exc) from None
    return {"bytes_written": len(data)}


def _replace_atomically(at: Located, data: bytes, existing: os.stat_result | None) -> None:
    """A new inode (the writer's: the run's user with `--run-as`), renamed over the name. 0o666
    through the umask, like any new file; an existing file's permission bits are kept, its setuid,
    setgid and sticky bits never (issue 13, item 1: root once kept a setuid bit on its own file)."""
    tmp = f".{at.name[:200]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=at.parent)
    try:
        try:
            _write_all(fd, data)
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode) & 0o777)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, at.name, src_dir_fd=at.parent, dst_dir_fd=at.parent)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=at.parent)
        except OSError:
            pass
        raise


def list_dir(root: Path, user_path: str, shown: str) -> dict[str, Any]:
    """Entries sorted by name, at most `LIST_DIR_MAX_ENTRIES` (the smallest names, kept in a heap, so
    memory stays bounded by the cap however large the directory is). Symlinks are reported as
    symlinks, never followed. The directory is read through its own handle, opened `O_NOFOLLOW`
    relative to its parent's."""
    cap = limits.LIST_DIR_MAX_ENTRIES
    try:
        with _locate("list", root, user_path, shown, follow_last=True) as at:
            st = os.stat(at.name, dir_fd=at.parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise ToolFailed(f"cannot list {shown}: it is {describe_kind(st.st_mode)}, not a directory")
            fd = os.open(at.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.parent)
        try:
            with os.scandir(fd) as it:
                kept = heapq.nsmallest(cap + 1, it, key=lambda e: e.name)
            entries = []
            for entry in kept[:cap]:  # stat relative to `fd`: before it is closed
                try:
                    est = entry.stat(follow_symlinks=False)
                except OSError:  # vanished while listing
                    continue
                entries.append({"name": wire_name(entry.name), "type": entry_type(est.st_mode), "size": est.st_size})
        finally:
            os.close(fd)
    except OSError as exc:
        raise _failed("list", shown, exc) from None
    return {"entries": entries, "truncated": len(kept) > cap}
