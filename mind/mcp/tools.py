"""The tools an agent sees: each one's JSON schema and description (written for a model: what it
does, what comes back, what to do next) and what it asks of the Mind, as an ordinary client with the
server's credential (or, over HTTP, the request's bearer credential), so exactly that scope applies.

Every result is one JSON text block (and the same as structured content); `isError` is set for
anything but a run that succeeded or is still running, and an error names the mindhand code
(`unknown_hand`, `path_outside_root`, `denied_by_policy`, ...) with a sentence to act on.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from mind.errors import ClientError, MindhandError
from mind.mcp import files, fleet, results, tasks
from mind.mcp.budget import OverBudget
from mind.mcp.cancels import PeerCancels, key_of
from mind.mcp.runs import FEED_MAX, Feed, Followed, Runs, cancel_for_peer, wait
from protocol.messages import RunEnd, RunInfo
from protocol.states import RunState

Current = Callable[[], Runs]
"""The runs (and the Mind client) of the credential this call acts as."""
READ_ONLY = ToolAnnotations(read_only_hint=True)
WAIT_S_DEFAULT = 30.0
"""Under the 60 s at which most MCP clients time a call out (the official one does not reset its
timer on progress): a longer run comes back as still running, with its id, and goes on."""
WAIT_S_MAX = 50.0
"""A call waits no longer than this, whatever it asks: a client that times the call out first sends
`notifications/cancelled` (the official SDK does, as a courtesy), which cannot be told from a cancel
its user meant, and would kill the run. To wait longer, call `run_get` again."""
FILE_CALL_TIMEOUT_S = 60.0

Hand = Annotated[str, Field(description="The Hand's name (see the `hands` tool).")]
RunId = Annotated[str, Field(description="A run id, as returned by `exec` or listed by `runs`.")]
TaskId = Annotated[str, Field(description="The task's id, as given to or returned by `task_start`.")]
Argv = Annotated[
    list[str] | None,
    Field(description='The program and its arguments, run without a shell, e.g. ["ls", "-la"]. Give argv or command.'),
]
Command = Annotated[
    str | None, Field(description="A shell command line, run with /bin/sh -c (pipes, globs, &&). Give argv or command.")
]
Cwd = Annotated[str | None, Field(description="Working directory on the Hand, relative to its root.")]
Env = Annotated[dict[str, str] | None, Field(description="Extra environment variables for the command.")]


def result(out: dict[str, Any], error: bool | None = None) -> CallToolResult:
    err = results.is_error(out) if error is None else error
    return CallToolResult(
        content=[TextContent(type="text", text=results.as_text(out))], structured_content=out, is_error=err
    )


def failure(code: str, message: str) -> CallToolResult:
    return result(results.error_result(code, message), error=True)


def from_end(end: RunEnd, f: Followed | None = None, limit: int = results.SHOW_BYTES) -> dict[str, Any]:
    """A run's end as a result: the output this server followed if it did, else the end's tails."""
    if f is not None:
        out, err = f.stdout.view(), f.stderr.view()
    else:
        out = results.StreamView.of_tail(end.stdout.total, end.stdout.data)
        err = results.StreamView.of_tail(end.stderr.total, end.stderr.data)
    said = results.run_result(
        run_id=end.run_id,
        hand=end.hand,
        state=end.state.value,
        stdout=out,
        stderr=err,
        exit_code=end.exit_code,
        signal=end.signal,
        reason=end.reason,
        error=end.error,
        reject_code=end.reject_code.value if end.reject_code else None,
        usage=end.usage.model_dump(mode="json", exclude_none=True) if end.usage is not None else None,
        kill=end.kill,
        limit=limit,
    )
    if f is not None:  # the follower's verdict, as `mind exec`'s 122: bytes the command wrote that never came
        verdict = f.handle.delivery()
        if not verdict.complete:
            said["complete"] = False
            said["incomplete"] = verdict.notes
    return said


def of_followed(f: Followed, limit: int = results.SHOW_BYTES) -> dict[str, Any]:
    if f.end is not None:
        return from_end(f.end, f, limit)
    if f.failure is not None:
        code = getattr(f.failure, "code", "closed")
        return results.error_result(str(code), f"run {f.run_id}: {f.failure} (run_get tells its fate)")
    return results.run_result(
        run_id=f.run_id or "",
        hand=f.hand,
        state="running",
        stdout=f.stdout.view(),
        stderr=f.stderr.view(),
        limit=limit,
    )


def of_info(info: RunInfo) -> dict[str, Any]:
    if info.end is not None:
        return from_end(info.end)
    empty = results.StreamView(0, b"", b"")
    out = results.run_result(run_id=info.run_id, hand=info.hand, state=info.state.value, stdout=empty, stderr=empty)
    out["note"] = "another client is attached to this run: its output goes there; its end will show here"
    return out


def code_of(exc: MindhandError) -> str:
    return str(getattr(exc, "code", "error"))


SAID_ELSEWHERE = {
    "limit": ("max_bytes",),
    "length": ("max_bytes",),
    "size": ("max_bytes",),
    "timeout": ("timeout_s", "wait_s"),
    "cmd": ("command", "argv"),
    "args": ("argv",),
    "run_id": ("run",),
    "data": ("content",),
    "content": ("data",),
    "file": ("path",),
    "filename": ("path",),
    "dir": ("path",),
    "host": ("hand",),
    "machine": ("hand",),
}
"""Names an agent brings from elsewhere (the Hand's own tools, `mind call`, other servers), and
the argument of ours it means: the Hand's `read_file` takes `limit` where ours takes `max_bytes`."""


def unknown_arguments(tool: str, given: Iterable[str], known: Sequence[str]) -> str | None:
    """The sentence refusing a call with arguments `tool` does not take (naming the valid ones, and
    the one each was likely meant as), or None. Refused, not ignored: an ignored `limit` reads the
    default 256 KiB instead of what was asked, and the agent never learns why."""
    unknown = [name for name in given if name not in known]
    if not unknown:
        return None
    hints = []
    for name in unknown:
        meant = [m for m in SAID_ELSEWHERE.get(name, ()) if m in known] or difflib.get_close_matches(name, known, 1)
        if meant:
            hints.append(meant[0] if len(unknown) == 1 else f"{meant[0]} for {name}")
    said = ", ".join(repr(name) for name in unknown)
    out = f"{tool} takes no argument{'s' if len(unknown) > 1 else ''} {said}"
    if hints:
        out += f" (did you mean {', '.join(hints)}?)"
    return out + f"; its arguments: {', '.join(known) or 'none'}"


def register(server: MCPServer, current: Current, cancels: PeerCancels) -> None:
    """Every tool, in the order an agent's `tools/list` shows them: one function per family, so each
    tool's code reads on its own and none grows past the complexity gate (scripts/check)."""
    register_hands(server, current)
    register_exec(server, current, cancels)
    register_run_tools(server, current, cancels)
    register_cancel_and_stdin(server, current)
    register_runs(server, current)
    register_file_tools(server, current)
    tasks.register(server, current, result, failure)
    files.register(server, current, result, failure, from_end)


async def guarded(call: Awaitable[CallToolResult]) -> CallToolResult:
    """`call`'s answer, or the Mind's refusal as an error result."""
    try:
        return await call
    except ClientError as exc:
        return failure(code_of(exc), exc.message)


def register_hands(server: MCPServer, current: Current) -> None:
    """`hands`: the first tool an agent calls, to learn the names every other tool takes."""

    @server.tool(annotations=READ_ONLY)
    async def hands() -> CallToolResult:
        """The Hands (machines) this credential may use: name, online, labels (role=web ...), runs in
        flight. Pass a name as `hand` to the other tools."""

        async def go() -> CallToolResult:
            hs = await current().client.hands()
            rows = [{"name": h.name, "online": h.connected, "labels": h.labels, "running": h.running} for h in hs]
            return result({"state": "succeeded", "hands": rows})

        return await guarded(go())


def register_exec(server: MCPServer, current: Current, cancels: PeerCancels) -> None:
    """`exec`: a command on one Hand, or on every Hand a selector names."""

    @server.tool(name="exec")
    async def exec_(
        ctx: Context,
        hand: Annotated[str | None, Field(description="The Hand's name (see `hands`). Give hand or selector.")] = None,
        selector: Annotated[
            str | None,
            Field(
                description="Run on every Hand this names instead of one: names and globs (web*, a,b) or labels "
                "(role=web+dc=eu1). Answers one result per Hand (results), each with its run id."
            ),
        ] = None,
        argv: Argv = None,
        command: Command = None,
        cwd: Cwd = None,
        env: Env = None,
        stdin: Annotated[str | None, Field(description="Text given to the command as its standard input.")] = None,
        stdin_open: Annotated[
            bool,
            Field(
                description="Keep standard input open after `stdin` for write_stdin (for an interactive "
                "program). A command that reads stdin then waits until write_stdin sends eof."
            ),
        ] = False,
        timeout_s: Annotated[
            float, Field(gt=0, le=86400, description="Deadline: past it the Hand kills the command's whole tree.")
        ] = 3600.0,
        wait_s: Annotated[
            float,
            Field(
                ge=0,
                le=WAIT_S_MAX,
                description="How long this call waits for the end (at most 50). A run still going then is NOT "
                "stopped: the answer says still_running with its run id (use run_get / read_output / cancel).",
            ),
        ] = WAIT_S_DEFAULT,
    ) -> CallToolResult:
        """Run a command on a Hand and return how it ended: state (succeeded, failed, timed_out,
        cancelled, rejected, lost), exit_code, stdout and stderr apart. Long output shows its first
        and last 4 KiB with a marker giving the byte offset to page from with read_output. A command
        that outlasts wait_s keeps running and comes back as still_running with its run id. With
        selector: the same on every Hand it names, one result per Hand; an error if any failed."""
        if (hand is None) == (selector is None):
            return failure("invalid_request", "give exactly one of hand (one Hand's name) or selector (several)")
        if (argv is None) == (command is None):
            return failure("invalid_request", "give exactly one of argv (a list of words) or command (a shell line)")
        if argv is not None and not argv:
            return failure("invalid_request", "argv is empty: give the program to run as its first word")
        args: dict[str, Any] = {"argv": argv} if argv is not None else {"command": command}
        if cwd is not None:
            args["cwd"] = cwd
        if env:
            args["env"] = env
        runs = current()
        tool = "exec" if argv is not None else "shell"
        if selector is not None:
            if stdin is not None or stdin_open:
                return failure("invalid_request", "stdin and stdin_open go with one hand, not a selector")
            try:
                many = await fleet.start(runs, selector, tool, args, timeout_s)
            except ClientError as exc:
                return failure(code_of(exc), exc.message)
            except OverBudget as exc:
                return failure(exc.code, exc.message)
            return await fleet_waited(runs, many, wait_s, ctx, cancels)
        assert hand is not None
        first = stdin.encode() if stdin is not None else None
        feed = Feed(first) if stdin_open else None
        try:
            with runs.reserve() as held:  # the byte budget first: a run beyond it never starts
                handle = await runs.client.start(
                    hand,
                    tool,
                    args,
                    timeout=timeout_s,
                    watch=False,
                    stdin=feed.chunks() if feed is not None else first,
                )
                f = runs.follow(handle, hand, feed, held)
        except OverBudget as exc:
            return failure(exc.code, exc.message)
        except ClientError as exc:
            return failure(code_of(exc), exc.message)
        return await waited(runs, f, wait_s, ctx, cancels)


async def waited(runs: Runs, f: Followed, wait_s: float, ctx: Context, cancels: PeerCancels) -> CallToolResult:
    async def progress(n: float, message: str) -> None:
        await ctx.report_progress(n, None, message)

    # notifications/cancelled for this call is a mindhand cancel of its run (spawned: the call's
    # own scope is cancelled); a closed stream cancels the call alone, and the run goes on
    key = key_of(runs, ctx.request_context.request, ctx.request_context.request_id)
    with cancels.watching(key, lambda: runs.spawn(cancel_for_peer(runs, f))):
        await wait(f, wait_s, progress)
    return result(of_followed(f))


async def fleet_waited(
    runs: Runs, many: fleet.Fleet, wait_s: float, ctx: Context, cancels: PeerCancels
) -> CallToolResult:
    async def progress(n: float, message: str) -> None:
        await ctx.report_progress(n, None, message)

    key = key_of(runs, ctx.request_context.request, ctx.request_context.request_id)
    with cancels.watching(key, many.run.cancel):  # as Ctrl-C: the runs in flight cancelled
        await fleet.wait(many, wait_s, progress)
    return result(many.answer(of_followed))


def register_run_tools(server: MCPServer, current: Current, cancels: PeerCancels) -> None:
    """What an agent does with a run once it has its id: wait for it, page its output, cancel it, feed its stdin."""

    @server.tool()
    async def run_get(
        run: RunId,
        ctx: Context,
        wait_s: Annotated[
            float,
            Field(ge=0, le=WAIT_S_MAX, description="Wait up to this long for the end (0: answer at once; at most 50)."),
        ] = 0.0,
    ) -> CallToolResult:
        """A run's state, exit code and output (bounded, as exec returns it); with wait_s, waits for
        its end first. Finds runs started by exec here or earlier (by this credential)."""
        runs = current()
        f = runs.get(run)
        if f is None:
            try:
                info = await runs.client.get_run(run)
                if info.end is not None or info.client_away_since is None:
                    return result(of_info(info))  # ended, or another client of ours follows it
                f = await runs.adopt(run, info.hand)  # left unattended (a server before this one)
            except ClientError as exc:
                return failure(code_of(exc), exc.message)
            except OverBudget as exc:
                return failure(exc.code, exc.message)
        return await waited(runs, f, wait_s, ctx, cancels)

    @server.tool(annotations=READ_ONLY)
    async def read_output(
        run: RunId,
        stream: Annotated[Literal["stdout", "stderr"], Field(description="Which output stream.")] = "stdout",
        offset: Annotated[int, Field(ge=0, description="Byte offset in the stream to read from.")] = 0,
        max_bytes: Annotated[int, Field(gt=0, le=results.READ_MAX, description="At most this many bytes.")] = 64 << 10,
    ) -> CallToolResult:
        """Page through a run's output by byte offset (as the marker in a result names). Available:
        the first 4 KiB and the last 4 MiB of each stream of a run this server followed (started by
        exec or looked at with run_get; less when many runs print a lot); for any other run, only
        the last 4 KiB the Mind keeps with its end. An offset no longer kept is answered with `gone`
        (exactly which bytes) and the page from the first byte kept after them. Answers next_offset
        to continue from and eof once the run ended and nothing more will come."""
        runs = current()
        f = runs.get(run)
        if f is None:
            try:
                info = await runs.client.get_run(run)
            except ClientError as exc:
                return failure(code_of(exc), exc.message)
            if info.end is None:
                return failure(
                    "not_followed", f"run {run} is followed by another client: run_get(run) takes it up here"
                )
            tail = info.end.stdout if stream == "stdout" else info.end.stderr
            r = results.Retained(total=tail.total, base=tail.total - len(tail.data))
            r.window += tail.data
            done = True
        else:
            r, done = f.stream(stream), f.done
        return result(page(run, stream, r, done, offset, max_bytes))


def page(run: str, stream: str, r: results.Retained, done: bool, offset: int, max_bytes: int) -> dict[str, Any]:
    """One `read_output` answer: the bytes from `offset`, or, when that offset is gone, exactly which
    bytes are gone and the page from where reading can go on (never silently another range)."""
    if offset > r.total:
        return results.error_result(
            "invalid_request",
            f"offset {offset} is past the end of {stream}: {r.total} bytes so far (read from {r.total} at most)",
        )
    start, data = r.read(offset, max_bytes)
    out: dict[str, Any] = {"state": "succeeded", "run": run, "stream": stream}
    gone = r.gone()
    if start != offset and gone is not None:
        out["gone"] = {"from": gone[0], "to": gone[1]}
        out["note"] = (
            f"bytes {gone[0]} to {gone[1]} of {stream} are no longer kept (offset {offset} is among them); "
            f"this page starts at {start}, the first byte kept after them"
        )
    return out | {
        "offset": start,
        "next_offset": start + len(data),
        "total": r.total,
        "eof": done and start + len(data) >= r.total,
        "data": results.text(data),
    }


def register_cancel_and_stdin(server: MCPServer, current: Current) -> None:
    """`cancel` and `write_stdin`: what an agent does to a run it started."""

    @server.tool()
    async def cancel(run: RunId) -> CallToolResult:
        """Stop a run: its whole process tree is killed. Answers with the run's authoritative end
        (cancelled, or how it ended if it ended first) once known, within 10 s."""
        runs = current()
        try:
            answer = await runs.client.cancel(run)
        except ClientError as exc:
            return failure(code_of(exc), exc.message)
        f = runs.get(run)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if f is not None and f.done:
                return result(of_followed(f), error=False)
            if f is None:
                try:
                    info = await runs.client.get_run(run)
                except ClientError as exc:
                    return failure(code_of(exc), exc.message)
                if info.end is not None:
                    return result(of_info(info), error=False)
            await asyncio.sleep(0.1)
        return result({"state": str(answer.state), "run": run, "cancel": str(answer.status)}, error=False)

    @server.tool()
    async def write_stdin(
        run: RunId,
        data: Annotated[str, Field(max_length=1 << 20, description="Text to send to the command's stdin.")] = "",
        eof: Annotated[bool, Field(description="Then close its stdin (the command sees end of input).")] = False,
    ) -> CallToolResult:
        """Send text to the standard input of a run started here by exec with stdin_open=true; eof
        closes it. Then run_get or read_output shows what the command answered."""
        f = current().get(run)
        if f is None or f.feed is None:
            return failure("invalid_request", f"run {run} was not started by exec with stdin_open=true on this server")
        if f.feed.closed or f.done:
            return failure("stdin_closed", f"run {run}: its stdin is closed (eof was sent, or the run ended)")
        raw = data.encode()
        if f.feed.queued + len(raw) > FEED_MAX:
            return failure(
                "stdin_full",
                f"run {run}: {f.feed.queued} bytes sent before are not read yet, and {len(raw)} more would pass "
                f"the {FEED_MAX} that may wait here: send less at a time, or see with run_get what the command does",
            )
        if not f.may_queue(len(raw)):
            return failure(
                "over_budget", f"run {run}: {len(raw)} more bytes of stdin do not fit this credential's budget"
            )
        f.feed.write(raw, eof)
        return result({"state": "succeeded", "run": run, "bytes": len(raw), "eof": eof})


def register_runs(server: MCPServer, current: Current) -> None:
    """`runs`: this credential's history, to find a run whose answer was lost."""

    @server.tool(annotations=READ_ONLY)
    async def runs(
        hand: Annotated[str | None, Field(description="Only this Hand's runs.")] = None,
        state: Annotated[RunState | None, Field(description="Only runs in this state.")] = None,
        fleet: Annotated[
            str | None, Field(description="Only the runs of this fleet (the `fleet` id an exec with a selector gave).")
        ] = None,
        limit: Annotated[int, Field(gt=0, le=200)] = 20,
    ) -> CallToolResult:
        """This credential's recent runs, newest first: run id, Hand, tool, state, exit code, times.
        Use it to find a run whose answer was lost, or every run of a fleet."""

        async def go() -> CallToolResult:
            rows = []
            listing = await current().client.run_listing(hand=hand, state=state, limit=limit, fleet=fleet)
            for info in listing.runs:
                row = {
                    "run": info.run_id,
                    "hand": info.hand,
                    "tool": info.tool,
                    "state": info.state.value,
                    "exit_code": info.end.exit_code if info.end else None,
                    "created_at": info.created_at,
                    "ended_at": info.ended_at,
                }
                if info.node is not None:  # Mind nodes sharing a database: the one holding it
                    row["node"] = info.node
                rows.append(row)
            out: dict[str, Any] = {"state": "succeeded", "runs": rows}
            if listing.missing_nodes:  # partial: these nodes did not answer in time (DESIGN §16)
                out["missing_nodes"] = listing.missing_nodes
            return result(out)

        return await guarded(go())


async def tool_call(current: Current, hand: str, tool: str, args: dict[str, Any]) -> RunEnd | CallToolResult:
    """A file tool's successful end, or the result to answer with when it did not succeed."""
    try:
        end = await current().client.exec(hand, tool, args, FILE_CALL_TIMEOUT_S)
    except ClientError as exc:
        return failure(code_of(exc), exc.message)
    if end.state is not RunState.SUCCEEDED:
        return result(from_end(end), error=True)
    return end


def register_file_tools(server: MCPServer, current: Current) -> None:
    """Single files through the Hand's file tools, each one call bounded by FILE_CALL_TIMEOUT_S."""

    @server.tool(annotations=READ_ONLY)
    async def read_file(
        hand: Hand,
        path: Annotated[str, Field(description="The file, relative to the Hand's root.")],
        offset: Annotated[int, Field(ge=0)] = 0,
        max_bytes: Annotated[int, Field(gt=0, le=1 << 20, description="At most this many bytes.")] = 256 << 10,
        encoding: Annotated[
            Literal["auto", "utf-8", "base64"],
            Field(
                description="auto: text if the bytes are UTF-8 text, else base64 (the answer's encoding says "
                "which); utf-8: text, undecodable bytes replaced; base64: always base64."
            ),
        ] = "auto",
    ) -> CallToolResult:
        """Read a file on a Hand: content from offset (at most max_bytes; text, or base64 for binary:
        see encoding), its size, eof, and next_offset to continue from."""
        end = await tool_call(current, hand, "read_file", {"path": path, "offset": offset, "limit": max_bytes})
        if isinstance(end, CallToolResult):
            return end
        v = end.value
        data: bytes = v["data"]
        content, used, n = files.encode_page(data, encoding, v["eof"])
        out = {"state": "succeeded", "path": path, "offset": v["offset"], "size": v["size"], "eof": v["eof"]}
        return result(out | {"next_offset": v["offset"] + n, "encoding": used, "content": content})

    @server.tool()
    async def write_file(
        hand: Hand,
        path: Annotated[str, Field(description="The file, relative to the Hand's root.")],
        content: Annotated[str, Field(description="What to write (text, or base64 with encoding=base64).")],
        encoding: Literal["utf-8", "base64"] = "utf-8",
        mode: Annotated[
            Literal["overwrite", "append", "create"], Field(description="create: fail if the file exists.")
        ] = "overwrite",
        make_dirs: Annotated[bool, Field(description="Create missing parent directories.")] = False,
    ) -> CallToolResult:
        """Write a file on a Hand (never through a symlink). Answers bytes_written."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        except ValueError:
            return failure("invalid_request", "content is not valid base64")
        args = {"path": path, "data": data, "mode": mode, "make_dirs": make_dirs}
        end = await tool_call(current, hand, "write_file", args)
        if isinstance(end, CallToolResult):
            return end
        return result({"state": "succeeded", "path": path, "bytes_written": end.value["bytes_written"]})

    @server.tool(annotations=READ_ONLY)
    async def list_dir(
        hand: Hand, path: Annotated[str, Field(description="Directory, relative to the Hand's root.")] = "."
    ) -> CallToolResult:
        """List a directory on a Hand: entries with name, type (file, dir, symlink) and size."""
        end = await tool_call(current, hand, "list_dir", {"path": path})
        if isinstance(end, CallToolResult):
            return end
        v = end.value
        return result({"state": "succeeded", "path": path, "entries": v["entries"], "truncated": v["truncated"]})


NEEDS: dict[str, tuple[str, ...]] = {
    "exec": ("exec", "shell"),
    "run_get": ("exec", "shell"),
    "read_output": ("exec", "shell"),
    "cancel": ("exec", "shell"),
    "write_stdin": ("exec", "shell"),
    "runs": ("exec", "shell"),
    "task_start": ("exec", "shell"),
    "task_get": ("exec", "shell"),
    "task_logs": ("exec", "shell"),
    "task_cancel": ("exec", "shell"),
    "read_file": ("read_file",),
    "write_file": ("write_file",),
    "list_dir": ("list_dir",),
    "upload": ("put_file",),
    "download": ("get_file",),
}
"""The Hand tools each MCP tool calls (any one of them suffices); `hands` and any tool not named here
need none. A credential scoped `--tools read_file,list_dir` is offered `hands`, `read_file` and
`list_dir`, not thirteen tools every call of which the Mind would refuse."""


def offered(name: str, allowed: tuple[str, ...] | None) -> bool:
    """Whether `tools/list` shows MCP tool `name` to a credential allowed the Hand tools `allowed`
    (globs, as its scope holds them; None: not known, so everything is shown)."""
    from fnmatch import fnmatchcase

    needs = NEEDS.get(name)
    if allowed is None or needs is None:
        return True
    return any(fnmatchcase(tool, pattern) for tool in needs for pattern in allowed)
