"""`mind recordings` (the list, `export`, `verify`) and `mind play`: what the Mind recorded of a run
(DESIGN §19), read back. The I/O only: the requests, the sleeping, the keys, the writing. What is
written, and when, is decided by mind/client/recordings.py, which the tests drive with real blocks.

Exit codes: 0; 1 when the Mind refused (`denied_by_scope`, an unknown run), a recording does not
check (`verify`), or what `mind play` printed is not the whole run (a gap, or a recording without
its end); 2 for usage; 125 when the Mind cannot be reached (as every client command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import termios
import time
import zlib
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from mind.cli import options
from mind.cli.connection import with_client
from mind.cli.exits import EXIT_USAGE, die
from mind.cli.formatting import byte_size, printable, table, timestamp
from mind.cli.terminal import Attributes, RawMode
from mind.client import recordings as rec
from mind.core.recording import Stored, events_of, unpack, verify
from mind.errors import ClientError
from protocol import limits
from protocol.codes import ErrorCode
from protocol.errors import MindhandError
from protocol.messages import (
    PAGE_LIMIT_MAX,
    Message,
    RecordingBlock,
    RecordingInfo,
    RecordingPage,
)

R = TypeVar("R", bound=Message)
EXIT_PROBLEM = 1
"""A refusal by the Mind, a recording that does not check, a playback that is not the whole run."""
FOLLOW_POLL_S = 0.5
"""How often `mind play --follow` asks for blocks sealed since: the recorder seals one every 0.5 s."""
UNPLAYABLE = ("copy", "forward")
"""Kinds whose recordings hold names, sizes and destinations, never bytes."""
REFUSALS = frozenset(
    {
        ErrorCode.UNKNOWN_RUN,
        ErrorCode.DENIED_BY_SCOPE,
        ErrorCode.NOT_ALLOWED,
        ErrorCode.INVALID_PAYLOAD,
        ErrorCode.UNKNOWN_TYPE,
        ErrorCode.INTERNAL_ERROR,
    }
)
"""The Mind's answers to one request that refuse it (1: `unknown_type` is a Mind older than
recordings); the connection's own ends (`shutdown`, `revoked`, ...) are 125, as for every command."""


