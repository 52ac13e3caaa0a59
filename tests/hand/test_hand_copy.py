"""The Hand's copy work (hand/system/copy.py) on a real filesystem, without processes: the part
file, verification, resume, cleanup, modes, and the walk that a swapped symlink cannot escape."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from hand.system import copy
from protocol import copy as rules


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(root: Path, path: str, data: bytes, offset: int = 0, follows: bool = False, **kw) -> copy.Upload:
    """`follows`: the digest comes after the bytes in the stream (`digest_follows`), not up front."""
    cid = rules.copy_id("box", path, len(data), sha(data))
    return copy.Upload(
        root,
        path,
        repr(path),
        cid,
        len(data),
        None if follows else sha(data),
        offset,
        kw.get("mode"),
        kw.get("mtime"),
        kw.get("preserve", False),
        kw.get("make_dirs", False),
    )


def parts(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if rules.is_part_name(n)]


def test_an_upload_appears_only_when_complete_and_verified(tmp_path):
    data = os.urandom(300_000)
    (tmp_path / "f").write_bytes(b"old")
    up = upload(tmp_path, "f", data)
    assert up.open() == 0
    up.write([data[:1000]])
    assert (tmp_path / "f").read_bytes() == b"old" and len(parts(tmp_path)) == 1
    up.write([data[1000:]])
    value = up.finish()
    assert value["sha256"] == sha(data) and (tmp_path / "f").read_bytes() == data
    assert parts(tmp_path) == []


def test_a_digest_mismatch_removes_the_part_and_keeps_the_old_file(tmp_path):
    (tmp_path / "f").write_bytes(b"old")
    up = upload(tmp_path, "f", b"hello")
    up.open()
    up.write([b"jello"])
    with pytest.raises(copy.CopyFailed, match="sha256 mismatch"):
        up.finish()
    assert (tmp_path / "f").read_bytes() == b"old" and parts(tmp_path) == []


def test_more_bytes_than_announced_fail(tmp_path):
    up = upload(tmp_path, "f", b"abc")
    up.open()
    with pytest.raises(copy.CopyFailed, match="more bytes"):
        up.write([b"abcd"])
    assert parts(tmp_path) == [] and not (tmp_path / "f").exists()


def test_a_digest_after_the_bytes_is_taken_however_the_chunks_cut_it(tmp_path):
    """`digest_follows`: the stream is the file then its 32-byte sha256, in chunks cut anywhere
    (here through the last byte and the digest); the bytes taken count the digest's too."""
    data = os.urandom(70_000)
    stream = data + hashlib.sha256(data).digest()
    up = upload(tmp_path, "f", data, follows=True)
    up.open()
    assert up.write([stream[:69_990], stream[69_990:70_010]]) == 70_010
    assert up.write([stream[70_010:]]) == len(stream)
    assert up.finish()["sha256"] == sha(data) and (tmp_path / "f").read_bytes() == data


def test_a_resumed_upload_whose_digest_follows_checks_the_whole_file(tmp_path):
    data = os.urandom(50_000)
    first = upload(tmp_path, "f", data, follows=True)
    first.open()
    first.write([data[:30_000]])
    first.interrupt()
    second = upload(tmp_path, "f", data, offset=30_000, follows=True)
    assert second.open() == 30_000
    second.write([data[30_000:] + hashlib.sha256(data).digest()])
    assert second.finish()["sha256"] == sha(data) and (tmp_path / "f").read_bytes() == data


def test_a_following_digest_that_is_wrong_short_or_too_long_is_refused(tmp_path):
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(b"old")
    for stream, why in (
        (data + hashlib.sha256(b"another file").digest(), "sha256 mismatch"),
        (data + hashlib.sha256(data).digest()[:31], "without the file's sha256"),
        (data, "without the file's sha256"),
    ):
        up = upload(tmp_path, "f", data, follows=True)
        up.open()
        up.write([stream])
        with pytest.raises(copy.CopyFailed, match=why):
            up.finish()
        assert (tmp_path / "f").read_bytes() == b"old" and parts(tmp_path) == []
    up = upload(tmp_path, "f", data, follows=True)
    up.open()
    with pytest.raises(copy.CopyFailed, match="more bytes"):
        up.write([data + hashlib.sha256(data).digest() + b"x"])
    assert parts(tmp_path) == []


def test_an_interrupted_upload_resumes_from_its_part_and_rehashes_the_prefix(tmp_path):
    data = os.urandom(100_000)
    first = upload(tmp_path, "f", data)
    first.open()
    first.write([data[:60_000]])
    first.interrupt()
    [part] = parts(tmp_path)
    assert os.path.getsize(tmp_path / part) == 60_000
    second = upload(tmp_path, "f", data, offset=40_000)  # the sender knew less: cut back to it
    assert second.open() == 40_000
    second.write([data[40_000:]])
    assert second.finish()["sha256"] == sha(data)
    assert (tmp_path / "f").read_bytes() == data and parts(tmp_path) == []


