"""The run's cgroup seen from the client side: the limit flags (`--memory` is the whole run's memory,
`--address-space` the old per-process limit, `--pids`, `--cpus`) as every command reads them, and what
a run or a task used (`usage`), how it was contained (`kill`) and an `out_of_memory` end, as `mind run
get`, `mind task get`, `mind exec`, `mind hands`, fleet runs and `mind mcp` show them. In-process:
models fed to the views, no Mind and no Hand."""

from __future__ import annotations

import argparse
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from mind.cli import exits, fleet, formatting, main, task, views
from mind.cli.exits import EXIT_USAGE
from mind.cli.toolargs import tool_args_from
from mind.client import wire
from mind.main import add_daemon_parsers
from mind.mcp import tasks as mcp_tasks
from mind.mcp import tools as mcp_tools
from protocol.envelope import Envelope, encode
from protocol.messages import (
    HandClaims,
    HandInfo,
    OutputTail,
    RunEnd,
    RunInfo,
    TaskInfo,
    TaskView,
    Usage,
)
from protocol.states import RunState, TaskState

OOM_ERROR = "out of memory: the run's memory limit is 64 MiB"
USAGE = Usage(cpu_user_s=0.04, cpu_system_s=0.11, memory_peak=64 << 20, pids_peak=10, oom_kills=1, throttled_s=0.0)
USAGE_LINE = "cpu 0.04s user 0.11s sys, memory peak 64.0 MiB, pids peak 10, oom kills 1"


def parse(*words: str) -> argparse.Namespace:
    return main.parse(list(words), daemon=[add_daemon_parsers])


def limits_of(*words: str) -> dict[str, Any] | None:
    _, tool_args = tool_args_from(parse(*words))
    return tool_args.get("limits")


def oom_end(**over: Any) -> RunEnd:
    fields: dict[str, Any] = {
        "run_id": "r1",
        "hand": "box",
        "tool": "exec",
        "state": RunState.FAILED,
        "reason": "out_of_memory",
        "signal": 9,
        "error": OOM_ERROR,
        "duration_ms": 1200,
        "usage": USAGE,
        "kill": "cgroup",
        "stderr": OutputTail(data=b"Killed\n", total=7),
    }
    return RunEnd(**(fields | over))


# --- the flags -----------------------------------------------------------------------------------


def test_memory_is_the_runs_memory_and_address_space_the_old_per_process_limit():
    assert limits_of("exec", "h", "--memory", "512M", "--", "x") == {"memory": 512 << 20}
    assert limits_of("exec", "h", "--address-space", "4G", "--", "x") == {"address_space": 4 << 30}


def test_every_limit_flag_goes_to_its_field():
    got = limits_of(
        "exec",
        "h",
        "--cpu-seconds",
        "60",
        "--memory",
        "64M",
        "--pids",
        "100",
        "--cpus",
        "0.5",
        "--address-space",
        "1G",
        "--max-files",
        "256",
        "--max-procs",
        "30",
        "--",
        "make",
    )
    assert got == {
        "cpu_seconds": 60,
        "memory": 64 << 20,
        "pids": 100,
        "cpus": 0.5,
        "address_space": 1 << 30,
        "open_files": 256,
        "processes": 30,
    }
    assert isinstance(got["cpus"], float) and isinstance(got["pids"], int)


def test_cpus_takes_a_whole_number_as_a_share_too():
    assert limits_of("exec", "h", "--cpus", "2", "--", "x") == {"cpus": 2.0}


@pytest.mark.parametrize(
    "words",
    [
        ["task", "start", "--hand", "h", "--memory", "64M", "--pids", "8", "--cpus", "0.25", "--", "x"],
        ["exec", "--hands", "web*", "--memory", "64M", "--pids", "8", "--cpus", "0.25", "--", "x"],
    ],
    ids=["task start", "fleet"],
)
def test_task_start_and_fleet_runs_read_the_same_flags(words):
    want = {"memory": 64 << 20, "pids": 8, "cpus": 0.25}
    args = parse(*words)
    if args.hands is not None:
        _, tool_args, *_ = fleet.check_fleet_args(args)
    else:
        _, tool_args = tool_args_from(args)
    assert tool_args["limits"] == want