def speed(text: str) -> float:
    """`--speed X`: a factor more than 0 (`2` plays twice as fast, `0.5` at half speed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 2, 0.5)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"speed {text!r} must be more than 0")
    return value


def add_parsers(sub: Any) -> None:
    rc = options.command(
        sub,
        "recordings",
        help="recorded runs (newest first; mind serve --record): the list, or `export` or `verify` one",
    )
    options.connection(rc)
    options.hand(rc, required=False, help="only this Hand's recordings")
    rc.add_argument("--client", help="only recordings of this client's runs")
    rc.add_argument(
        "--since", type=options.duration, metavar="DURATION", help="only runs started within this long ago (e.g. 2h)"
    )
    rc.add_argument("--limit", type=int, default=50)
    options.json_output(rc)
    rc.set_defaults(handler=with_client(list_recordings))
    acts = rc.add_subparsers(dest="action", required=False, metavar="ACTION")

    ex = acts.add_parser(
        "export",
        help="a recording as asciicast v2 (asciinema play, its web player) or as JSON (everything)",
        formatter_class=options.Help,
    )
    options.connection(ex)
    ex.add_argument("run_id", metavar="RUN_ID")
    ex.add_argument(
        "--format",
        choices=("asciicast", "json"),
        default="asciicast",
        help="asciicast: output, input and resizes timed (default); json: the listing, the blocks' heads and "
        "every event, bytes in base64",
    )
    ex.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    ex.set_defaults(handler=with_client(export))

    vf = acts.add_parser(
        "verify",
        help="check recordings against the Mind's key: ok (complete, or where it ends) or the first break; "
        "exit 1 when any does not check",
        formatter_class=options.Help,
    )
    options.connection(vf)
    vf.add_argument("run_id", nargs="?", metavar="RUN_ID")
    vf.add_argument("--all", action="store_true", help="every recording this client may read")
    options.json_output(vf)
    vf.set_defaults(handler=with_client(verify_recordings))

    pl = options.command(
        sub,
        "play",
        help="replay a recorded run: a terminal with its timing (q quits, space pauses), a stream byte for byte",
    )
    options.connection(pl)
    pl.add_argument("run_id", metavar="RUN_ID")
    pl.add_argument("--speed", type=speed, metavar="X", help="a terminal's pace, e.g. 2 (twice as fast; default 1)")
    pl.add_argument(
        "--from",
        dest="start",
        type=options.duration,
        metavar="DURATION",
        help="start this far in (e.g. 90s); what came before is written at once",
    )
    pl.add_argument(
        "--idle-limit", type=options.duration, metavar="DURATION", help="cap every pause of a terminal at this"
    )
    pl.add_argument(
        "--stream",
        choices=rec.STREAMS,
        help="print this stream byte for byte, untimed (a run without a terminal: stdout by default)",
    )
    pl.add_argument(
        "--follow", action="store_true", help="a recording still growing: print its bytes as they come, to its end"
    )
    pl.set_defaults(handler=with_client(play, lambda a: bool(a.follow)))


# --- requests -------------------------------------------------------------------------------------


async def ask(request: Awaitable[R]) -> R:
    """One request of `MindClient`'s (`list_recordings`, `get_recording`, `verify_recordings`: each
    asked again on the new connection after a cut) and its reply. The Mind's refusal
    (`denied_by_scope`, an unknown run) ends the command with its sentence and 1; a connection that
    failed goes on up to `with_client` (125, as for every client command)."""
    try:
        reply: R = await request
    except ClientError as exc:
        if exc.code in REFUSALS:
            die(exc.message, EXIT_PROBLEM, str(exc.code))
        raise
    return reply


async def fetch(client: Any, run_id: str, after: int = -1) -> tuple[RecordingInfo, list[RecordingBlock]]:
    """The recording's listing and its blocks after `after`, page by page while the Mind says more
    are stored (a page that brings none ends it: a cursor that does not move)."""
    blocks: list[RecordingBlock] = []
    while True:
        page = await ask(client.get_recording(run_id, after))
        blocks += page.blocks
        if page.blocks:
            after = page.blocks[-1].seq
        if not page.more or not page.blocks:
            return page.info, blocks


def run_id_of(text: str) -> str:
    if not limits.ID_RE.fullmatch(text):
        die(f"{text!r} is not a run id", EXIT_USAGE)
    return text


def decoded(run_id: str, blocks: list[RecordingBlock]) -> tuple[list[Stored], list[list[Any]]]:
    """The blocks as stored and their events, with what the chain says of them on stderr: this
    side has no key, so it tells a break (a block removed, reordered or altered), not a forgery
    (`mind recordings verify` asks the Mind, which holds the key). Events stop at the first block
    that breaks the chain (or does not decode), and the caller's output ends there, said on stderr."""
    stored = [rec.stored_of(run_id, b) for b in blocks]
    check = verify(run_id, stored, None)
    if not check.ok:
        # what follows a break is not what was recorded: shown up to it, never past it
        warn(f"recording {run_id}: {check.problem}: shown up to there")
        stored = stored[: check.at or 0]
    events: list[list[Any]] = []
    for s in stored:
        try:
            events += unpack(s)
        except (zlib.error, ValueError):  # (msgpack's errors are ValueErrors) `verify` named it above
            break
    return stored, events


def warn(line: str) -> None:
    sys.stdout.flush()
    print(f"mind: {printable(line)}", file=sys.stderr, flush=True)


def stops_at(events: list[list[Any]], blocks: Iterable[RecordingBlock]) -> str:
    """Where a recording without its end stops, for a person."""
    last = max([rec.last_time_s(events), *(b.t / rec.US for b in blocks)])
    return rec.duration_text(last)


INCOMPLETE = "the recording stops at {at} (its node stopped before the run ended, or the run goes on: --follow waits)"


# --- mind recordings ------------------------------------------------------------------------------


HEADERS = ["RUN", "CLIENT", "HAND", "KIND", "COMMAND", "STARTED", "DURATION", "BYTES", "STATE"]
COMMAND_WIDTH = 48


def row(r: RecordingInfo) -> list[str]:
    command = rec.command_text(r.command) or "-"
    if len(command) > COMMAND_WIDTH:
        command = command[: COMMAND_WIDTH - 3] + "..."
    duration = rec.duration_text(max(0.0, r.ended - r.started)) if r.ended is not None else "-"
    return [
        r.run_id,
        r.client,
        r.hand,
        r.kind,
        command,
        timestamp(r.started),
        duration,
        byte_size(r.bytes) + (f" ({r.gaps} gaps)" if r.gaps else ""),
        r.state or "-",
    ]


