"""`upload` and `download`: small files copied whole to and from a Hand, as `mind cp` copies them
(the Hand's `put_file` / `get_file`): verified by sha256 and atomic. An upload is written to a part
file beside the destination and renamed only once its digest matched, so a reader of the path never
sees half a file and a failed upload leaves the old file as it was; a download is checked against
the digest the Hand computed while reading before a byte of it is answered.

`write_file` and `read_file` stay for text a model edits (append, offsets, paging); these two are for
files taken as a whole (a script, a config, an archive, a binary), in base64 when they are not text.
Both are bounded (`FILE_MAX`): a model pays for every byte of a result, and a call is one JSON-RPC
message. A larger file is refused with a sentence naming the way (read_file pages, `mind cp`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import hashlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from mind.errors import ClientError
from protocol import copy as rules
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

FILE_MAX = 4 << 20
"""The largest file `upload` and `download` copy (decoded bytes): 5.6 MB of base64 in one message."""
CALL_TIMEOUT_S = 60.0
"""A copy of at most `FILE_MAX` takes well under a second; past this the Hand stops it."""

Result = Callable[..., CallToolResult]
Hand = Annotated[str, Field(description="The Hand's name (see the `hands` tool).")]
Path = Annotated[str, Field(description="The file, relative to the Hand's root.")]


def decode(data: str, encoding: str) -> bytes | str:
    """The bytes an upload's `data` stands for, or the sentence saying why it stands for none."""
    if encoding == "utf-8":
        return data.encode()
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "data is not valid base64 (A-Z a-z 0-9 + / with = padding, no line breaks)"


def text_of(data: bytes, final: bool = True) -> tuple[str, int] | None:
    """`data` as text, and how many of its bytes that text stands for, when it is text: valid UTF-8
    with no NUL byte (what git, grep and `file` take for text). A page with more after it (not
    `final`) may end inside a character: the text stops before it and the next page starts with it,
    so paging a text file never mangles a character. None when it is not text (binary, or a page
    starting inside a character): give base64, byte for byte."""
    if b"\0" in data:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=final)
    except UnicodeDecodeError:
        return None
    used = len(data) - len(decoder.getstate()[0])
    return (text, used) if used or not data else None


def encode(data: bytes, encoding: str) -> tuple[str, str]:
    """(the text a model is given, the encoding it is in): `auto` is UTF-8 text when the bytes are
    text (`text_of`), else base64, so a binary file is never silently mangled."""
    if encoding == "auto" and (text := text_of(data)) is not None:
        return text[0], "utf-8"
    if encoding == "utf-8":
        try:
            return data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return data.decode("utf-8", "replace"), "utf-8 (undecodable bytes replaced)"
    return base64.b64encode(data).decode(), "base64"


def encode_page(data: bytes, encoding: str, eof: bool) -> tuple[str, str, int]:
    """One page of a file as `encode` gives a whole one, and how many bytes it stands for: with
    `auto`, a text page stops before a character its end would cut (`text_of`)."""
    if encoding == "auto" and (text := text_of(data, final=eof)) is not None:
        return text[0], "utf-8", text[1]
    content, used = encode(data, encoding)
    return content, used, len(data)


