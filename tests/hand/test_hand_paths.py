import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hand.system.paths import PathRefused, _unlinked, resolve
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


def _tree(base: Path, links: list[tuple[str, str]]) -> Path:
    """A root with directories `a`, `a/b` and a file `c`, a sibling outside it, and the links asked."""
    r = base / "root"
    (r / "a" / "b").mkdir(parents=True, exist_ok=True)
    (r / "c").write_text("c")
    (base / "out").mkdir(exist_ok=True)
    for where, target in links:
        p = r / where
        if not p.parent.is_dir() or os.path.lexists(p):
            continue
        p.symlink_to(target)
    return r


@given(
    links=st.lists(
        st.tuples(
            st.sampled_from(["l", "a/l", "a/b/l", "m"]),
            st.sampled_from(["a", "a/b", "c", "missing", "../out", "/", "l", "a/l", ".", "b", "../root/a"]),
        ),
        max_size=4,
    ),
    parts=st.lists(st.sampled_from(["a", "b", "c", "l", "m", "missing", ".", ""]), min_size=1, max_size=5),
)
def test_the_shortcut_answers_only_what_realpath_answers(tmp_path_factory, links, parts) -> None:
    """`resolve` skips `realpath` when no component below the root is a link (an lstat each): its
    answer must then be `realpath`'s, for any tree of links (in, out, dangling, looping) and path."""
    base = tmp_path_factory.mktemp("t")
    r = _tree(base, links)
    root_real = Path(os.path.realpath(r))
    candidate = root_real / "/".join(parts)
    got = _unlinked(os.fspath(root_real), os.fspath(candidate))
    if got is not None:
        assert got == os.path.realpath(candidate)
