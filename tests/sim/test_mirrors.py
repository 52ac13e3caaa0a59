"""The simulation's hand-kept models cannot silently fall behind the shells they model
(see `tests/sim/mirrors.py`)."""

from __future__ import annotations

import ast
import textwrap

from sim import mirrors


def test_every_modelled_shell_is_unchanged_since_its_model_was_checked() -> None:
    changed = mirrors.drift()
    assert not changed, (
        "shipped code changed without its simulation model:\n  "
        + "\n  ".join(changed)
        + "\nupdate the model if behaviour changed, then: .venv/bin/python tests/sim/mirrors.py --update"
    )


def test_the_fingerprint_sees_a_change_of_behaviour_but_not_of_prose() -> None:
    def fp(src: str) -> str:
        return mirrors._hash(ast.parse(textwrap.dedent(src)).body[0])

    base = fp('''
        def drain(self):
            """Why."""
            while self.pending:
                self.take()
        ''')
    assert (
        fp('''
        def drain(self):
            """Another explanation, reflowed."""
            while self.pending:  # a comment
                self.take()
        ''')
        == base
    )
    assert (
        fp('''
        def drain(self):
            """Why."""
            if self.pending:
                self.take()
        ''')
        != base
    )


def test_every_model_named_exists_and_the_record_covers_every_mirror() -> None:
    for shipped, model in mirrors.MIRRORS.items():
        assert mirrors._load(shipped) is not None and mirrors._load(model) is not None
    assert set(mirrors.recorded()) == set(mirrors.MIRRORS)
