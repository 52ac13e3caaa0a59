"""A run's recording as the Mind keeps it while it relays (DESIGN §19): which runs are recorded,
the timed events a recording holds, its bound, its gaps, and the hash chain that makes it
tamper-evident. Pure: the shell (`mind.daemon.recorder`) feeds it the frames it relays and the
run's notes, seals a block of events every flush, and the store's writer links each block into
the chain (`link`, `seal_mac`); `verify` reads a stored recording back against its key.

Why the Mind and not the Hand: the Hand's root can stop or edit a log written on the node (the
standing complaint about SSM's session logs, amazon-ssm-agent #153); every byte of a foreground
run already passes through the Mind, where the Hand cannot reach it.

**Events.** A recording is a sequence of blocks; a block is a msgpack list of events, each a list
whose first two items are its time (microseconds since the recording started) and its kind:
- `[t, "o", stream, bytes]`: output as relayed (`pty`, `stdout`, `stderr`);
- `[t, "i", bytes]`: standard input as relayed (a terminal's keystrokes only with `--record all`:
  what a terminal shows is recorded, what is typed at a prompt that does not echo, a password, is
  not, as Teleport records a session);
- `[t, "r", cols, rows]`: the terminal's size (the first at the start, then each resize);
- `[t, "g", stream, nbytes, why]`: bytes relayed but not recorded since the last block
  (`max_bytes`: past `--record-max-bytes`; `behind`: the store fell behind; `store`: it failed);
- `[t, "m", name, fields]`: the run's metadata: `start` (client, Hand, tool, command, cwd, ...),
  `attached`, `detached`, `client_away`, `hand_away`, `rebound`, `file` (a copy's name, size and
  sha256, never its bytes), `forward` (a tunnel connection's destination), `end` (state, exit
  code, reason).

**The chain.** Block `n`'s head is `sha256(head[n-1] || run_id || n || t || raw)` over its events
as encoded (`raw`, before compression), starting from 32 zero bytes; each head is signed with
HMAC-SHA256 under the recording key, which lives in the Mind's home (0600), never in the
database. DESIGN §19 signs only the last head; signing every head costs one HMAC per block (a
block per second at most) and means a node killed mid-run leaves a recording that is still
authenticated up to its last block, where one signed at the end would have none. Removing,
reordering or altering any block breaks the chain at that block; a block written without the key
fails its signature; a listing row changed in the database disagrees with the signed `start` and
`end` events.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

ZERO_HEAD = bytes(32)
MAX_BYTES_DEFAULT = 64 << 20
"""`--record-max-bytes`: stream bytes one run's recording keeps; past it, gaps with their counts."""
COMPRESS_PROBE = 4096
"""A block is compressed when its first bytes compress to under `COMPRESS_WORTH` of their size:
terminal output and logs shrink 3-10x, random or already-compressed bytes not at all, and
zlib's cost (about 4 ns a byte at level 1) is then paid for nothing."""
COMPRESS_WORTH = 0.7
BLOCK_BYTES = 1 << 20
"""Stream bytes a block holds at most: a fast run's flush becomes several blocks, so a block always
fits a page of `mind play` and the writer's memory stays in steps of this."""
COPY_TOOLS = frozenset({"put_file", "get_file"})
"""Recorded by name, size and digest: a copy's bytes are the file's, and a recording is not a backup."""
METADATA_TOOLS = COPY_TOOLS | {"forward"}
"""Tools whose stream bytes are never recorded (a tunnel carries another protocol's bytes)."""
_COPY_KEYS = ("path", "dest", "src", "size", "sha256", "mode", "kind", "tree")
_FORWARD_KEYS = ("host", "port", "listen", "bind", "accepted")


class Mode(enum.Enum):
    """`mind serve --record`: what the Mind records."""

    OFF = "off"
    PTY = "pty"
    """Terminal sessions (`mind shell`, `mind exec -t`): the default."""
    ALL = "all"
    """Also every foreground run's stdin, stdout and stderr (the runs `mind mcp` makes too)."""


