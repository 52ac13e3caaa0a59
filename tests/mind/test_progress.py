"""mind/cli/progress.py: a status line on a terminal, nothing at all anywhere else."""

import io

from mind.cli.progress import Status, elapsed


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_on_a_terminal_it_writes_the_status_and_clears_it():
    tty = FakeTTY()
    s = Status(tty, clock=Clock())
    s.show("waiting for hand box to accept... 3 s")
    assert tty.getvalue().startswith("\r") and tty.getvalue().endswith("\x1b[K")
    assert "waiting for hand box to accept... 3 s" in tty.getvalue()
    s.clear()
    assert tty.getvalue().endswith("\r\x1b[K")
    n = len(tty.getvalue())
    s.clear()  # nothing shown: nothing to erase
    assert len(tty.getvalue()) == n


def test_updates_are_rate_limited_unless_forced_and_a_clear_resets_the_limit():
    tty, clock = FakeTTY(), Clock()
    s = Status(tty, clock=clock, min_interval=0.5)
    s.show("a")
    s.show("b")
    assert "b" not in tty.getvalue()
    s.show("c", force=True)
    assert "c" in tty.getvalue()
    clock.t += 0.6
    s.show("d")
    assert "d" in tty.getvalue()
    s.clear()
    s.show("e")
    assert "e" in tty.getvalue()


def test_not_a_terminal_writes_nothing():
    out = io.StringIO()
    s = Status(out)
    s.show("waiting", force=True)
    s.clear()
    with Status(out) as s2:
        s2.show("again", force=True)
    assert out.getvalue() == ""


def test_disabled_writes_nothing_even_on_a_terminal(monkeypatch):
    tty = FakeTTY()
    Status(tty, enabled=False).show("x", force=True)
    monkeypatch.setenv("TERM", "dumb")  # cannot erase a line there
    Status(tty).show("y", force=True)
    assert tty.getvalue() == ""


def test_leaving_the_context_clears_and_the_text_fits_one_line_without_control_bytes():
    tty = FakeTTY()
    with Status(tty) as s:
        s.show("evil\x1b[2J\nname " + "x" * 500)
    first = tty.getvalue().split("\r")[1]
    assert "\x1b[2J" not in first and "\n" not in first
    assert len(first) <= 80 + len("\x1b[K")
    assert tty.getvalue().endswith("\r\x1b[K")


def test_elapsed_reads_naturally():
    assert elapsed(3.9) == "3 s"
    assert elapsed(125) == "2 min 05 s"