def test_shell_and_no_flags_send_no_limits():
    _, tool_args = tool_args_from(parse("shell", "h"))
    assert "limits" not in tool_args
    assert limits_of("exec", "h", "--", "x") is None


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--memory", "0", "--memory: size '0' must be more than 0"),
        ("--memory", "lots", "--memory: 'lots' is not a size"),
        ("--memory", "512K", "--memory must be at least 1M"),
        ("--memory", "1.5G", "--memory: '1.5G' is not a size"),
        ("--address-space", "0", "--address-space: size '0' must be more than 0"),
        ("--pids", "0", "--pids must be positive"),
        ("--pids", "-3", "--pids must be positive"),
        ("--cpus", "0", "--cpus must be a number > 0"),
        ("--cpus", "-1", "--cpus must be a number > 0"),
        ("--cpus", "half", "--cpus must be a number > 0"),
        ("--cpus", "nan", "--cpus must be a number > 0"),
        ("--cpus", "inf", "--cpus must be a number > 0"),
        ("--cpus", "0.001", "--cpus must be a number > 0 (at least 0.01)"),
    ],
)
def test_a_bad_limit_is_a_usage_error_naming_its_flag(flag, value, said, capsys):
    args = parse("exec", "h", flag, value, "--", "x")
    with pytest.raises(SystemExit) as exc:
        tool_args_from(args)
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"mind: {said}") and "Traceback" not in err


def test_a_pids_that_is_no_integer_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("exec", "h", "--pids", "many", "--", "x")
    assert exc.value.code == EXIT_USAGE and "--pids" in capsys.readouterr().err


def test_the_help_says_what_each_limit_is(capsys):
    with pytest.raises(SystemExit):
        parse("exec", "--help")
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--memory SIZE memory the whole run may use", "--address-space SIZE address space per process"):
        assert text in out
    assert "--pids N" in out and "--cpus X" in out and out.count("Needs the Hand's cgroups") == 3


# --- usage and kill, for a person ------------------------------------------------------------------


def test_usage_in_one_line_and_unknown_figures_left_out():
    assert formatting.usage_text(USAGE) == USAGE_LINE
    assert formatting.usage_text(Usage(memory_peak=2048, oom_kills=0, throttled_s=0.0)) == "memory peak 2.0 KiB"
    assert formatting.usage_text(Usage(throttled_s=1.5)) == "throttled 1.50s"
    assert formatting.usage_text(Usage(cpu_system_s=1.5)) == "cpu 1.50s sys"
    assert formatting.usage_text(Usage()) is None
    assert formatting.usage_text(None) is None


def test_kill_for_a_person_says_what_a_process_group_cannot_promise():
    assert formatting.kill_text("cgroup") == "cgroup"
    assert formatting.kill_text("process_group") == "process group (descendants that left it may survive)"
    assert formatting.kill_text(None) is None


# --- mind exec / attach ---------------------------------------------------------------------------


def test_an_out_of_memory_end_exits_137_and_says_the_reason_and_the_limit(capsys):
    end = oom_end()
    assert exits.exit_code_for(end) == 137
    formatting.explain(end)
    assert capsys.readouterr().err == f"mind: run r1 failed (out_of_memory): {OOM_ERROR}\n"


def test_an_out_of_memory_end_with_an_exit_code_is_explained_too(capsys):
    """A shell whose child the kernel killed exits 137 itself: still said, as its reason."""
    end = oom_end(signal=None, exit_code=137)
    assert exits.exit_code_for(end) == 137
    formatting.explain(end)
    assert capsys.readouterr().err == f"mind: run r1 failed (out_of_memory): {OOM_ERROR}\n"
    formatting.explain(oom_end(signal=None, exit_code=137, error=None))
    assert capsys.readouterr().err == "mind: run r1 failed: out_of_memory\n"


def test_other_ends_are_explained_as_before(capsys):
    formatting.explain(oom_end(reason="exit status 3", exit_code=3, signal=None, error=None))
    assert capsys.readouterr().err == ""
    formatting.explain(oom_end(reason="killed by signal 9", error=None))
    assert capsys.readouterr().err == "mind: run r1 failed: killed by signal 9\n"


def test_exec_json_carries_usage_and_kill_as_they_come():
    summary = formatting.end_summary(oom_end())
    assert summary["usage"] == USAGE.model_dump(mode="json") and summary["kill"] == "cgroup"
    assert summary["reason"] == "out_of_memory" and summary["error"] == OOM_ERROR and summary["signal"] == 9
    json.dumps(summary)
    bare = formatting.end_summary(oom_end(usage=None, kill=None))
    assert bare["usage"] is None and bare["kill"] is None


