"""Reading a run's recording (DESIGN §19) the way `mind play` and `mind recordings export` need it,
sans-I/O: one stream's bytes exactly as relayed, the schedule of a timed playback, the asciicast v2
lines asciinema's player reads, and the JSON document that holds everything. The CLI
(mind/cli/recordings.py) fetches the blocks, sleeps and writes; what is written, and when, is
decided here, where tests drive it with real blocks (tests/mind/test_play.py).

The events are `mind.core.recording`'s (`[t, kind, ...]`, `t` in microseconds since the start):
this module reads them, it never makes them.
"""

from __future__ import annotations

import base64
import codecs
import json
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mind.core.recording import Stored, unpack

US = 1_000_000
"""Microseconds in a second: the unit of every event's time."""
DEFAULT_SIZE = (80, 24)
"""Columns and rows of an asciicast whose recording names none (a run without a terminal)."""
STREAMS = ("pty", "stdout", "stderr", "stdin")
"""What `mind play --stream` can print: a terminal's one output stream, a plain run's two, and
standard input where `--record all` kept it."""
KIND_STREAMS = {"terminal": ("pty", "stdin"), "streams": ("stdout", "stderr", "stdin")}
"""The streams a recording of each kind can hold (copies and tunnels hold none: names, sizes and
destinations only)."""
DOCUMENT_FORMAT = "mindhand-recording"


@dataclass(frozen=True)
class Gap:
    """Bytes relayed but not recorded (`max_bytes`, `behind`, `store`): play writes nothing for
    them, and says so, rather than pretending the stream was whole."""

    t: int
    stream: str
    nbytes: int
    why: str

    def text(self) -> str:
        return f"gap of {self.nbytes} bytes in {self.stream} ({self.why})"


def item_of(event: list[Any], stream: str) -> bytes | Gap | None:
    """`event`'s bytes of `stream`, or its gap in `stream`, or None when it is neither."""
    kind = event[1]
    if kind == "o" and stream != "stdin" and event[2] == stream:
        return bytes(event[3])
    if kind == "i" and stream == "stdin":
        return bytes(event[2])
    if kind == "g" and event[2] == stream:
        return Gap(event[0], event[2], event[3], event[4])
    return None


def stream_bytes(events: Iterable[list[Any]], stream: str) -> Iterator[bytes | Gap]:
    """One stream as it was relayed, in order, byte for byte, with its gaps where they fell:
    the joined bytes of a whole recording of a plain run are its stdout (or stderr), digest and all."""
    for e in events:
        item = item_of(e, stream)
        if item is not None:
            yield item


def frames(
    events: Iterable[list[Any]],
    speed: float = 1.0,
    start_s: float = 0.0,
    idle_limit: float | None = None,
    stream: str = "pty",
) -> Iterator[tuple[float, bytes | Gap]]:
    """A timed playback of `stream`: (the pause before it in seconds, what to write). The pauses
    are the recorded ones, each capped at `idle_limit` (recording time, as asciinema caps them) and
    then divided by `speed`. What comes before `start_s` is written first, at once and joined, so
    the screen is in the state it was at `start_s` (asciinema's seek); the playback's clock then
    starts at `start_s`."""
    if speed <= 0:
        raise ValueError("speed must be more than 0")
    start = int(start_s * US)
    held = bytearray()
    prev = start
    for e in events:
        item = item_of(e, stream)
        if item is None:
            continue
        t = e[0]
        if t < start:
            if isinstance(item, Gap):
                if held:
                    yield 0.0, bytes(held)
                    held.clear()
                yield 0.0, item
            else:
                held += item
            continue
        if held:
            yield 0.0, bytes(held)
            held.clear()
        pause = max(0, t - prev) / US
        prev = max(prev, t)
        if idle_limit is not None:
            pause = min(pause, idle_limit)
        yield pause / speed, item
    if held:
        yield 0.0, bytes(held)


# --- what a recording says of itself --------------------------------------------------------------


def meta(events: Iterable[list[Any]], name: str) -> dict[str, Any] | None:
    """The fields of the first metadata event `name` (`start`, `end`, ...), None without one."""
    for e in events:
        if e[1] == "m" and len(e) >= 4 and e[2] == name and isinstance(e[3], dict):
            return e[3]
    return None


def last_time_s(events: Iterable[list[Any]]) -> float:
    """The time of the last event, in seconds: where a recording without its end stops."""
    last = 0
    for e in events:
        last = max(last, e[0])
    return last / US


