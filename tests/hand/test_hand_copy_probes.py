"""The probes a copy makes of its destination before it makes it (`stat_file`, `list_tree` in
hand/system/copy.py), on a real filesystem: "nothing there, not even its directory" is an answer,
not a failure (a failed probe showed in `mind status` as a failure of a copy that succeeded), and
`list_tree` of a file describes that file (its digest for `mind cp -c` of one file)."""

from __future__ import annotations

import hashlib
import os

import pytest

from hand.system import copy


def test_stat_file_of_a_path_whose_directory_does_not_exist_says_missing(tmp_path):
    assert copy.stat_file(tmp_path, "no/such/dir/f", "'f'", None) == {"type": None, "part": None}
    assert copy.stat_file(tmp_path, "nothing", "'nothing'", None) == {"type": None, "part": None}


def test_list_tree_of_a_missing_path_says_missing_with_no_entries(tmp_path):
    assert copy.list_tree(tmp_path, "fresh", "'fresh'") == {"type": None, "entries": []}
    assert copy.list_tree(tmp_path, "a/b/c", "'a/b/c'", digests=True) == {"type": None, "entries": []}
    os.symlink("nowhere", tmp_path / "dangling")
    assert copy.list_tree(tmp_path, "dangling", "'dangling'")["type"] is None


def test_list_tree_of_a_directory_says_dir(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"abc")
    value = copy.list_tree(tmp_path, "d", "'d'", digests=True)
    assert value["type"] == "dir" and [e["path"] for e in value["entries"]] == ["f"]
    assert value["entries"][0]["sha256"] == hashlib.sha256(b"abc").hexdigest()


def test_list_tree_of_a_file_describes_that_file_alone(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"abc")
    (tmp_path / "d" / "other").write_bytes(b"not hashed")
    value = copy.list_tree(tmp_path, "d/f", "'d/f'", digests=True)
    assert value == {
        "type": "file",
        "size": 3,
        "mode": os.stat(tmp_path / "d" / "f").st_mode & 0o7777,
        "mtime": os.stat(tmp_path / "d" / "f").st_mtime,
        "entries": [],
        "sha256": hashlib.sha256(b"abc").hexdigest(),
    }
    assert "sha256" not in copy.list_tree(tmp_path, "d/f", "'d/f'")


def test_a_real_failure_still_fails(tmp_path):
    """A file where a directory is needed, or a path leading out, is not "missing"."""
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(copy.CopyFailed, match="Not a directory"):
        copy.list_tree(tmp_path, "file/below", "'file/below'")
    with pytest.raises(copy.CopyFailed, match="Not a directory"):
        copy.stat_file(tmp_path, "file/below", "'file/below'", None)
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path, root / "out")
    with pytest.raises(copy.CopyFailed, match="outside the root"):
        copy.list_tree(root, "out/file", "'out/file'")
