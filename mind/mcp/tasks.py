"""The background-task tools: a durable command the Hand commits before it says `accepted`, runs
while the network is down and keeps the log of (README, *Background tasks*). For work longer than
an agent's session: start it, come back with `task_get` and `task_logs` whenever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from mind.errors import ClientError
from mind.mcp import results
from protocol.messages import TaskView

Result = Callable[..., CallToolResult]
TaskId = Annotated[str, Field(description="The task's id (returned by task_start).")]


def view(v: TaskView) -> dict[str, Any]:
    out: dict[str, Any] = {"task_id": v.task_id, "hand": v.hand, "state": str(v.state), "stale": v.stale}
    if v.task is not None:
        out |= {"exit_code": v.task.exit_code, "signal": v.task.signal, "log_bytes": v.task.log_bytes}
        if v.task.error:
            out["error"] = v.task.error
        if v.task.usage is not None and (used := v.task.usage.model_dump(mode="json", exclude_none=True)):
            out["usage"] = used
    if reason := (v.task.reason if v.task is not None else "") or v.reason:
        out["reason"] = reason  # the Hand's (`out_of_memory`, `exit status 3`), else the Mind's (`lost`)
    if v.stale:
        out["note"] = "the Hand is offline: this is the Mind's last word on the task"
    return out


def register(server: MCPServer, current: Callable[[], Any], result: Result, failure: Result) -> None:
    async def ask(call: Any) -> Any:
        try:
            return await call
        except ClientError as exc:
            return failure(str(exc.code), exc.message)

    @server.tool()
    async def task_start(
        hand: Annotated[str, Field(description="The Hand's name (see the `hands` tool).")],
        argv: Annotated[list[str] | None, Field(description="Program and arguments, no shell.")] = None,
        command: Annotated[str | None, Field(description="A shell command line (/bin/sh -c).")] = None,
        cwd: Annotated[str | None, Field(description="Working directory, relative to the Hand's root.")] = None,
        env: dict[str, str] | None = None,
        task_id: Annotated[
            str | None, Field(description="Your id for it: starting the same id again runs nothing twice.")
        ] = None,
        max_runtime_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 86400.0,
    ) -> CallToolResult:
        """Start a durable background task on a Hand (survives disconnects and restarts of the Mind).
        Answers at once with its task_id; follow it with task_get and task_logs."""
        if (argv is None) == (command is None) or argv == []:
            return failure("invalid_request", "give exactly one of argv (a non-empty list) or command")
        args: dict[str, Any] = {"argv": argv} if argv is not None else {"command": command}
        if cwd is not None:
            args["cwd"] = cwd
        if env:
            args["env"] = env
        tool = "exec" if argv is not None else "shell"
        res = await ask(current().client.task_start(hand, tool, args, max_runtime=max_runtime_s, task_id=task_id))
        if isinstance(res, CallToolResult):
            return res
        if str(res.outcome) == "rejected":
            code = str(res.reject_code) if res.reject_code else "rejected"
            return failure(code, res.message or f"the task was refused ({code})")
        out = {"state": str(res.outcome), "task_id": res.task_id, "hand": res.hand}
        if str(res.outcome) == "unknown":
            out["note"] = "no answer came: task_start again with the same task_id settles it"
        return result(out, error=str(res.outcome) == "unknown")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def task_get(task_id: TaskId) -> CallToolResult:
        """A task's state (queued, running, succeeded, failed, cancelled, timed_out, lost), exit code
        and log size."""
        v = await ask(current().client.task_get(task_id))
        return v if isinstance(v, CallToolResult) else result(view(v), error=False)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def task_logs(
        task_id: TaskId,
        offset: Annotated[int, Field(ge=0, description="Byte offset in the log.")] = 0,
        max_bytes: Annotated[int, Field(gt=0, le=results.READ_MAX)] = 64 << 10,
        stream: Annotated[
            Literal["stdout", "stderr"] | None, Field(description="One stream; default both in arrival order.")
        ] = None,
    ) -> CallToolResult:
        """A page of a task's log from a byte offset: data, next_offset, and eof once the task ended
        and nothing more will come."""
        page = await ask(current().client.task_logs(task_id, offset=offset, limit=max_bytes, stream=stream))
        if isinstance(page, CallToolResult):
            return page
        out = {
            "task_id": task_id,
            "state": str(page.state),
            "offset": page.offset,
            "next_offset": page.next_offset,
            "log_bytes": page.log_bytes,
            "eof": page.eof,
            "data": results.text(page.data),
        }
        return result(out, error=False)

    @server.tool()
    async def task_cancel(task_id: TaskId) -> CallToolResult:
        """Cancel a background task (its process tree is killed); task_get shows the end."""
        r = await ask(current().client.task_cancel(task_id))
        if isinstance(r, CallToolResult):
            return r
        return result({"task_id": task_id, "state": "succeeded", "cancel": str(r.status)}, error=False)
