"""Confine every path a peer names to the Hand's root directory (DESIGN §9).

"The Hand's policy is final": whatever path the Mind sends, file tools and a command's `cwd` only
ever reach what lies under `--root` once symlinks are resolved. Rules, in order:
- a `..` component is refused outright, even when it would land back inside the root: a request
  that climbs is either a mistake or a probe, and refusing it is simpler to reason about than
  normalising it;
- a relative path is relative to the root; an absolute path must already be inside the root;
- symlinks are resolved and the result must still be inside the resolved root, so a link planted
  inside the root cannot point out of it (file or directory, dangling or not).

Error messages never contain the root's absolute path: they cross the wire (DESIGN §4).

`resolve` is the admission check (a refusal here is `path_outside_root` before anything runs). It is
not what the file tools act on: a directory swapped for a symlink between the check and the use
would lead them out (issue 13, item 2). They act through `locate`, which walks the path again from
an open handle on the root, one component at a time, each opened `O_PATH | O_NOFOLLOW` relative to
the directory before it: a symlink met on the way is read and its target walked the same way, a
`..` (from a link's target) pops back to the directory the walk came from, and nothing ever climbs
above the root's handle or follows an absolute link that does not name a place under the root. The
tool then opens the last name relative to its parent's handle with `O_NOFOLLOW`, so no component is
ever looked up twice by name. This is what `openat2(RESOLVE_BENEATH)` does in the kernel; the walk
is portable (any Linux, no system call numbers) and is one code path to test.

Paths are bounded before any work (issue 13, item 7): at most `PATH_MAX_BYTES` bytes and
`PATH_MAX_COMPONENTS` components, so neither `realpath` nor the walk can take long.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path

from protocol.errors import MindhandError

_SHOWN_MAX = 80
PATH_MAX_BYTES = 4096
PATH_MAX_COMPONENTS = 256
SYMLINKS_MAX = 40
"""Links followed in one walk, as the kernel's own limit: a loop of links ends in ELOOP."""


class PathRefused(MindhandError):
    """The path is not one the Hand will touch. `message` is safe to send to the Mind."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def show(user_path: str) -> str:
    """How a caller's path appears in messages: relative paths quoted, absolute ones not at all."""
    if os.path.isabs(user_path):
        return "the absolute path"
    text = user_path if len(user_path) <= _SHOWN_MAX else user_path[:_SHOWN_MAX] + "..."
    return repr(text) if text.isprintable() else "(unprintable path)"


def resolve(root: Path | str, user_path: str) -> Path:
    """The real path `user_path` names under `root`, or `PathRefused`."""
    if not isinstance(user_path, str):
        raise PathRefused("a path must be a string")
    if user_path == "":
        raise PathRefused("a path must not be empty (use '.' for the root)")
    if "\x00" in user_path:
        raise PathRefused("a path must not contain NUL characters")
    check_bounds(user_path)
    shown = show(user_path)
    if ".." in user_path.split("/"):
        raise PathRefused(f"{shown} is refused: '..' components are not allowed")
    root_given, root_real = _roots(os.fspath(root))
    if os.path.isabs(user_path):
        lexical = Path(os.path.normpath(user_path))
        if not (lexical.is_relative_to(root_given) or lexical.is_relative_to(root_real)):
            raise PathRefused(f"{shown} is outside the root")
        candidate = os.fspath(lexical)
    else:
        candidate = os.path.join(root_real, user_path)
    unlinked = _unlinked(os.fspath(root_real), candidate)
    if unlinked is not None:
        return Path(unlinked)  # under the root by construction: no '..', no link
    try:
        real = Path(os.path.realpath(candidate))
    except OSError:  # a link removed between realpath's lstat and its readlink: someone is racing us
        raise PathRefused(f"{shown} changed while it was being resolved") from None
    if not real.is_relative_to(root_real):
        raise PathRefused(f"{shown} leads outside the root through a symlink")
    return real


def _unlinked(root: str, candidate: str) -> str | None:
    """`candidate` normalised, as its own real path, when no component of it below the (resolved)
    `root` is a symlink: an `lstat` of each of those components, where `realpath` took one of every
    component of the whole path and a Python step for each (a fifth of the Hand's CPU for a small
    `read_file`, measured with cProfile). A missing component ends the look as `realpath` ends it
    (what follows cannot be a link). None when `candidate` is not lexically under `root`, when a
    component is a link, or when something else than a missing name stopped the look: `realpath`
    then decides, as it always did."""
    norm = os.path.normpath(candidate)
    if norm == root:
        return norm
    base = root.rstrip("/")  # "" for the filesystem's root, so that a name joins as "/name"
    if not norm.startswith(base + "/"):
        return None
    path = base
    for part in norm[len(base) + 1 :].split("/"):
        path = f"{path}/{part}"
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return norm  # nothing below a missing name can be a link
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            return None
    return norm


def check_bounds(user_path: str) -> None:
    """Refuse a path too long or too deep, before any work on it: a 1 MB path once stalled the Hand's
    loop ~35 s in `realpath` (issue 13, item 7). Length is counted in characters first (cheap, and
    never less than a quarter of the bytes), then in UTF-8 bytes."""
    if len(user_path) > PATH_MAX_BYTES or len(user_path.encode("utf-8", "surrogateescape")) > PATH_MAX_BYTES:
        raise PathRefused(f"a path must be at most {PATH_MAX_BYTES} bytes")
    if user_path.count("/") >= PATH_MAX_COMPONENTS:
        raise PathRefused(f"a path must have at most {PATH_MAX_COMPONENTS} components")


