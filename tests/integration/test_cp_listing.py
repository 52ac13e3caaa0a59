"""A `mind cp` is one entry in `mind runs` (issue 36 row 7): its transfers and the probes before them
were a screenful of `put_file`/`stat_file`/`list_tree` rows. The copy tags its runs with a group of
its own; `mind runs` shows it as `cp (N files, SIZE)` with the copy's state, and `mind runs --fleet
ID` its parts. Real Mind, Hand and CLI."""

from __future__ import annotations

import json
import os

import pytest

from mind.testing.cluster import running

pytestmark = pytest.mark.slow  # a real Mind and Hand, the CLI


def test_a_copy_is_one_entry_with_its_files_and_bytes(tmp_path):
    tree = tmp_path / "site"
    (tree / "css").mkdir(parents=True)
    sizes = {"index.html": 1500, "css/a.css": 2500, "b.bin": 4096}
    for name, n in sizes.items():
        (tree / name).write_bytes(os.urandom(n))
    home = tmp_path / "c"
    home.mkdir()
    with running(home) as cl:
        assert cl.cli("cp", "-r", str(tree), "box:www").returncode == 0
        assert cl.cli("exec", "box", "--", "true").returncode == 0
        assert cl.cli("cp", "box:missing.txt", str(tmp_path / "x")).returncode != 0
        lines = cl.cli("runs").stdout.decode().splitlines()[1:]
        assert len(lines) == 3, lines  # newest first: the failed copy, the exec, the tree
        failed, exec_, ok = lines
        assert " exec " in exec_
        assert " cp (3 files, 7.9 KiB) " in ok and " succeeded " in ok and ok.rstrip().endswith("-"), ok
        assert " cp " in failed and " nothing moved " in failed, failed  # it looked, found nothing, moved nothing
        parts = json.loads(cl.cli("runs", "--json").stdout)
        group = next(p["fleet"] for p in parts if p["tool"] == "put_file")
        assert ok.startswith(group + " ")
        listed = cl.cli("runs", "--fleet", group).stdout.decode()
        assert "put_file" in listed and "cp (" not in listed
