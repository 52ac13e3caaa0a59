"""A copied tree built through directory handles, and a symlink judged against the real tree: the
one way both receivers of `mind cp` work (the Hand's `put_file`, the client's downloads; issue 23).

It lives in `protocol` because both shells need it and neither may import the other's.

Why handles: a path string is looked up again, component by component, at every use; a name that
was a directory when checked can be a symlink (planted by a sender, or made earlier by the same
copy) when written. Here every directory is entered with `O_DIRECTORY | O_NOFOLLOW` relative to the
handle of its parent, and every entry is made relative to its parent's handle (`mkdirat`,
`openat`, `symlinkat`), so no component of a path is ever followed.

Why judge a link against the real tree: a target such as `z/d1/.../d30/up/../../victim` never
climbs above the top by its text, but `up`, a link already in the tree (or made later in the same
copy), can make it resolve outside (attack 1; attack 2 on the Hand). `target_stays_inside` walks
the target as the kernel would, from the link's real directory: each existing component is looked
at, a symlink met is expanded (its own text judged by the same rules), `..` goes to the physical
parent and may never pass the ceiling (the tree's top, or the Hand's root). Two rules make the
verdict hold for every later change a copy can make:
- absolute targets are refused (they name a machine's layout, not the tree);
- once a target's own text has passed a component that is a symlink, missing, or not a directory,
  a later `..` of that text is refused: its meaning would depend on what that component becomes
  (a later link, or a link replaced). So every link made this way is "climb real directories from
  where it is, then only descend", and descending from inside stays inside.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

SYMLINKS_MAX = 40
"""Links expanded in one judgement, as the kernel's own limit."""
_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(parent: int, name: str) -> int:
    """A readable handle on the directory `name` in `parent`; a symlink there fails (ELOOP), as
    does anything that is not a directory (ENOTDIR)."""
    return os.open(name, _DIR, dir_fd=parent)


def make_dir(parent: int, name: str, mode: int) -> tuple[int, bool]:
    """The directory `name` in `parent` (made with `mode` through the umask if missing) and whether
    this call made it. An existing symlink or file there is never followed: OSError (ELOOP, ENOTDIR)."""
    created = True
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        created = False
    return open_dir(parent, name), created


def walk_dirs(top: int, parts: list[str]) -> int:
    """A new handle on the directory `parts` below `top`, each component a real directory (never a
    link). The caller closes it."""
    fd = os.dup(top)
    try:
        for name in parts:
            nxt = open_dir(fd, name)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def target_stays_inside(ceiling: int, start: int, target: str) -> bool:
    """Whether a symlink in the directory `start` (a handle below or at `ceiling`) pointing at
    `target` resolves inside `ceiling`, judged on the real tree by the rules of the module's
    docstring. Anything that cannot be judged (a permission error, a loop) is outside."""
    if not target or "\x00" in target or target.startswith("/"):
        return False
    top = os.fstat(ceiling)
    # (component, the id of the text it came from); a text is tainted once it passed a component
    # that is a link, missing or not a directory.
    pending: list[tuple[str, int]] = [(p, 0) for p in target.split("/") if p not in ("", ".")]
    tainted: set[int] = set()
    texts = 1
    links = 0
    missing = False
    fd = os.open(".", _PATH, dir_fd=start)
    try:
        while pending:
            name, text = pending.pop(0)
            if name == "..":
                if missing or text in tainted:
                    return False
                if _same(os.fstat(fd), top):
                    return False  # above the ceiling
                up = os.open("..", _PATH, dir_fd=fd)
                os.close(fd)
                fd = up
                continue
            if missing:
                continue  # descending below a missing name: wherever it is made, below here
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                missing = True
                tainted.add(text)
                continue
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > SYMLINKS_MAX:
                    return False
                inner = os.readlink(name, dir_fd=fd)
                if not inner or inner.startswith("/"):
                    return False
                tainted.add(text)
                pending[:0] = [(p, texts) for p in inner.split("/") if p not in ("", ".")]
                texts += 1
                continue
            if not stat.S_ISDIR(st.st_mode):
                missing = True  # a file: nothing lies below it, whatever follows
                tainted.add(text)
                continue
            try:
                sub = os.open(name, _PATH, dir_fd=fd)
            except OSError as exc:  # swapped since the stat: judge it as unknown, i.e. outside
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    return False
                raise
            os.close(fd)
            fd = sub
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sync_filesystem(fd: int) -> None:
    """`syncfs(2)` of the filesystem `fd` is on: one flush for a whole copied tree instead of an
    fsync per file (`sync()` where the C library has no `syncfs`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) == 0:
            return
    except (OSError, AttributeError):
        pass
    os.sync()
