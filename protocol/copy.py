"""The rules of a copy (`mind cp`, DESIGN §11 Files), pure: identities, part-file names, the resume
point, modes and which symlinks may be recreated.

Both ends use these, so they cannot disagree: the client derives the `copy_id` a new invocation of
`mind cp --resume` must find again, the Hand names its part file after it, and both apply the same
rule to decide where a resumed copy starts.

- A copy's identity is deterministic (`copy_id`): the Hand's name, the destination path, the size
  and the sha256 of the source. The same file copied to the same place again finds its part file;
  a changed source (another digest) never continues a part file of the old one.
- The receiver writes `.mindhand-cp.<copy_id>.part` in the destination's directory (a download's
  local part also carries an unpredictable token: `private_part_name`), renames it over
  the final name only once the whole file's sha256 matched, and keeps it only when the copy was
  interrupted (the stream did not end): a failed copy (mismatch, disk full, refused) removes it.
  Part files older than `STALE_PART_S` are removed when a copy into their directory starts, so
  they cannot pile up.
- The resume point is what the receiver holds (`resume_point`): the sender starts there, and the
  receiver cuts its part file back to it (bytes it wrote after the sender's question are simply
  rewritten), re-hashing the prefix so the final digest covers the whole file.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

PART_PREFIX = ".mindhand-cp."
PART_SUFFIX = ".part"
STALE_PART_S = 24 * 3600
"""A part file untouched this long belongs to a copy nobody will resume."""
COPY_ID_RE = re.compile(r"^[0-9a-f]{32}$")
TOKEN_RE = re.compile(r"^[0-9a-f]{16}$")
MODE_BITS = 0o777
"""The permission bits a copy may set: never setuid, setgid or sticky (0o7000)."""
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def copy_id(hand: str, dest: str, size: int, sha256: str) -> str:
    """The identity of one copy of one source to one destination (32 hex digits)."""
    key = "\x00".join((hand, dest, str(size), sha256)).encode("utf-8", "surrogateescape")
    return hashlib.sha256(key).hexdigest()[:32]


def part_name(cid: str) -> str:
    """The part file's name in the destination's directory."""
    if not COPY_ID_RE.match(cid):
        raise ValueError("a copy_id is 32 lowercase hex digits")
    return f"{PART_PREFIX}{cid}{PART_SUFFIX}"


def private_part_name(cid: str, token: str) -> str:
    """A download's part file (issue 23, attack 8): `.mindhand-cp.<copy_id>.<token>.part`, the token
    unpredictable (16 hex digits), so a name planted in a shared directory before the copy is never
    the one it creates (`O_EXCL | O_NOFOLLOW`); a resume finds its part by the copy id's prefix."""
    if not TOKEN_RE.match(token):
        raise ValueError("a part token is 16 lowercase hex digits")
    return f"{part_name(cid)[: -len(PART_SUFFIX)]}.{token}{PART_SUFFIX}"


def part_copy_id(name: str) -> str | None:
    """The copy id a part file's name carries (either form), or None if it is not a part name."""
    if not (name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)):
        return None
    middle = name[len(PART_PREFIX) : -len(PART_SUFFIX)]
    cid, _, token = middle.partition(".")
    if not COPY_ID_RE.match(cid) or (token and not TOKEN_RE.match(token)):
        return None
    return cid


def is_part_name(name: str) -> bool:
    return part_copy_id(name) is not None


def is_stale(mtime: float, now: float) -> bool:
    return now - mtime > STALE_PART_S


def resume_point(held: int | None, asked: int, size: int) -> int:
    """Where a resumed upload starts, as the receiver decides it: the offset the sender asks for,
    if the receiver holds at least that much (it cuts back to it), else a ValueError (the sender's
    view is stale: it must ask again). `held` is None when there is no part file: only 0 works."""
    if asked < 0 or asked > size:
        raise ValueError(f"offset {asked} is outside the file of {size} bytes")
    if asked == 0:
        return 0
    if held is None:
        raise ValueError(f"no part file to resume at offset {asked}")
    if held < asked:
        raise ValueError(f"the part file holds {held} bytes, fewer than the offset {asked}")
    return asked


def sender_offset(held: int | None, size: int) -> int:
    """Where a sender resumes, given what the receiver says it holds (never past the end)."""
    return 0 if held is None else max(0, min(held, size))


def safe_mode(mode: int) -> int:
    """`mode` without setuid, setgid and sticky bits (or file-type bits)."""
    return mode & MODE_BITS


def link_stays_inside(link: str, target: str) -> bool:
    """A first, lexical filter for a symlink at `link` (relative to a copied tree's top) pointing
    at `target`: a relative target that never climbs above the top by its text. It is never the
    judgement (a link already in the tree can make a lexically inside target resolve outside,
    issue 23 attack 1): the receiver judges the target against its real tree
    (`protocol.io.tree.target_stays_inside`). Absolute targets never pass (they name the sending
    machine's layout, not the tree)."""
    if not target or target.startswith("/") or "\x00" in target:
        return False
    depth = len([p for p in posixpath.dirname(link).split("/") if p not in ("", ".")])
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        else:
            depth += 1
    return True


MTIME_MAX = float(1 << 40)
"""The largest modification time a copy sets (year ~36,800): beyond it `utime` fails mid-copy."""