def records(mode: Mode, tool: str, pty: bool, background: bool) -> bool:
    """Whether a run admitted with these is recorded. Background tasks are not: their output is
    the Hand's to keep (`mind task logs`), and no client watches it pass."""
    if mode is Mode.OFF or background:
        return False
    return pty or mode is Mode.ALL


def command_of(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """What of a run's arguments its recording keeps: the command and where it ran, the names of
    its environment's variables but never their values (they hold tokens), a copy's names, sizes
    and digest, a tunnel's destination."""
    out: dict[str, Any] = {}
    if tool in COPY_TOOLS:
        keys: Iterable[str] = _COPY_KEYS
    elif tool == "forward":
        keys = _FORWARD_KEYS
    else:
        keys = ("argv", "command", "cwd", "path")
        env = args.get("env")
        if isinstance(env, dict):
            out["env"] = sorted(str(k) for k in env)
    for k in keys:
        if k in args and isinstance(args[k], (str, int, float, bool, list)):
            out[k] = args[k]
    return out


@dataclass
class Recording:
    """One run's recording in progress: events not yet sealed into a block, and its counts.

    `on_output` is on the relay's path: it appends a reference to the relayed buffer (never a
    copy; the frame's bytes are immutable) or, past the bound or while the store is behind, only
    counts. Nothing here waits or fails."""

    run_id: str
    started: float
    """Monotonic time of the start: every event's time is relative to it."""
    max_bytes: int = MAX_BYTES_DEFAULT
    streams: bool = True
    """False for copies and tunnels: their bytes are counted, not kept."""
    seq: int = 0
    """Blocks sealed so far."""
    recorded: int = 0
    """Stream bytes kept."""
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    """Bytes relayed but not kept since the last block, by (stream, why)."""
    gaps: int = 0
    """Gap events written (each names its byte count)."""
    relayed: dict[str, int] = field(default_factory=dict)
    """Bytes relayed per stream, kept or not (a copy's and a tunnel's sizes)."""
    pending: list[list[Any]] = field(default_factory=list)
    pending_bytes: int = 0
    ready: list[Block] = field(default_factory=list)
    """Blocks sealed on the relay's path (each `BLOCK_BYTES` full), waiting for the next flush."""
    ended: bool = False
    continued: bool = False
    """Picked up by this node after another (or this Mind's earlier life) recorded its start: its
    numbering and its clock follow the stored recording once `resume` has them."""
    released: bool = False
    """Let go of (the run moved to another node): its last block is written, no end."""

    def _t(self, now: float) -> int:
        return max(0, int((now - self.started) * 1_000_000))

    def on_output(self, stream: str, payload: memoryview | bytes, now: float, behind: bool = False) -> None:
        n = len(payload)
        if self.ended or n == 0:
            return
        self.relayed[stream] = self.relayed.get(stream, 0) + n
        if not self.streams:
            return
        why = "behind" if behind else ("max_bytes" if self.recorded + n > self.max_bytes else None)
        if why is not None:
            key = (stream, why)
            self.skipped[key] = self.skipped.get(key, 0) + n
            return
        self.recorded += n
        self.pending_bytes += n
        if stream == "stdin":
            self.pending.append([self._t(now), "i", payload])
        else:
            self.pending.append([self._t(now), "o", stream, payload])
        if self.pending_bytes >= BLOCK_BYTES:
            self._seal_one(now)

    def on_input(self, payload: memoryview | bytes, now: float, keep: bool, behind: bool = False) -> None:
        """Standard input (a terminal's keystrokes are kept only when `keep`: `--record all`)."""
        if keep:
            self.on_output("stdin", payload, now, behind)
        elif not self.ended:
            self.relayed["stdin"] = self.relayed.get("stdin", 0) + len(payload)

    def on_resize(self, cols: int, rows: int, now: float) -> None:
        if not self.ended:
            self.pending.append([self._t(now), "r", cols, rows])

    def note(self, name: str, fields: dict[str, Any], now: float) -> None:
        if not self.ended:
            self.pending.append([self._t(now), "m", name, fields])

    def resume(self, seq: int, recorded: int, started: float) -> None:
        """A continued recording's place in the stored one: the next block number, the bytes
        already kept (its bound is per run, not per node), and the monotonic time its start
        corresponds to here; events noted meanwhile move to that clock."""
        shift = int((self.started - started) * 1_000_000)
        for e in self.pending:
            e[0] += shift
        for b in self.ready:
            for e in b.events:
                e[0] += shift
        self.ready = [
            Block(b.run_id, seq + i, b.t + shift, b.events, b.nbytes, b.last) for i, b in enumerate(self.ready)
        ]
        self.seq = seq + len(self.ready)
        self.recorded += recorded
        self.started = started
        self.continued = False

    def release(self, now: float) -> None:
        """The run left this node: its last events go in a last block of this writer's."""
        self._flush_gaps(now)
        self.released = True

    def mark_lost(self, stream: str, nbytes: int, why: str) -> None:
        """Bytes already accepted into a block that the store could not keep (`store`)."""
        key = (stream, why)
        self.skipped[key] = self.skipped.get(key, 0) + nbytes

    def end(self, fields: dict[str, Any], now: float) -> None:
        """The run's end: the last event (`end`, with the counts) goes into the last block."""
        if self.ended:
            return
        self._flush_gaps(now)
        sizes = {"recorded": self.recorded, "relayed": dict(self.relayed), "gaps": self.gaps}
        self.note("end", {**fields, **sizes}, now)
        self.ended = True

    def _flush_gaps(self, now: float) -> None:
        for (stream, why), n in sorted(self.skipped.items()):
            self.pending.append([self._t(now), "g", stream, n, why])
            self.gaps += 1
        self.skipped.clear()

    def seal(self, now: float) -> list[Block]:
        """The blocks sealed since the last call, and the events since the last block as the next."""
        if not self.ended:
            self._flush_gaps(now)
        if self.pending:
            self._seal_one(now)
        out, self.ready = self.ready, []
        return out

    def _seal_one(self, now: float) -> None:
        last = self.ended or self.released
        block = Block(self.run_id, self.seq, self._t(now), self.pending, self.pending_bytes, last=last)
        self.ready.append(block)
        self.seq += 1
        self.pending = []
        self.pending_bytes = 0


@dataclass(frozen=True)
class Block:
    """Sealed events, ready for the store's writer to encode, link and sign (off the loop)."""

    run_id: str
    seq: int
    t: int
    events: list[list[Any]]
    nbytes: int
    """Stream bytes in it (what the writer's queue counts against its bound)."""
    last: bool = False


@dataclass(frozen=True)
class Stored:
    """A block as the store keeps it: its events encoded (zlib'd or not), its chain head and the
    head's signature."""

    run_id: str
    seq: int
    t: int
    data: bytes
    compressed: bool
    head: bytes
    mac: bytes
    raw_len: int


def encode(events: list[list[Any]]) -> bytes:
    return msgpack.packb(events, use_bin_type=True)


def decode(raw: bytes) -> list[list[Any]]:
    events = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    if not isinstance(events, list) or not all(isinstance(e, list) and len(e) >= 2 for e in events):
        raise ValueError("not a list of events")
    return events


def compress(raw: bytes) -> tuple[bytes, bool]:
    probe = raw[:COMPRESS_PROBE]
    if len(raw) < 256 or len(zlib.compress(probe, 1)) < len(probe) * COMPRESS_WORTH:
        packed = zlib.compress(raw, 1)
        if len(packed) < len(raw):
            return packed, True
    return raw, False


def link(prev: bytes, run_id: str, seq: int, t: int, raw: bytes) -> bytes:
    """Block `seq`'s chain head (see the module's docstring)."""
    h = hashlib.sha256(prev)
    h.update(run_id.encode())
    h.update(seq.to_bytes(8, "big"))
    h.update(t.to_bytes(8, "big"))
    h.update(raw)
    return h.digest()


def seal_mac(key: bytes, run_id: str, head: bytes) -> bytes:
    return hmac.new(key, run_id.encode() + b"\x00" + head, hashlib.sha256).digest()


def store_block(block: Block, prev: bytes, key: bytes, pack: bool = True) -> Stored:
    """Encode, compress (unless `pack` is off: the writer is behind, and disk is cheaper than a
    gap), link and sign one block: the writer's work, on its own thread (hashlib and zlib release
    the GIL on large buffers)."""
    raw = encode(block.events)
    head = link(prev, block.run_id, block.seq, block.t, raw)
    data, packed = compress(raw) if pack else (raw, False)
    return Stored(block.run_id, block.seq, block.t, data, packed, head, seal_mac(key, block.run_id, head), len(raw))


# --- reading back -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """What `verify` found: `ok`, or the first break (`at`: the block, and why)."""

    run_id: str
    ok: bool
    problem: str = ""
    at: int | None = None
    blocks: int = 0
    complete: bool = False
    """The signed `end` event was found: the recording holds the run to its end."""


def unpack(stored: Stored) -> list[list[Any]]:
    raw = zlib.decompress(stored.data) if stored.compressed else stored.data
    return decode(raw)


def verify(run_id: str, blocks: list[Stored], key: bytes | None, listing: dict[str, Any] | None = None) -> Check:
    """Walk a recording's chain from its first block: the first block removed (a number skipped),
    reordered or altered (its head does not follow), unsigned (its signature does not check under
    `key`), unreadable, or a listing that disagrees with the signed metadata. `key` None checks the
    chain only (a reader without the key: it can tell a break, not a forgery)."""
    prev = ZERO_HEAD
    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    for i, b in enumerate(blocks):
        if b.seq != i:
            what = "removed" if b.seq > i else "repeated or reordered"
            return Check(run_id, False, f"block {i} is {what} (found block {b.seq} in its place)", i, i)
        try:
            raw = zlib.decompress(b.data) if b.compressed else b.data
            events = decode(raw)
        except (zlib.error, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            return Check(run_id, False, f"block {i} is unreadable ({exc})", i, i)
        head = link(prev, run_id, b.seq, b.t, raw)
        if not hmac.compare_digest(head, b.head):
            return Check(run_id, False, f"block {i} was altered, or a block before it removed or reordered", i, i)
        if key is not None and not hmac.compare_digest(seal_mac(key, run_id, head), b.mac):
            return Check(run_id, False, f"block {i}'s signature does not check: written without the key", i, i)
        for e in events:
            if len(e) >= 4 and e[1] == "m" and e[2] == "start":
                start = e[3]
            elif len(e) >= 4 and e[1] == "m" and e[2] == "end":
                end = e[3]
        prev = head
    n = len(blocks)
    if start is None:
        return Check(run_id, False, "the recording has no start (its first block is missing)", 0, n)
    if listing is not None:
        for name in ("hand", "client", "tool"):
            if name in listing and listing[name] != start.get(name):
                return Check(run_id, False, f"the listing's {name} {listing[name]!r} is not the signed one", None, n)
        if end is None and listing.get("state") is not None:
            return Check(
                run_id,
                False,
                f"the listing says the run ended ({listing['state']}) but no block holds its signed end: blocks after {n - 1} were removed",
                n,
                n,
            )
        if end is not None:
            for name in ("state", "exit_code"):
                if name in listing and listing[name] != end.get(name):
                    return Check(
                        run_id, False, f"the listing's {name} {listing[name]!r} is not the signed one", None, n
                    )
    return Check(run_id, True, "", None, n, complete=end is not None)


def events_of(blocks: Iterable[Stored]) -> Iterator[list[Any]]:
    for b in blocks:
        yield from unpack(b)
