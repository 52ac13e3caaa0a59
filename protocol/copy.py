"""The rules of a copy (`mind cp`, DESIGN §11 Files), pure: identities, part-file names, the resume
point, modes and which symlinks may be recreated.

Both ends use these, so they cannot disagree: the client derives the `copy_id` a new invocation of
`mind cp --resume` must find again, the Hand names its part file after it, and both apply the same
rule to decide where a resumed copy starts.

- A copy's identity is deterministic (`copy_id`): the Hand's name, the destination path, the size
  and the sha256 of the source. The same file copied to the same place again finds its part file;
  a changed source (another digest) never continues a part file of the old one.
- The receiver writes `.mindhand-cp.<copy_id>.part` in the destination's directory, renames it over
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
import posixpath
import re

PART_PREFIX = ".mindhand-cp."
PART_SUFFIX = ".part"
STALE_PART_S = 24 * 3600
"""A part file untouched this long belongs to a copy nobody will resume."""
COPY_ID_RE = re.compile(r"^[0-9a-f]{32}$")
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


def is_part_name(name: str) -> bool:
    if not (name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)):
        return False
    return bool(COPY_ID_RE.match(name[len(PART_PREFIX) : -len(PART_SUFFIX)]))


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
    """A symlink at `link` (a path relative to a copied tree's top) pointing at `target` stays
    inside that tree: a relative target that never climbs above the top, lexically. Absolute
    targets never do (they name the sending machine's layout, not the tree)."""
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