@functools.lru_cache(maxsize=16)
def _roots(root: str) -> tuple[Path, Path]:
    """The root as given and resolved, once per root: the Hand's root is fixed at start, and the
    resolution cost an lstat per component on every call. Safe if the root is later swapped for a
    symlink: every result must still lie under the root as it was resolved, or it is refused."""
    return Path(os.path.abspath(root)), Path(os.path.realpath(root))


def resolve_entry(root: Path | str, user_path: str) -> Path:
    """Like `resolve`, but the LAST component stays as named (its directory is resolved): what a
    write acts on. A symlink there stays a symlink, so `write_file` can see it and refuse it rather
    than write through it (or replace it). Every check of `resolve` applies to the full path too,
    so a link whose target leaves the root is still refused as such."""
    real = resolve(root, user_path)
    norm = os.path.normpath(user_path)
    name = os.path.basename(norm)
    if name in ("", ".", "/") or real == _roots(os.fspath(root))[1]:
        return real  # the root itself
    return resolve(root, os.path.dirname(norm) or ".") / name


# --- acting on a path: a walk from a handle on the root -------------------------------------------

_STEP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Located:
    """A directory handle and a name in it: what a file tool opens (relative to `parent`, with
    `O_NOFOLLOW`). `name` is `"."` for the root itself. Close it (or use `with`)."""

    def __init__(self, parent: int, name: str) -> None:
        self.parent = parent
        self.name = name

    def close(self) -> None:
        if self.parent >= 0:
            os.close(self.parent)
            self.parent = -1

    def __enter__(self) -> Located:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _relative_parts(root: str, user_path: str) -> list[str]:
    """`user_path` as components below the root (already admitted by `resolve`, so absolute paths
    lie under the root as given or as resolved)."""
    if os.path.isabs(user_path):
        given, real = _roots(root)
        norm = Path(os.path.normpath(user_path))
        base = real if norm.is_relative_to(real) else given
        if not norm.is_relative_to(base):
            raise PathRefused(f"{show(user_path)} is outside the root")
        return list(norm.relative_to(base).parts)
    return [p for p in user_path.split("/") if p not in ("", ".")]


def _link_parts(root: str, target: str, shown: str) -> list[str]:
    """A symlink's target as components: relative ones from where the link is; absolute ones only
    if they name a place under the root (then from the root: the caller restarts there)."""
    if os.path.isabs(target):
        given, real = _roots(root)
        norm = Path(os.path.normpath(target))
        for base in (real, given):
            if norm.is_relative_to(base):
                return ["/", *norm.relative_to(base).parts]
        raise PathRefused(f"{shown} leads outside the root through a symlink")
    return [p for p in target.split("/") if p not in ("", ".")]


def locate(root: Path | str, user_path: str, *, follow_last: bool, make_dirs: bool = False) -> Located:
    """Walk `user_path` from a fresh handle on `root` without ever leaving it (see the module's
    docstring). Intermediate components must be directories (created 0777 through the umask when
    `make_dirs`, never with setgid or sticky bits); the last one is followed if it is a symlink and
    `follow_last` (reads, listings), and kept as named otherwise (writes: a symlink there is the
    tool's to refuse). Raises PathRefused (leads out) or OSError (missing, not a directory, ELOOP).
    Runs in the calling thread, with its identity: the run's user for a run-as Hand."""
    check_bounds(user_path)
    root_s = os.fspath(root)
    shown = show(user_path)
    pending = _relative_parts(root_s, user_path)
    root_fd = open_root(root_s)
    stack = [root_fd]  # handles from the root down to the current directory
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "/":  # an absolute link under the root: start again from the root
                while len(stack) > 1:
                    os.close(stack.pop())
                continue
            if name == "..":
                if len(stack) == 1:
                    raise PathRefused(f"{shown} leads outside the root through a symlink")
                os.close(stack.pop())
                continue
            last = not pending
            if last and not follow_last:
                return Located(_take(stack), name)
            try:
                st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return Located(_take(stack), name)
                if not make_dirs:
                    raise
                _mkdir(stack[-1], name)
                st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > SYMLINKS_MAX:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                pending[:0] = _link_parts(root_s, os.readlink(name, dir_fd=stack[-1]), shown)
                continue
            if last:
                return Located(_take(stack), name)
            # O_DIRECTORY + O_NOFOLLOW: if it was swapped for a link or a file since the stat, this fails.
            stack.append(os.open(name, _STEP | os.O_DIRECTORY, dir_fd=stack[-1]))
        return Located(_take(stack), ".")  # the path named a directory (the root, or via a link)
    finally:
        for fd in stack:
            os.close(fd)


def _take(stack: list[int]) -> int:
    """The current directory's handle, handed to the caller (the rest are closed by `locate`)."""
    return stack.pop()


def _mkdir(parent: int, name: str) -> None:
    """A directory for `make_dirs`, without the special bits a setgid parent would give it."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        return  # made by someone else meanwhile: the walk looks at what it is
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & ~0o777:
            os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)


def open_root(root: Path | str) -> int:
    """An `O_PATH` handle on the root as resolved at start: the ceiling no walk may pass."""
    return os.open(_roots(os.fspath(root))[1], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def entry_type(mode: int) -> str:
    """What an entry is, in the file and copy tools' answers (`list_dir`, `list_tree`,
    `stat_file`): one vocabulary, so a FIFO is a `fifo` in every listing (issue 21, item 5)."""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "other"


def wire_name(name: str) -> str:
    """A file name as it can travel (msgpack str is UTF-8): a name that is not UTF-8 (surrogate-
    escaped by Python) has its undecodable bytes replaced by U+FFFD. Lossy: the answer marks it."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def describe_kind(mode: int) -> str:
    """What a file is, for a message ("cannot read x: it is a FIFO"): the file tools and the copy
    tools refuse the same things in the same words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"
