"""The Hand's end of a tree in one run (hand/system/copytree.py) on a real filesystem, without
processes: each file appears only complete and verified, modes never carry setuid, links only
inside the root, a malformed stream writes nothing outside, an interruption leaves no part."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgpack
import pytest

from hand.system import copy
from hand.system.copytree import TreeDownload, TreeUpload
from protocol import copy as rules
from protocol import treestream as ts


def file_entry(path: str, data: bytes, mode: int | None = 0o644, mtime: float | None = None) -> bytes:
    return ts.header(ts.Entry(path, "file", len(data), mode, mtime)) + data + hashlib.sha256(data).digest()


def up(root: Path, top: str = "t", preserve: bool = False, max_file: int | None = None) -> TreeUpload:
    u = TreeUpload(root, top, top, 0o755, None, preserve, max_file)
    u.open()
    return u


def parts_below(d: Path) -> list[str]:
    return [n for _, _, fs in os.walk(d) for n in fs if rules.is_part_name(n)]


def test_a_tree_is_made_and_each_file_appears_only_when_verified(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    u = up(root, preserve=True)
    data = os.urandom(5000)
    u.write([ts.header(ts.Entry("d", "dir", mode=0o750)) + ts.header(ts.Entry("d/f", "file", len(data), 0o640, 1e9))])
    u.write([data[:100]])
    assert not (root / "t" / "d" / "f").exists() and len(parts_below(root)) == 1  # a part, never the name
    u.write([data[100:] + hashlib.sha256(data).digest()])
    assert (root / "t" / "d" / "f").read_bytes() == data and parts_below(root) == []
    u.write([ts.header(ts.Entry("d/l", "symlink", target="f")) + ts.end(3)])
    value = u.finish()
    assert value["files"] == 1 and value["failed"] == [] and value["failed_count"] == 0
    st = os.stat(root / "t" / "d" / "f")
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime == 1e9
    assert stat.S_IMODE(os.stat(root / "t" / "d").st_mode) == 0o750
    assert os.readlink(root / "t" / "d" / "l") == "f"


def test_a_digest_mismatch_keeps_the_old_file_and_the_copy_goes_on(tmp_path):
    root = tmp_path / "root"
    (root / "t").mkdir(parents=True)
    (root / "t" / "a").write_bytes(b"old")
    u = up(root)
    bad = ts.header(ts.Entry("a", "file", 5, 0o644)) + b"hello" + hashlib.sha256(b"jello").digest()
    u.write([bad + file_entry("b", b"fine") + ts.end(2)])
    value = u.finish()
    assert value["files"] == 1 and value["failed"][0][0] == "a" and "sha256 mismatch" in value["failed"][0][1]
    assert (root / "t" / "a").read_bytes() == b"old" and (root / "t" / "b").read_bytes() == b"fine"
    assert parts_below(root) == []


def test_modes_never_carry_setuid_and_an_existing_file_keeps_its_mode_without_preserve(tmp_path):
    root = tmp_path / "root"
    (root / "t").mkdir(parents=True)
    (root / "t" / "kept").write_bytes(b"x")
    os.chmod(root / "t" / "kept", 0o600)
    u = up(root)
    u.write([file_entry("suid", b"x", 0o4755) + file_entry("kept", b"y", 0o777) + ts.end(2)])
    u.finish()
    assert stat.S_IMODE(os.stat(root / "t" / "suid").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "t" / "kept").st_mode) == 0o600


def test_a_link_leading_out_of_the_root_on_the_real_tree_is_not_made(tmp_path):
    """`z/up` -> `..` is inside by its text; `z/up/../../x` climbs through it out of the root."""
    root = tmp_path / "root"
    root.mkdir()
    u = up(root)
    u.write([ts.header(ts.Entry("z", "dir")) + ts.header(ts.Entry("z/up", "symlink", target=".."))])
    (root / "t" / "z" / "a").mkdir()
    u.write([ts.header(ts.Entry("z/a/esc", "symlink", target="../up/../../x")) + ts.end(3)])
    value = u.finish()
    assert os.readlink(root / "t" / "z" / "up") == ".."
    assert not os.path.lexists(root / "t" / "z" / "a" / "esc")
    assert any("outside the root" in why for _, why in value["failed"])


def test_a_symlink_where_a_directory_goes_is_never_written_through(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "t").mkdir(parents=True)
    os.symlink(outside, root / "t" / "d")
    u = up(root)
    u.write([ts.header(ts.Entry("d", "dir")) + file_entry("d/f", b"owned") + file_entry("ok", b"ok") + ts.end(3)])
    value = u.finish()
    assert os.listdir(outside) == [] and (root / "t" / "ok").read_bytes() == b"ok"
    assert value["failed"][0][0] == "d" and value["failed_count"] == 1  # its subtree said once


@pytest.mark.parametrize("path", ["../x", "/abs", "a/../../x", "", "."])
def test_a_path_escaping_the_tree_fails_the_run_and_writes_nothing(tmp_path, path):
    root = tmp_path / "root"
    root.mkdir()
    u = up(root)
    body = msgpack.packb({"path": path, "type": "file", "size": 5})
    raw = ts.PREFIX.pack(ts.TAG_HEADER, len(body)) + body + b"owned" + hashlib.sha256(b"owned").digest()
    with pytest.raises(copy.CopyFailed, match="not a plain path"):
        u.write([raw])
    assert sorted(os.listdir(tmp_path)) == ["root"] and os.listdir(root / "t") == []


def test_a_file_over_max_upload_bytes_is_refused_before_a_byte_is_written(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    u = up(root, max_file=10)
    u.write([ts.header(ts.Entry("big", "file", 11, 0o644))])
    assert os.listdir(root / "t") == []  # not even a part
    u.write([b"x" * 11 + hashlib.sha256(b"x" * 11).digest() + file_entry("small", b"ok") + ts.end(2)])
    value = u.finish()
    assert os.listdir(root / "t") == ["small"] and "max_upload_bytes" in value["failed"][0][1]


def test_a_stream_cut_short_fails_and_an_interruption_leaves_no_part(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    u = up(root)
    u.write([file_entry("a", b"done") + ts.header(ts.Entry("b", "file", 10, 0o644)) + b"half"])
    assert len(parts_below(root)) == 1
    with pytest.raises(copy.CopyFailed, match="cut short"):
        u.finish()
    assert parts_below(root) == [] and (root / "t" / "a").read_bytes() == b"done"
    assert not (root / "t" / "b").exists()
    u2 = up(root)
    u2.write([ts.header(ts.Entry("c", "file", 10, 0o644)) + b"half"])
    u2.interrupt()
    assert parts_below(root) == [] and not (root / "t" / "c").exists()


def test_a_download_sends_the_asked_files_in_order_and_errors_for_the_rest(tmp_path):
    root = tmp_path / "root"
    (root / "t" / "d").mkdir(parents=True)
    (root / "t" / "d" / "f").write_bytes(b"one")
    (root / "t" / "g").write_bytes(b"two")
    os.symlink("g", root / "t" / "link")
    os.symlink(tmp_path, root / "t" / "out")
    d = TreeDownload(root, "t", "t", ["g", "d/f", "missing", "link", "out/x"])
    d.open()
    raw = b""
    while chunk := d.read(7):  # tiny reads: the framing does not depend on them
        raw += chunk
    d.finish()
    reader = ts.TreeReader()
    events = reader.feed(raw)
    reader.close()
    entries = [e for e in events if isinstance(e, ts.Entry)]
    assert [e.path for e in entries] == ["g", "d/f", "missing", "link", "out/x"]
    assert [e.type for e in entries] == ["file", "file", "error", "error", "error"]
    assert b"".join(bytes(e.data) for e in events if isinstance(e, ts.Chunk)) == b"twoone"
    ends = [e.sha256 for e in events if isinstance(e, ts.EntryEnd)]
    assert ends == [hashlib.sha256(b"two").hexdigest(), hashlib.sha256(b"one").hexdigest()]


def test_a_file_that_shrinks_while_sent_goes_with_a_digest_the_receiver_refuses(tmp_path):
    root = tmp_path / "root"
    (root / "t").mkdir(parents=True)
    (root / "t" / "f").write_bytes(b"x" * (1 << 20))
    d = TreeDownload(root, "t", "t", ["f"])
    d.open()
    first = d.read(200)  # the header and the first 64 KiB
    os.truncate(root / "t" / "f", 10)
    raw = first
    while chunk := d.read(1 << 16):
        raw += chunk
    events = ts.TreeReader().feed(raw)
    body = b"".join(bytes(e.data) for e in events if isinstance(e, ts.Chunk))
    [end] = [e for e in events if isinstance(e, ts.EntryEnd)]
    assert len(body) == 1 << 20 and end.sha256 != hashlib.sha256(body).hexdigest()


def test_list_tree_gives_digests_when_asked(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"abc")
    entries = copy.list_tree(tmp_path, ".", ".", digests=True)["entries"]
    [f] = [e for e in entries if e["path"] == "d/f"]
    assert f["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert "sha256" not in next(e for e in entries if e["path"] == "d")


def test_what_an_upload_keeps_until_its_end_is_bounded(tmp_path, monkeypatch):
    from hand.system import copytree

    monkeypatch.setattr(copytree, "LINKS_MAX_BYTES", 20)
    monkeypatch.setattr(copytree, "UPLOAD_MAX_ENTRIES", 3)
    root = tmp_path / "root"
    root.mkdir()
    u = up(root)
    u.write(
        [ts.header(ts.Entry("a", "symlink", target="b" * 10)) + ts.header(ts.Entry("c", "symlink", target="d" * 10))]
    )
    assert [e.path for e in u.links] == ["a"] and "over" in u.failed[0][1]
    with pytest.raises(copy.CopyFailed, match="more than 3 entries"):
        u.write([ts.header(ts.Entry("e", "dir")) + ts.header(ts.Entry("f", "dir"))])
