"""scripts/demo is the README's first command: it must run end to end and say what it shows."""

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs scripts/demo

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDHAND_")}
    env["TMPDIR"] = str(tmp_path)
    r = subprocess.run(
        [str(ROOT / "scripts" / "demo")], env=env, capture_output=True, timeout=240, stdin=subprocess.DEVNULL
    )
    out = r.stdout.decode(errors="replace")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, out + err
    for line in (
        "step 1",
        "step 2",
        "step 3",
        "python files unpacked on the hand: ",
        "HELLO FROM THE DEMO HAND",
        "exit code: 3 (the remote exit code)",
        "exit code: 124",
        "exit code: 125",
        "hello from the demo hand",
        "run id before any answer: r",
        "what the Mind sent for it: RunEnd (succeeded, ",
        "building 3\nbuilt",
        "demo-build",
        "state     succeeded",
        "the copy came back byte for byte",
        "the tree came back identical",
        "exit code: 0 (the task's outcome)",
        "root is work",
        "root is work2",
        "exit code: 120 (not every Hand succeeded: the aggregate code)",
        "up to the far Hand: 64 MiB in ",
        "down from it: 64 MiB in ",
        "the same bytes back (and each copy's sha256 was checked at its receiver)",
        "demo finished",
    ):
        assert line in out, f"{line!r} missing from demo output:\n{out}\n{err}"
    assert "to stderr" in err
    # the second tree copy sends only the edited file (the rest are the same on the Hand)
    assert "demo:./site: 1 file sent, 201 skipped (unchanged)" in err
    # the Hand's warning (no --run-as in the demo) is shown whole, ending its last sentence (issue 24)
    warning = [ln for ln in out.splitlines() if ln.startswith("hand: WARNING: ")]
    assert len(warning) == 1 and warning[0].endswith("run the Hand as root with --run-as USER (a user of its own)."), (
        out
    )
    assert "a warning" not in out, "task logs --stream stdout printed stderr's bytes"
    local = out.split("local : ", 1)[1].split()[0]
    remote = out.split("remote: ", 1)[1].split()[0]
    assert local == remote, "the stdin piped through mind exec reached sha256sum whole"
    # a hands table showing the demo Hand connected
    assert any(ln.split()[:2] == ["demo", "yes"] for ln in out.splitlines())
    # it cleaned up after itself: no state dir left behind, no daemon left running
    assert list(tmp_path.glob("mindhand-demo.*")) == []
