import os

from hand.core.sanitize import MAX_CHARS, Sanitizer


def test_root_becomes_dot_in_both_given_and_resolved_forms(tmp_path):
    real = tmp_path / "real-root"
    real.mkdir()
    link = tmp_path / "link-root"
    link.symlink_to(real)
    s = Sanitizer(link)
    out = s(f"cannot open {link}/a/b.txt and {os.path.realpath(real)}/c: denied")
    assert str(tmp_path) not in out
    assert out == "cannot open ./a/b.txt and ./c: denied"


def test_other_absolute_paths_become_placeholders(tmp_path):
    s = Sanitizer(tmp_path)
    out = s("no such file: '/etc/shadow' (see /var/log/x.log); relative a/b and ./c stay")
    assert "/etc" not in out and "/var" not in out
    assert out == "no such file: '<path>' (see <path>); relative a/b and ./c stay"


def test_a_sibling_of_the_root_is_not_mistaken_for_it(tmp_path):
    root = tmp_path / "r"
    s = Sanitizer(root)
    out = s(f"{root}x/file and {root}")
    assert out == "<path> and ."


def test_secrets_are_redacted_and_text_is_capped(tmp_path):
    s = Sanitizer(tmp_path, secrets=["deadbeef" * 8])
    assert "deadbeef" not in s("token " + "deadbeef" * 8 + " leaked")
    long = s("x" * 5000)
    assert len(long) == MAX_CHARS and long.endswith("...")


def test_control_characters_are_replaced(tmp_path):
    assert Sanitizer(tmp_path)("a\x1b[31mb\x00c\nd") == "a?[31mb?c\nd"