async def list_recordings(client: Any, args: argparse.Namespace) -> int:
    since = None
    if args.since is not None:
        if args.since <= 0:
            die("--since: the duration must be more than 0", EXIT_USAGE)
        since = time.time() - args.since
    if args.limit <= 0:
        die("--limit must be positive", EXIT_USAGE)
    for flag, value in (("--hand", args.hand), ("--client", args.client)):
        if value is not None and not limits.LABEL_RE.fullmatch(value):
            die(f"{flag}: {value!r} is not a name", EXIT_USAGE)
    out: list[RecordingInfo] = []
    after: str | None = None
    while len(out) < args.limit:
        want = min(args.limit - len(out), PAGE_LIMIT_MAX)
        reply = await ask(client.list_recordings(args.hand, args.client, since, want, after))
        out += reply.items[:want]
        if reply.next_after is None or reply.next_after == after:  # (a cursor that does not move ends it)
            break
        after = reply.next_after
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in out], indent=2))
        return 0
    table(HEADERS, [row(r) for r in out])
    return 0


# --- mind recordings export -----------------------------------------------------------------------


async def export(client: Any, args: argparse.Namespace) -> int:
    run_id = run_id_of(args.run_id)
    info, blocks = await fetch(client, run_id)
    stored, events = decoded(run_id, blocks)
    listing = info.model_dump(mode="python")
    if args.format == "json":
        doc = rec.to_document(listing, stored)
        data = (json.dumps(doc, ensure_ascii=False) + "\n").encode()
    else:
        if info.kind in UNPLAYABLE:
            die(f"run {run_id} is a {info.kind}: its recording holds no terminal or streams (--format json shows it)")
        data = "".join(line + "\n" for line in rec.to_asciicast(listing, events)).encode()
    emit(data, args.output)
    if rec.meta(events, "end") is None:  # what is stored is exported all the same
        warn("warning: " + INCOMPLETE.format(at=stops_at(events, blocks)))
    return 0


def emit(data: bytes, path: str | None) -> None:
    """The export on stdout, or in the file `-o` names (the command has nothing else to do meanwhile)."""
    if path is None:
        write(data)
        return
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        die(f"{path}: {exc.strerror or exc}", EXIT_PROBLEM)


# --- mind recordings verify -----------------------------------------------------------------------


def check_line(c: Any) -> str:
    if not c.ok:
        return f"{c.run_id}  BROKEN  {c.problem}"
    if c.complete:
        return f"{c.run_id}  ok  complete ({c.blocks} blocks)"
    return f"{c.run_id}  ok  incomplete: ends at block {max(0, c.blocks - 1)}"


async def verify_recordings(client: Any, args: argparse.Namespace) -> int:
    if bool(args.all) == (args.run_id is not None):
        die("name one recording (RUN_ID) or --all", EXIT_USAGE)
    run_id = None if args.all else run_id_of(args.run_id)
    reply = await ask(client.verify_recordings(run_id))
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in reply.items], indent=2))
    else:
        for c in reply.items:
            print(printable(check_line(c)))
        if not reply.items:
            print("mind: no recordings to verify", file=sys.stderr)
    return 0 if all(c.ok for c in reply.items) else EXIT_PROBLEM


# --- mind play ------------------------------------------------------------------------------------


def write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def put(item: bytes | rec.Gap) -> bool:
    """Write bytes, or say a gap on stderr; True for a gap."""
    if isinstance(item, rec.Gap):
        warn(item.text())
        return True
    write(item)
    return False


def cbreak_attributes(attrs: Attributes) -> Attributes:
    """cbreak, as `tty.setcbreak` makes it: keys come one at a time and are not echoed, while
    Ctrl-C still interrupts and output is processed as usual."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    return [iflag, oflag, cflag, lflag & ~(termios.ECHO | termios.ICANON), ispeed, ospeed, cc]


class Cbreak(RawMode):
    """`RawMode`'s restoring on every exit path (finally, atexit, the fatal signals, SIGTSTP and
    SIGCONT), with cbreak's attributes instead of raw ones: a playback reads single keys, and its
    output is the recorded terminal's, which already holds its `\\r\\n`."""

    def attributes(self, saved: Attributes) -> Attributes:
        return cbreak_attributes(saved)


class Quit(MindhandError):
    """Not an error: `q` during a playback."""


