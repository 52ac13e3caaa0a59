"""`hand run`: local configuration errors exit 2 with one clear line; signals stop it with 0."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the `hand` program

SECRET = "ab" * 32


def hand(*args: str, env: dict | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    return subprocess.run(
        [sys.executable, "-m", "hand", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture
def setup(tmp_path: Path):
    cred = tmp_path / "hand.cred"
    cred.write_text(f"# my hand\nmh1:hand:h1:{SECRET}\n")
    root = tmp_path / "root"
    root.mkdir()
    return tmp_path, cred, root


def test_help_is_fast_and_clean():
    r = hand("run", "--help")
    assert r.returncode == 0 and "--root" in r.stdout and "--credential" in r.stdout


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"credential": "missing.cred"}, "cannot read credential file"),
        ({"cred_text": "mh1:hand:h1:nothex"}, "bad credential"),
        ({"cred_text": f"mh1:client:bob:{SECRET}"}, "is for a client, not a hand"),
        ({"root": "no-such-dir"}, "is not a directory"),
        ({"mind": "http://127.0.0.1:1/"}, "ws:// or wss://"),
        ({"extra": ["--deny-tools", "exec,rm"]}, "unknown tool(s) rm"),
        ({"extra": ["--max-backoff", "0"]}, "--max-backoff"),
        ({"extra": ["--log-level", "loud"]}, "unknown log level"),
        ({"mind": ""}, "no Mind URL"),
    ],
)
def test_configuration_errors_exit_2_with_one_line(setup, change, expected):
    tmp, cred, root = setup
    if "cred_text" in change:
        cred.write_text(change["cred_text"])
    r = hand(
        "run",
        "--mind",
        change.get("mind", "ws://127.0.0.1:9"),
        "--credential",
        str(tmp / change["credential"]) if "credential" in change else str(cred),
        "--root",
        str(tmp / change["root"]) if "root" in change else str(root),
        "--state-dir",
        str(tmp / "state"),
        *change.get("extra", []),
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hand: ") and expected in lines[0], r.stderr
    assert SECRET not in r.stderr


def test_env_fallbacks_state_dir_and_sigterm_exit_0(setup):
    tmp, cred, root = setup
    state = tmp / "deep" / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    env.update(MINDHAND_URL="ws://127.0.0.1:9", MINDHAND_CREDENTIAL=str(cred))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hand",
            "run",
            "--root",
            str(root),
            "--state-dir",
            str(state),
            "--log-format",
            "json",
            "--max-backoff",
            "0.5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 15
        while not state.is_dir():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "state dir never created"
            time.sleep(0.05)
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
        assert p.returncode == 0, err
        events = [json.loads(ln)["event"] for ln in out.splitlines() if ln.startswith("{")]
        assert "hand_stopped" in events  # logs go to stdout (journald), as JSON off a TTY
        assert SECRET not in out and SECRET not in err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