def register(
    server: MCPServer,
    current: Callable[[], Any],
    result: Result,
    failure: Result,
    from_end: Callable[[RunEnd], dict[str, Any]],
) -> None:
    def refused(end: RunEnd) -> CallToolResult:
        return result(from_end(end), error=True)

    @server.tool()
    async def upload(
        hand: Hand,
        path: Path,
        data: Annotated[str, Field(description="The whole file: text, or base64 with encoding=base64.")],
        encoding: Annotated[
            Literal["utf-8", "base64"], Field(description="How data is given: utf-8 text or base64 bytes.")
        ] = "utf-8",
        mode: Annotated[
            str | None,
            Field(
                pattern=r"^0?[0-7]{3}$",
                description='Permissions in octal, e.g. "644" or "755" (an executable script). Default: a '
                "new file gets 644, an existing one keeps its mode.",
            ),
        ] = None,
        make_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = False,
    ) -> CallToolResult:
        """Copy a small file (at most 4 MiB) to a Hand as a whole, replacing the file at path
        atomically: written beside it, checked by sha256 on the Hand, then renamed (a failed upload
        leaves the old file as it was). Answers its size, sha256 and mode."""
        raw = decode(data, encoding)
        if isinstance(raw, str):
            return failure("invalid_request", raw)
        if len(raw) > FILE_MAX:
            return failure(
                "too_large",
                f"the file is {len(raw)} bytes, over upload's {FILE_MAX} (4 MiB): copy larger files with "
                "`mind cp`, or write them in parts with write_file(mode=append)",
            )
        sha = hashlib.sha256(raw).hexdigest()
        perm = int(mode, 8) if mode is not None else None
        args: dict[str, Any] = {
            "path": path,
            "size": len(raw),
            "sha256": sha,
            "copy_id": rules.copy_id(hand, path, len(raw), sha),
            "offset": 0,
            "make_dirs": make_dirs,
        }
        if perm is not None:
            args |= {"mode": perm, "preserve": True}  # the mode asked for, on an existing file too
        try:
            handle = await current().client.start(
                hand, "put_file", args, timeout=CALL_TIMEOUT_S, stdin=raw, stream=True, watch=False
            )
            end = await handle.wait()
        except ClientError as exc:
            return failure(str(exc.code), exc.message)
        if end.state is not RunState.SUCCEEDED:
            return refused(end)
        v = end.value or {}
        out = {"state": "succeeded", "hand": hand, "path": path, "size": v.get("size", len(raw))}
        out |= {"sha256": v.get("sha256", sha), "mode": format(v.get("mode", 0o644), "03o")}
        return result(out)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def download(
        hand: Hand,
        path: Path,
        encoding: Annotated[
            Literal["auto", "utf-8", "base64"],
            Field(description="auto: text if the file is valid UTF-8, else base64 (the answer says which)."),
        ] = "auto",
    ) -> CallToolResult:
        """Copy a small file (at most 4 MiB) from a Hand as a whole, checked against the sha256 the
        Hand computed while reading it. Answers content (text or base64: see encoding), size and
        sha256. For a larger file, read_file pages through it by offset."""
        client = current().client
        try:
            handle = await client.start(
                hand,
                "get_file",
                {"path": path, "offset": 0},
                timeout=CALL_TIMEOUT_S,
                stream=True,
                output_limit=1 << 50,  # bounded here, at FILE_MAX, with a sentence instead of a cut
                watch=False,
            )
            got = bytearray()
            over = False
            end: RunEnd | None = None
            async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                async for ev in handle.events():
                    if isinstance(ev, StreamData) and ev.stream == "stdout" and ev.data and not over:
                        got += ev.data
                        if len(got) > FILE_MAX:
                            over = True
                            got.clear()
                            if handle.run_id is not None:
                                with contextlib.suppress(ClientError):
                                    await client.cancel(handle.run_id)
                    elif isinstance(ev, RunEnd):
                        end = ev
        except ClientError as exc:
            return failure(str(exc.code), exc.message)
        except TimeoutError:
            return failure("timed_out", f"download of {path} from {hand} did not end within {CALL_TIMEOUT_S:.0f} s")
        if over:
            return failure(
                "too_large",
                f"{path} is larger than download's {FILE_MAX} bytes (4 MiB): read it in pages with "
                "read_file(offset=..., max_bytes=...), or copy it with `mind cp`",
            )
        if end is None:
            return failure("closed", f"download of {path}: the run's events ended without its end")
        if end.state is not RunState.SUCCEEDED:
            return refused(end)
        v = end.value or {}
        sha = hashlib.sha256(got).hexdigest()
        if v.get("sha256") != sha or v.get("size") != len(got):
            return failure(
                "mismatch",
                f"{path}: got {len(got)} bytes with sha256 {sha[:16]}..., the Hand read {v.get('size')} bytes "
                f"with {str(v.get('sha256'))[:16]}... (the file changed while it was read?): download again",
            )
        content, used = encode(bytes(got), encoding)
        out = {"state": "succeeded", "hand": hand, "path": path, "size": len(got), "sha256": sha}
        if isinstance(v.get("mode"), int):
            out["mode"] = format(v["mode"], "03o")
        return result(out | {"encoding": used, "content": content})