def duration_text(seconds: float) -> str:
    """A length for a person: `0.4s`, `59.9s`, `3m05s`, `1h02m03s`."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s"


def command_text(command: dict[str, Any]) -> str:
    """What a recording's `command` ran, as one line: the argv as a shell would take it, the shell
    line, a copy's paths, a tunnel's destination; empty when it names none (a login shell)."""
    argv = command.get("argv")
    if isinstance(argv, list) and argv:
        return shlex.join(str(a) for a in argv)
    if isinstance(command.get("command"), str):
        return str(command["command"])
    if "host" in command or "port" in command:
        return f"{command.get('host', '')}:{command.get('port', '')}"
    paths = [str(command[k]) for k in ("src", "path", "dest") if k in command]
    return " -> ".join(paths)


def stored_of(run_id: str, block: Any) -> Stored:
    """A block as a `recording_page` carries it (`seq`, `t`, `data`, `compressed`, `head`, `mac`),
    as the store's `Stored`, which `mind.core.recording` unpacks and checks."""
    return Stored(run_id, block.seq, block.t, block.data, block.compressed, block.head, block.mac, 0)


# --- asciicast v2 ---------------------------------------------------------------------------------


class _Text:
    """Bytes of several streams as text, each through its own incremental UTF-8 decoder (errors
    replaced, as asciinema decodes): a character split between two chunks comes out whole, and
    the streams' bytes never mix."""

    def __init__(self) -> None:
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def decode(self, stream: str, data: bytes, final: bool = False) -> str:
        dec = self._decoders.get(stream)
        if dec is None:
            dec = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return dec.decode(data, final)

    def streams(self) -> list[str]:
        return list(self._decoders)


def _line(t: int, code: str, data: str) -> str:
    return json.dumps([round(t / US, 6), code, data], ensure_ascii=False)


def _terminal_text(stream: str, text: str) -> str:
    """A plain run's output for a terminal player: its `\\n` as `\\r\\n`, what a pty's ONLCR would
    have made of it, so its lines start at the left edge (an existing `\\r\\n` shows the same)."""
    return text if stream == "pty" else text.replace("\n", "\r\n")


def to_asciicast(info: dict[str, Any], events: Iterable[list[Any]]) -> Iterator[str]:
    """The recording as asciicast v2 lines (no newlines): the header, then `[seconds, code, data]`
    events: output (`o`; a plain run's stdout and stderr both, in relay order), standard input
    (`i`), resizes after the first (`r`, `COLSxROWS`; the first is the header's size) and a marker
    (`m`) where bytes were not recorded. `info` is the recording's listing (`recording_info`)."""
    events = list(events)
    start = meta(events, "start") or {}
    size = next(((e[2], e[3]) for e in events if e[1] == "r"), None)
    cols, rows = size or DEFAULT_SIZE
    header: dict[str, Any] = {"version": 2, "width": cols, "height": rows, "timestamp": int(info.get("started") or 0)}
    command = command_text(info.get("command") or start.get("command") or {})
    if command:
        header["command"] = command
    header["title"] = f"{info.get('run_id', '')} on {info.get('hand', '')}"
    term = start.get("term")
    header["env"] = {"TERM": term} if isinstance(term, str) else {}
    yield json.dumps(header, ensure_ascii=False)
    text = _Text()
    resized = size is None
    last = 0
    for e in events:
        t, kind = e[0], e[1]
        last = max(last, t)
        if kind == "o":
            if s := text.decode(e[2], bytes(e[3])):
                yield _line(t, "o", _terminal_text(e[2], s))
        elif kind == "i":
            if s := text.decode("stdin", bytes(e[2])):
                yield _line(t, "i", s)
        elif kind == "r":
            if resized:
                yield _line(t, "r", f"{e[2]}x{e[3]}")
            resized = True
        elif kind == "g":
            # what was held of a split character cannot be finished across missing bytes
            if s := text.decode(e[2], b"", final=True):
                yield _line(t, "i" if e[2] == "stdin" else "o", _terminal_text(e[2], s))
            yield _line(t, "m", "not recorded: " + Gap(t, e[2], e[3], e[4]).text())
    for stream in text.streams():
        if s := text.decode(stream, b"", final=True):
            yield _line(last, "i" if stream == "stdin" else "o", _terminal_text(stream, s))


# --- everything, as JSON ----------------------------------------------------------------------------


def _plain(v: Any) -> Any:
    """A metadata value for JSON: bytes (none are expected in metadata) as base64 text."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def to_document(info: dict[str, Any], blocks: Iterable[Stored]) -> dict[str, Any]:
    """`mind recordings export --format json`: the listing, every block's chain head and signature
    (hex), and every event as stored, its time in microseconds and its bytes in base64 (`bytes`
    says so), for a reader that wants what asciicast cannot hold: gaps, stderr apart from stdout,
    the notes (attached, detached, the end)."""
    out_blocks = []
    events: list[Any] = []
    for b in blocks:
        evs = unpack(b)
        out_blocks.append(
            {
                "seq": b.seq,
                "t": b.t,
                "events": len(evs),
                "compressed": b.compressed,
                "head": b.head.hex(),
                "mac": b.mac.hex(),
            }
        )
        events += [_plain(e) for e in evs]
    end = meta(events, "end")
    return {
        "format": DOCUMENT_FORMAT,
        "version": 1,
        "time": "microseconds since the recording started",
        "bytes": "base64",
        "info": _plain(info),
        "complete": end is not None,
        "blocks": out_blocks,
        "events": events,
    }