def test_a_resume_past_what_the_part_holds_is_refused_and_the_part_kept(tmp_path):
    data = os.urandom(10_000)
    first = upload(tmp_path, "f", data)
    first.open()
    first.write([data[:100]])
    first.interrupt()
    with pytest.raises(copy.CopyFailed, match="fewer than the offset"):
        upload(tmp_path, "f", data, offset=5000).open()
    assert len(parts(tmp_path)) == 1
    with pytest.raises(copy.CopyFailed, match="no part file"):
        upload(tmp_path, "g", data, offset=5000).open()


def test_stale_part_files_are_removed_when_a_copy_starts_in_their_directory(tmp_path):
    old = tmp_path / rules.part_name("0" * 32)
    old.write_bytes(b"abandoned")
    past = time.time() - rules.STALE_PART_S - 60
    os.utime(old, (past, past))
    fresh = tmp_path / rules.part_name("1" * 32)
    fresh.write_bytes(b"someone else's, still going")
    up = upload(tmp_path, "f", b"x")
    up.open()
    up.write([b"x"])
    up.finish()
    assert not old.exists() and fresh.exists()


def test_modes_given_lose_setuid_and_existing_modes_are_kept(tmp_path):
    up = upload(tmp_path, "new", b"x", mode=0o4755)
    up.open(), up.write([b"x"]), up.finish()
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
    (tmp_path / "old").write_bytes(b"o")
    os.chmod(tmp_path / "old", 0o640)
    up = upload(tmp_path, "old", b"y", mode=0o777)
    up.open(), up.write([b"y"]), up.finish()
    assert stat.S_IMODE((tmp_path / "old").stat().st_mode) == 0o640  # without -p the old mode stays
    up = upload(tmp_path, "old", b"z", mode=0o6711, preserve=True, mtime=1_500_000_000.0)
    up.open(), up.write([b"z"]), up.finish()
    st = (tmp_path / "old").stat()
    assert stat.S_IMODE(st.st_mode) == 0o711 and int(st.st_mtime) == 1_500_000_000


def test_a_directory_swapped_for_a_symlink_cannot_lead_out(tmp_path):
    """What admission saw was a directory; what the tool meets is a link out: the walk refuses it."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, root / "d")  # the swap, done before the tool runs
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        upload(root, "d/f", b"x").open()
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.Download(root, "d/secret", "'d/secret'", 0).open()
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.list_tree(root, "d", "'d'")
    assert os.listdir(outside) == ["secret"]


def test_writes_never_go_through_a_symlink_at_the_destination(tmp_path):
    (tmp_path / "target").write_bytes(b"t")
    os.symlink("target", tmp_path / "link")
    with pytest.raises(copy.CopyFailed, match="symlink"):
        upload(tmp_path, "link", b"x").open()
    assert (tmp_path / "target").read_bytes() == b"t"


def test_a_download_hashes_the_whole_file_even_from_an_offset(tmp_path):
    data = os.urandom(700_000)
    (tmp_path / "f").write_bytes(data)
    d = copy.Download(tmp_path, "f", "'f'", 300_000)
    assert d.open() == 400_000
    got = b""
    while chunk := d.read():
        got += chunk
    value = d.finish()
    assert got == data[300_000:] and value["sha256"] == sha(data) and value["size"] == len(data)


def test_special_files_are_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(copy.CopyFailed, match="FIFO"):
        copy.Download(tmp_path, "fifo", "'fifo'", 0).open()
    with pytest.raises(copy.CopyFailed, match="FIFO"):
        upload(tmp_path, "fifo", b"x").open()
    assert copy.stat_file(tmp_path, "fifo", "'fifo'", None)["type"] == "fifo"


def test_list_tree_reports_links_without_following_them(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"12345")
    os.symlink("/etc", tmp_path / "a" / "out")
    entries = {e["path"]: e for e in copy.list_tree(tmp_path, "a", "'a'")["entries"]}
    assert set(entries) == {"b", "b/f", "out"}
    assert entries["out"]["type"] == "symlink" and entries["out"]["target"] == "/etc"
    assert entries["b/f"]["size"] == 5


def test_make_link_refuses_targets_outside_the_root(tmp_path):
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.make_link(tmp_path, "l", "'l'", "../x")
    copy.make_link(tmp_path, "d/l", "'d/l'", "../f")
    assert os.readlink(tmp_path / "d" / "l") == "../f"


def test_make_link_judges_the_target_on_the_real_tree_not_its_text(tmp_path):
    """Issue 23, attack 2: `d1/.../d30/up -> ../..(30)` is the root; `.../up/escape` then lands in
    the root, where `../..(30)/etc` (lexically inside from the path's text) is far outside."""
    root = tmp_path / "root"
    root.mkdir()
    deep = "/".join(f"d{i}" for i in range(1, 31))
    copy.make_link(root, f"{deep}/up", "'up'", "/".join([".."] * 30))
    assert os.path.realpath(root / deep / "up") == str(root)
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.make_link(root, f"{deep}/up/escape", "'escape'", "/".join([".."] * 30) + "/etc")
    assert not os.path.lexists(root / "escape") and not os.path.lexists(root / deep / "escape")
    # a `..` after a link or a missing name of the same text is refused: its meaning could change
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.make_link(root, "d1/x", "'x'", "missing/../..")
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.make_link(root, f"{deep}/y", "'y'", "up/../d1")
    copy.make_link(root, "d1/ok", "'ok'", "../d1/d2/missing-yet/z")  # climbs real dirs, then descends
    assert os.readlink(root / "d1" / "ok") == "../d1/d2/missing-yet/z"


def test_make_dir_never_re_modes_an_existing_directory_or_the_root(tmp_path):
    """Issue 23, attack 9: the root became 0777, a 1777 directory lost its sticky bit."""
    root = tmp_path / "root"
    root.mkdir(mode=0o750)
    os.chmod(root, 0o750)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o1777)
    with pytest.raises(copy.CopyFailed, match="root"):
        copy.make_dir(root, ".", "'.'", 0o777, None)
    assert copy.make_dir(root, ".", "'.'", None, 1_600_000_000.0)["created"] is False
    assert copy.make_dir(root, "shared", "'shared'", 0o777, 1_600_000_000.0)["created"] is False
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
    assert stat.S_IMODE((root / "shared").stat().st_mode) == 0o1777
    assert (root / "shared").stat().st_mtime == 1_600_000_000.0  # the time is still set
    assert copy.make_dir(root, "new", "'new'", 0o2711, None)["created"] is True
    assert stat.S_IMODE((root / "new").stat().st_mode) == 0o711  # made with it, never setgid


