"""`protocol.io.files`: one hardened private-file writer for both daemons (real files, real links)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from protocol.io.files import private_dir, private_file, write_private


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_written_whole_and_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        target = tmp_path / "new" / "mind.url"
        write_private(target, "ws://127.0.0.1:1\n")
    finally:
        os.umask(old)
    assert target.read_text() == "ws://127.0.0.1:1\n"
    assert mode(target) == 0o600 and mode(target.parent) == 0o700
    write_private(target, b"\x00" * 300_000)
    assert target.read_bytes() == b"\x00" * 300_000
    assert sorted(p.name for p in target.parent.iterdir()) == ["mind.url"], "no temporary file left"


def test_a_planted_link_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    link = tmp_path / "admin.cred"
    link.symlink_to(victim)
    write_private(link, "secret\n")
    assert victim.read_text() == "precious" and mode(victim) == 0o644, "the link's target is untouched"
    assert not link.is_symlink() and link.read_text() == "secret\n" and mode(link) == 0o600


def test_private_file_refuses_a_link_and_fixes_a_loose_mode(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o644)
    (tmp_path / "tasks.db").symlink_to(victim)
    with pytest.raises(OSError) as err:
        private_file(tmp_path / "tasks.db")
    assert err.value.errno == errno.ELOOP and mode(victim) == 0o644
    loose = tmp_path / "mind.db"
    loose.write_text("")
    loose.chmod(0o666)
    private_file(loose)
    assert mode(loose) == 0o600
    d = tmp_path / "state"
    d.mkdir(mode=0o755)
    private_dir(d)
    assert mode(d) == 0o700