def test_the_fast_path_reads_usage_and_kill_and_shows_them_the_same():
    """`mind exec` reads the end without pydantic (mind/client/wire_gen.py): same summary, same line."""
    end = oom_end()
    msg = wire.decode(encode(Envelope(msg=end, seq=1, id="x1", gen=1))).msg
    assert formatting.end_summary(msg) == formatting.end_summary(end)
    assert formatting.usage_text(msg.usage) == USAGE_LINE and msg.kill == "cgroup"
    assert formatting.event_line(msg)["usage"] == USAGE.model_dump(mode="json")


# --- mind run get ---------------------------------------------------------------------------------


class Client:
    def __init__(self, **answers: Any) -> None:
        self.answers = answers

    def __getattr__(self, name: str) -> Any:
        async def answer(*args: Any, **kwargs: Any) -> Any:
            return self.answers[name]

        return answer


def run_info(end: RunEnd | None) -> RunInfo:
    return RunInfo(
        run_id="r1",
        hand="box",
        tool="exec",
        state=end.state if end else RunState.RUNNING,
        gen=1,
        created_at=1_700_000_000.0,
        ended_at=1_700_000_001.2 if end else None,
        args_digest="0" * 64,
        end=end,
    )


async def test_run_get_shows_usage_and_kill(capsys):
    args = SimpleNamespace(run_id="r1", json=False)
    assert await views.run_get(Client(get_run=run_info(oom_end())), args) == 0
    out = capsys.readouterr().out
    assert "reason   out_of_memory\n" in out and f"error    {OOM_ERROR}\n" in out
    assert f"usage    {USAGE_LINE}\n" in out and "kill     cgroup\n" in out
    await views.run_get(Client(get_run=run_info(oom_end(usage=None, kill="process_group"))), args)
    out = capsys.readouterr().out
    assert "usage" not in out and "kill     process group (descendants that left it may survive)\n" in out


async def test_run_get_json_has_the_ends_usage_and_kill(capsys):
    await views.run_get(Client(get_run=run_info(oom_end())), SimpleNamespace(run_id="r1", json=True))
    end = json.loads(capsys.readouterr().out)["end"]
    assert end["usage"] == USAGE.model_dump(mode="json") and end["kill"] == "cgroup"
    assert end["reason"] == "out_of_memory" and end["signal"] == 9


# --- mind task get / wait -------------------------------------------------------------------------


def task_view(usage: Usage | None = USAGE, **over: Any) -> TaskView:
    fields: dict[str, Any] = {
        "task_id": "t1",
        "tool": "shell",
        "state": TaskState.FAILED,
        "version": 3,
        "args_digest": "a" * 64,
        "binding_digest": "b" * 64,
        "max_runtime_ms": 60_000,
        "created_at": 1_700_000_000.0,
        "started_at": 1_700_000_000.5,
        "finished_at": 1_700_000_002.0,
        "signal": 9,
        "reason": "out_of_memory",
        "error": OOM_ERROR,
        "usage": usage,
    }
    info = TaskInfo(**(fields | over))
    return TaskView(
        hand="box",
        task=info,
        task_id="t1",
        state=info.state,
        stale=False,
        last_synced_at=1_700_000_003.0,
        created_at=1_700_000_000.0,
    )


async def test_task_get_shows_usage(capsys):
    assert await task.get(Client(task_get=task_view()), SimpleNamespace(task_id="t1", json=False)) == 0
    out = capsys.readouterr().out
    assert f"usage     {USAGE_LINE}\n" in out and "reason    out_of_memory\n" in out and "(signal 9)" in out
    await task.get(Client(task_get=task_view(usage=None)), SimpleNamespace(task_id="t1", json=False))
    assert "usage" not in capsys.readouterr().out


async def test_task_get_json_has_usage(capsys):
    await task.get(Client(task_get=task_view()), SimpleNamespace(task_id="t1", json=True))
    d = json.loads(capsys.readouterr().out)
    assert d["usage"] == USAGE.model_dump(mode="json") and d["reason"] == "out_of_memory"
    assert task.view_json(task_view(usage=None))["usage"] is None


def test_task_wait_names_the_reason_and_the_limit():
    v = task_view()
    assert task.outcome_code(v) == 137
    assert task.final_line(v) == f"task t1 failed (signal 9, out_of_memory): {OOM_ERROR}"
    other = task_view(reason="exit status 3", exit_code=3, signal=None, error=None)
    assert task.final_line(other) == "task t1 failed (exit code 3)"