def test_stat_file_reports_the_part_a_resume_continues(tmp_path):
    data = b"abcdef"
    up = upload(tmp_path, "f", data)
    up.open(), up.write([data[:4]]), up.interrupt()
    cid = rules.copy_id("box", "f", len(data), sha(data))
    info = copy.stat_file(tmp_path, "f", "'f'", cid)
    assert info == {"type": None, "part": 4}


@pytest.mark.parametrize("mtime", [1e300, float("nan"), float("inf"), -1e300])
def test_put_file_refuses_an_impossible_mtime_before_anything_is_made(tmp_path, mtime):
    """Issue 23: 1e300 or NaN was an internal error after the directory had been made."""
    from hand.system.tools import Refusal, prepare
    from protocol.codes import RejectCode

    for extra in ({"type": "dir"}, {"size": 1, "sha256": "0" * 64, "copy_id": "0" * 32}):
        with pytest.raises(Refusal) as ei:
            prepare("put_file", {"path": "made/d", "mtime": mtime, "make_dirs": True, **extra}, tmp_path)
        assert ei.value.code is RejectCode.INVALID_REQUEST and "mtime" in ei.value.message
    assert os.listdir(tmp_path) == []


def test_list_tree_marks_names_and_targets_that_cannot_travel_exactly(tmp_path):
    """A name that is not UTF-8 reaches the wire as U+FFFD: the receiver must know it is not the
    name (issue 23: it collided with a real directory of that name)."""
    base = os.fsencode(tmp_path)
    os.mkdir(base + b"/\xff")
    (tmp_path / "\ufffd").mkdir()
    os.symlink(b"\xfe", base + b"/link")
    os.mkfifo(tmp_path / "fifo")
    entries = copy.list_tree(tmp_path, ".", "'.'")["entries"]
    lossy = sorted((e["path"], e["type"]) for e in entries if e.get("lossy"))
    assert lossy == [("link", "symlink"), ("\ufffd", "dir")]
    assert sum(1 for e in entries if e["path"] == "\ufffd") == 2  # one of them real, one lossy
    assert {e["path"]: e["type"] for e in entries}["fifo"] == "fifo"


def test_an_upload_never_writes_into_a_planted_part_file(tmp_path):
    """Attack 8 on the Hand's side: the part's name is derived from the copy, so someone who can
    write the directory can plant it first (a symlink, or a hard link to their victim)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    data = b"new bytes"
    part = tmp_path / rules.part_name(rules.copy_id("box", "f", len(data), sha(data)))
    os.symlink(victim, part)
    up = upload(tmp_path, "f", data)
    up.open(), up.write([data]), up.finish()
    assert (tmp_path / "f").read_bytes() == data and victim.read_bytes() == b"victim"
    os.link(victim, part)
    with pytest.raises(copy.CopyFailed, match="other names"):
        upload(tmp_path, "f", data, offset=3).open()
    assert victim.read_bytes() == b"victim"


def test_put_file_takes_a_digest_up_front_or_after_the_bytes_never_both_or_neither(tmp_path):
    from hand.system.tools import Refusal, prepare
    from protocol.codes import RejectCode

    base = {"path": "f", "size": 1, "copy_id": "0" * 32}
    for digest in ({}, {"sha256": "0" * 64, "digest_follows": True}):
        with pytest.raises(Refusal) as ei:
            prepare("put_file", {**base, **digest}, tmp_path)
        assert ei.value.code is RejectCode.INVALID_REQUEST and "sha256 or digest_follows" in ei.value.message
    for digest in ({"sha256": "0" * 64}, {"digest_follows": True}):
        assert prepare("put_file", {**base, **digest}, tmp_path) is not None
    assert os.listdir(tmp_path) == []
