import os
from pathlib import Path

import pytest

from hand.system.paths import PathRefused, resolve
from hand.system.tools import Refusal, prepare
from protocol.codes import RejectCode


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "sub").mkdir(parents=True)
    (r / "a.txt").write_text("a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (r / "link-file-out").symlink_to(outside / "secret.txt")
    (r / "link-dir-out").symlink_to(outside)
    (r / "link-dangling-out").symlink_to(outside / "missing")
    (r / "link-in").symlink_to(r / "a.txt")
    return r


def refused(root: Path, user_path: str) -> str:
    with pytest.raises(PathRefused) as ei:
        resolve(root, user_path)
    msg = ei.value.message
    assert str(root) not in msg and os.path.realpath(root) not in msg
    return msg


@pytest.mark.parametrize("user_path", ["../x", "a/../../x", "sub/..", "..", "./../root/a.txt"])
def test_dotdot_is_refused_outright(root, user_path):
    assert "'..'" in refused(root, user_path)


def test_absolute_paths_outside_the_root_are_refused(root, tmp_path):
    refused(root, "/etc/passwd")
    refused(root, str(tmp_path / "outside" / "secret.txt"))
    refused(root, str(root) + "-sibling/x")


@pytest.mark.parametrize(
    "user_path", ["link-file-out", "link-dir-out", "link-dir-out/secret.txt", "link-dangling-out", "link-dir-out/new"]
)
def test_symlinks_leading_out_are_refused(root, user_path):
    assert "symlink" in refused(root, user_path)


def test_empty_and_nul_paths_are_refused(root):
    refused(root, "")
    refused(root, "a\x00b")


def test_paths_inside_the_root_resolve(root):
    real = Path(os.path.realpath(root))
    assert resolve(root, "a.txt") == real / "a.txt"
    assert resolve(root, ".") == real
    assert resolve(root, "sub/new-file") == real / "sub" / "new-file"
    assert resolve(root, str(root / "a.txt")) == real / "a.txt"
    assert resolve(root, str(root)) == real
    assert resolve(root, "link-in") == real / "a.txt"  # a link that stays inside is fine


def test_a_root_given_through_a_symlink_accepts_both_forms(tmp_path, root):
    link = tmp_path / "root-link"
    link.symlink_to(root)
    real = Path(os.path.realpath(root))
    assert resolve(link, str(link / "a.txt")) == real / "a.txt"
    assert resolve(link, str(root / "a.txt")) == real / "a.txt"
    assert resolve(link, "a.txt") == real / "a.txt"


def test_a_symlinked_cwd_out_of_the_root_is_refused(root):
    with pytest.raises(Refusal) as ei:
        prepare("exec", {"argv": ["true"], "cwd": "link-dir-out"}, root)
    assert ei.value.code is RejectCode.PATH_OUTSIDE_ROOT
    assert str(root) not in ei.value.message
    with pytest.raises(Refusal) as ei:
        prepare("shell", {"command": "true", "cwd": "../"}, root)
    assert ei.value.code is RejectCode.PATH_OUTSIDE_ROOT


def test_a_cwd_inside_the_root_is_used(root):
    spec = prepare("exec", {"argv": ["pwd"], "cwd": "sub"}, root)
    assert spec.cwd == Path(os.path.realpath(root)) / "sub"
    with pytest.raises(Refusal) as ei:
        prepare("exec", {"argv": ["pwd"], "cwd": "a.txt"}, root)
    assert ei.value.code is RejectCode.INVALID_REQUEST