class Controls:
    """The keys of a timed playback on a terminal: `q` quits, space pauses and resumes. Without a
    terminal on stdin there are none, and the playback only waits."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.keys: asyncio.Queue[bytes] = asyncio.Queue()
        self.paused_at: float | None = None
        self._mode: Cbreak | None = None

    def __enter__(self) -> Controls:
        try:
            fd = sys.stdin.fileno()
            tty = sys.stdin.isatty()
        except (AttributeError, ValueError, OSError):
            return self
        if tty:
            mode = Cbreak(fd)
            try:
                mode.enter()
            except termios.error:  # a terminal we may not set (not ours): play without keys
                return self
            self._mode, self.fd = mode, fd
            asyncio.get_running_loop().add_reader(fd, self._read)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.fd is not None:
            asyncio.get_running_loop().remove_reader(self.fd)
            self.fd = None
        if self._mode is not None:
            self._mode.restore()

    def _read(self) -> None:
        assert self.fd is not None
        try:
            data = os.read(self.fd, 64)
        except OSError:
            data = b""
        if not data:  # the terminal went away: no more keys
            asyncio.get_running_loop().remove_reader(self.fd)
            return
        for b in data:
            self.keys.put_nowait(bytes([b]))

    async def until(self, target: float) -> float:
        """Wait until the loop's clock reaches `target`; a pause pushes it (and every later frame)
        back by its length: the new target is returned. Raises `Quit` on `q`."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self.paused_at is None and now >= target:
                return target
            timeout = None if self.paused_at is not None else target - now
            if self.fd is None:
                await asyncio.sleep(timeout or 0)
                continue
            try:
                key = await asyncio.wait_for(self.keys.get(), timeout)
            except TimeoutError:
                continue
            if key in (b"q", b"Q"):
                raise Quit
            if key == b" ":
                if self.paused_at is None:
                    self.paused_at = loop.time()
                else:
                    target += loop.time() - self.paused_at
                    self.paused_at = None


async def timed(frames: Iterable[tuple[float, bytes | rec.Gap]]) -> bool:
    """Play a terminal: each frame at its time on one clock (a slow write delays the next frames
    no further than it must). True when a gap was said."""
    gaps = False
    loop = asyncio.get_running_loop()
    with Controls() as keys:
        clock = loop.time()
        try:
            for delay, item in frames:
                clock = await keys.until(clock + delay)
                gaps |= put(item)
        except Quit:
            pass
    return gaps


async def play(client: Any, args: argparse.Namespace) -> int:
    run_id = run_id_of(args.run_id)
    timing = args.speed is not None or args.start is not None or args.idle_limit is not None
    if args.idle_limit is not None and args.idle_limit <= 0:
        die("--idle-limit must be more than 0", EXIT_USAGE)
    if args.follow and timing:
        die("--follow prints as the recording grows: --speed, --from and --idle-limit time a playback", EXIT_USAGE)
    if args.follow:
        return await follow(client, run_id, args.stream)
    info, blocks = await fetch(client, run_id)
    stream = stream_for(info, args.stream)
    if stream is not None and timing:
        die(f"{stream} is printed byte for byte: --speed, --from and --idle-limit time a terminal", EXIT_USAGE)
    _, events = decoded(run_id, blocks)
    if stream is None:
        frames = rec.frames(events, args.speed or 1.0, args.start or 0.0, args.idle_limit)
        gaps = await timed(frames)
    else:
        gaps = False
        for item in rec.stream_bytes(events, stream):
            gaps |= put(item)
    if rec.meta(events, "end") is None:
        warn(INCOMPLETE.format(at=stops_at(events, blocks)))
        return EXIT_PROBLEM
    return EXIT_PROBLEM if gaps else 0


def stream_for(info: RecordingInfo, asked: str | None) -> str | None:
    """The stream to print byte for byte, or None for a terminal's timed playback."""
    if info.kind in UNPLAYABLE:
        die(
            f"run {info.run_id} is a {info.kind}: its recording holds names, sizes and digests, not bytes "
            f"(mind recordings export --format json {info.run_id})",
            EXIT_PROBLEM,
        )
    held = rec.KIND_STREAMS.get(info.kind)
    if asked is not None and held is not None and asked not in held:
        die(f"run {info.run_id} is a {info.kind} recording: it holds {', '.join(held)}, not {asked}", EXIT_USAGE)
    if asked is None and info.kind != "terminal":
        return "stdout"
    return asked


async def follow(client: Any, run_id: str, asked: str | None) -> int:
    """`--follow`: what is stored at once, then each block as it is sealed, until the run's end."""
    after = -1
    stream: str | None = None
    gaps = False
    while True:
        page: RecordingPage = await ask(client.get_recording(run_id, after))
        if stream is None:
            stream = stream_for(page.info, asked) or "pty"
        ended = False
        for b in page.blocks:
            try:
                events = list(events_of([rec.stored_of(run_id, b)]))
            except (zlib.error, ValueError) as exc:  # a block the Mind keeps but cannot be read
                die(f"recording {run_id}: block {b.seq} is unreadable ({exc})", EXIT_PROBLEM)
            for item in rec.stream_bytes(events, stream):
                gaps |= put(item)
            ended = ended or rec.meta(events, "end") is not None
            after = b.seq
        if ended:
            return EXIT_PROBLEM if gaps else 0
        if not (page.more and page.blocks):
            await asyncio.sleep(FOLLOW_POLL_S)