def check_mtime(mtime: float) -> float:
    """A modification time a copy may set: finite and within +-`MTIME_MAX` seconds of the epoch,
    or a ValueError before anything is made (issue 23: 1e300 and NaN failed after the directory)."""
    if not math.isfinite(mtime) or abs(mtime) > MTIME_MAX:
        raise ValueError(f"mtime must be a finite number of seconds within +-{MTIME_MAX:.0f}")
    return mtime


# --- a tree in one run: what is already the same on the other side --------------------------------

TREE_PATHS_MAX = 20_000
"""Paths one tree download asks for (as many as a `list_tree` answer may list)."""
TREE_PATHS_BYTES = 512 << 10
"""The paths of one tree download, summed: a longer list is asked for in several runs, so the
`get_file` arguments stay well under `ARGS_MAX_BYTES`."""
MTIME_SLACK = 1e-5
"""Two modification times within this are the same: a float of seconds since 1970 carries about
0.25 us, and a time set by `utime` from one and read back may differ by that much."""


def same_file(
    size: int,
    mtime: float | None,
    sha256: str | None,
    other: dict[str, Any] | None,
    checksum: bool,
) -> bool:
    """Whether a file of `size`, `mtime` (and `sha256`, when `checksum`) is already at the other
    side as `other` describes it (a `list_tree` entry), so a tree copy skips it, as rsync's quick
    check does: by default the same size and modification time; with `checksum` the same size and
    sha256 (the other side's digest from `list_tree(sha256=True)`). Anything not a regular file
    there is never the same."""
    if other is None or other.get("type") != "file" or other.get("size") != size:
        return False
    if checksum:
        theirs = other.get("sha256")
        return isinstance(theirs, str) and sha256 is not None and theirs == sha256
    theirs_t = other.get("mtime")
    if mtime is None or not isinstance(theirs_t, (int, float)) or isinstance(theirs_t, bool):
        return False
    return abs(float(theirs_t) - mtime) <= MTIME_SLACK


def batch_paths(paths: list[str]) -> list[list[str]]:
    """`paths` cut into runs' worth (`TREE_PATHS_MAX`, `TREE_PATHS_BYTES`), order kept."""
    out: list[list[str]] = []
    cur: list[str] = []
    weight = 0
    for p in paths:
        w = len(p.encode("utf-8", "surrogatepass")) + 4
        if cur and (len(cur) >= TREE_PATHS_MAX or weight + w > TREE_PATHS_BYTES):
            out.append(cur)
            cur, weight = [], 0
        cur.append(p)
        weight += w
    if cur:
        out.append(cur)
    return out


# --- a tree copied down: which entries the receiver makes, in which order --------------------------


def split_rel(path: str) -> list[str] | None:
    """The components of an entry's path relative to the tree's top, or None when it is not one a
    receiver may make: empty, absolute, with an empty, `.` or `..` component, or with NUL."""
    if not path or path.startswith("/") or "\x00" in path:
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return parts


@dataclass(frozen=True)
class TreePlan:
    """What a receiver makes of a listed tree: `dirs` (parents before children), `files`, then
    `links` last, each a dict of the listing; `refused` as (path, why). Symlinks come last so that
    no entry is ever made through a link of this copy, and every link is judged against the tree as
    it will stay."""

    dirs: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


def plan_tree(entries: list[dict[str, Any]]) -> TreePlan:
    """Order a `list_tree` answer for the receiver and refuse what a hostile or lossy sender could
    use to write elsewhere (issue 23, attack 1):
    - a path that is not a plain relative one (`split_rel`);
    - an entry the Hand marks `lossy`: its name or target is not UTF-8 there, so what reaches the
      wire (U+FFFD) is not its name: making it would make something else;
    - a name already taken in this copy (two entries, e.g. two names that are not UTF-8 and reach
      the wire as the same U+FFFD string, would be made one over the other);
    - an entry whose parent is not a directory of this listing: a Hand listing `esc` as a link and
      then `esc/x` as a file would have the file written through the link.
    A refused directory takes its whole subtree with it (its children have no parent here)."""
    plan = TreePlan()
    taken: set[str] = set()
    dirs: set[str] = {""}
    for e in entries:
        path = e.get("path")
        if not isinstance(path, str):
            plan.refused.append((repr(path), "refused: the Hand named an entry without a path"))
            continue
        parts = split_rel(path)
        if parts is None:
            plan.refused.append((path, "refused: the Hand named a path outside the tree"))
            continue
        if e.get("lossy"):
            plan.refused.append((path, "not copied: its name (or its target) is not UTF-8 on the Hand"))
            continue
        if path in taken:
            plan.refused.append((path, "refused: its name collides with an entry already in this copy"))
            continue
        taken.add(path)
        if "/".join(parts[:-1]) not in dirs:
            plan.refused.append((path, "refused: its parent is not a directory of this copy"))
            continue
        kind = e.get("type")
        if kind == "dir":
            dirs.add(path)
            plan.dirs.append(e)
        elif kind == "file":
            plan.files.append(e)
        elif kind == "symlink":
            plan.links.append(e)
        else:
            plan.refused.append((path, "not copied: it is a special file (FIFO, socket or device)"))
    return plan