# --- mind hands ---------------------------------------------------------------------------------


def hand(name: str, claims: HandClaims | None) -> HandInfo:
    return HandInfo(name=name, connected=True, generation=1, since=1_700_000_000.0, claims=claims)


def claims(**over: Any) -> HandClaims:
    base: dict[str, Any] = {"hostname": "h", "platform": "linux", "machine": "x86_64", "python": "3.11", "version": "1"}
    return HandClaims(**(base | over))


HANDS = [
    hand("cg", claims(cgroups="v2", limits=["memory", "pids", "cpus"])),
    hand("plain", claims(cgroups="none", limits=[])),
    hand("old", claims()),
    hand("bare", None),
]


async def test_hands_json_says_cgroups_and_limits_at_the_top(capsys):
    assert await views.list_hands(Client(hands=HANDS), SimpleNamespace(labels=None, json=True)) == 0
    got = {h["name"]: (h["cgroups"], h["limits"]) for h in json.loads(capsys.readouterr().out)}
    assert got == {
        "cg": ("v2", ["memory", "pids", "cpus"]),
        "plain": ("none", []),
        "old": (None, None),
        "bare": (None, None),
    }


async def test_hands_table_has_a_cgroups_column(capsys):
    await views.list_hands(Client(hands=HANDS), SimpleNamespace(labels=None, json=False))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "CONNECTED", "GEN", "SINCE", "HOST", "PLATFORM", "CGROUPS", "RUNNING", "LABELS"]
    col = {ln.split()[0]: ln[lines[0].index("CGROUPS") :].split()[0] for ln in lines[1:]}
    assert col == {"cg": "v2", "plain": "none", "old": "-", "bare": "-"}


# --- fleet runs ---------------------------------------------------------------------------------


def test_the_fleet_names_a_hand_that_ran_out_of_memory(capsys):
    from mind.core import fleet as plan_core

    args = SimpleNamespace(json=False, events=False, group=False, fail_fast=False, timeout=3600.0)
    results = {
        "a": SimpleNamespace(exit_code=None, end=oom_end()),
        "b": SimpleNamespace(exit_code=3, end=oom_end(reason="exit status 3", exit_code=3, signal=None, error=None)),
    }
    flt = SimpleNamespace(fleet_id="fleet-1", plan=SimpleNamespace(max_errors=2), results=results)
    p = fleet.Printer(args, [SimpleNamespace(name="a"), SimpleNamespace(name="b")], flt)  # type: ignore[arg-type]
    p.summary(plan_core.Aggregate(2, {"failed": 2}, {"a": "failed", "b": "failed"}, 2, False, False, 120))
    err = capsys.readouterr().err
    assert re.search(r"mind:\s+a\s+failed \(signal 9, out_of_memory\)\n", err), err
    assert re.search(r"mind:\s+b\s+failed \(exit 3\)\n", err), err
    live = fleet._why(SimpleNamespace(msg=oom_end(), state="failed"), False)
    assert live == f" (signal 9, out_of_memory): {OOM_ERROR}"
    assert fleet._why(SimpleNamespace(msg=oom_end(signal=None, exit_code=137), state="failed"), False) == (
        f" (exit 137, out_of_memory): {OOM_ERROR}"
    )


# --- mind mcp -----------------------------------------------------------------------------------


def test_an_mcp_result_has_usage_and_the_out_of_memory_reason():
    out = mcp_tools.from_end(oom_end(usage=Usage(memory_peak=64 << 20, oom_kills=1, cpu_user_s=0.5)))
    assert out["usage"] == {"cpu_user_s": 0.5, "memory_peak": 64 << 20, "oom_kills": 1}  # unknown figures left out
    assert out["kill"] == "cgroup" and out["reason"] == "out_of_memory" and out["error"] == OOM_ERROR
    assert out["state"] == "failed" and out["signal"] == 9
    assert mcp_tools.result(out).is_error
    plain = mcp_tools.from_end(oom_end(usage=None, kill=None, state=RunState.SUCCEEDED, reason="", signal=None))
    assert "usage" not in plain and "kill" not in plain


def test_an_mcp_task_view_has_usage_and_the_tasks_own_reason():
    out = mcp_tasks.view(task_view())
    assert out["usage"] == USAGE.model_dump(mode="json") and out["reason"] == "out_of_memory"
    assert out["error"] == OOM_ERROR and out["signal"] == 9
    assert "usage" not in mcp_tasks.view(task_view(usage=None))
