"""scripts/gen_wire.py: the fast path's checks (mind/client/wire_gen.py) are what the models produce,
and a change to a model the fast path reads is caught: `--check` fails, or the generator refuses a
rule it cannot translate.

tests/mind/test_wire.py checks the other half: what the generated checks accept, they read as the
models do.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mind.client import checks
from protocol import limits

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_wire.py"
MESSAGES = ROOT / "protocol" / "messages.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves forward references through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


gen = _load(SCRIPT, "gen_wire_under_test")


def render_with(tmp_path: Path, edit) -> str:
    """What the generator makes of protocol/messages.py changed by `edit` (in a copy, in-process)."""
    text = MESSAGES.read_text()
    changed = edit(text)
    assert changed != text, "the edit did not apply: the test is out of date with protocol/messages.py"
    path = tmp_path / "drifted_messages.py"
    path.write_text(changed)
    name = f"drifted_messages_{abs(hash(changed))}"
    try:
        return gen.Generator(_load(path, name), limits, checks.RULES).render()
    finally:
        sys.modules.pop(name, None)


def replace_in_class(cls: str, old: str, new: str):
    """An edit of one line inside `class cls`, leaving the same text in other classes alone."""

    def edit(text: str) -> str:
        start = text.index(f"class {cls}(")
        end = text.find("\nclass ", start + 1)
        end = len(text) if end < 0 else end
        assert old in text[start:end], f"{old!r} is not in {cls}"
        return text[:start] + text[start:end].replace(old, new, 1) + text[end:]

    return edit


def test_the_checked_in_checks_are_what_the_models_produce():
    assert gen.generate() == (ROOT / "mind" / "client" / "wire_gen.py").read_text(), (
        "mind/client/wire_gen.py is out of step with protocol/messages.py: run scripts/gen_wire.py"
    )


DRIFTS = {
    "a new field": replace_in_class(
        "RunUpdate", "    gen: Int | None = None\n", "    gen: Int | None = None\n    note: Str = ''\n"
    ),
    "a field dropped": replace_in_class("CancelRunResult", "    state: RunState\n", ""),
    "a bound": replace_in_class("RunOutput", "max_length=limits.PROGRESS_CHUNK_MAX", "max_length=1024"),
    "a type": replace_in_class("RunUpdate", "gen: Int | None = None", "gen: NonNeg | None = None"),
    "a default": replace_in_class("OutputTail", "total: NonNeg = 0", "total: NonNeg = 1"),
    "a pattern": replace_in_class("RunEnd", "tool: Label", "tool: Id"),
    "a required field made optional": replace_in_class("Welcome", "mac: Mac", "mac: Mac | None = None"),
    "a validator's logic": replace_in_class("RunEnd", "if self.state not in RUN_TERMINAL:", "if self.state in ():"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_a_change_to_a_model_the_fast_path_reads_changes_the_checks(tmp_path, drift):
    current = (ROOT / "mind" / "client" / "wire_gen.py").read_text()
    assert render_with(tmp_path, DRIFTS[drift]) != current


def test_a_change_the_fast_path_does_not_read_leaves_the_checks_alone(tmp_path):
    same = render_with(tmp_path, replace_in_class("TaskView", "stale: Bool", "stale: Bool | None = None"))
    assert same == (ROOT / "mind" / "client" / "wire_gen.py").read_text()
    # nor does a validator's signature, docstring, comments or layout: only what it does counts
    cosmetic = replace_in_class(
        "RunEnd",
        "    def _terminal(self) -> RunEnd:\n",
        '    def _terminal(self) -> "RunEnd":\n        """A run_end is terminal."""  # by definition\n\n',
    )
    assert render_with(tmp_path, cosmetic) == same


@pytest.mark.parametrize(
    "edit,why",
    [
        (
            replace_in_class("RunOutput", "offset: NonNeg", "offset: Annotated[int, Strict(), Field(multiple_of=2)]"),
            "run_output.offset: int schema with ['multiple_of']",
        ),
        (
            replace_in_class(
                "RunUpdate", "gen: Int | None = None", "gen: Annotated[int | None, Field(alias='g')] = None"
            ),
            "run_update.gen",
        ),
        (
            replace_in_class(
                "CancelRunResult",
                "    state: RunState\n",
                "    state: RunState\n\n    @model_validator(mode='after')\n    def _same(self) -> CancelRunResult:\n        return self\n",
            ),
            "CancelRunResult._same has no twin in mind.client.checks.RULES",
        ),
        (
            replace_in_class("RunUpdate", "gen: Int | None = None", "gen: dict[str, Int]"),
            "run_update.gen: a 'dict' schema",
        ),
    ],
)
def test_what_the_generator_cannot_translate_is_refused_naming_the_field(tmp_path, edit, why):
    with pytest.raises(gen.Unsupported) as ei:
        render_with(tmp_path, edit)
    assert why in str(ei.value)


@pytest.mark.slow
def test_check_exits_zero_on_the_tree_and_one_when_a_copy_of_the_models_drifted(tmp_path):
    run = [sys.executable, str(SCRIPT), "--check"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    copy = tmp_path / "protocol"
    shutil.copytree(ROOT / "protocol", copy, ignore=shutil.ignore_patterns("__pycache__"))
    messages = copy / "messages.py"
    messages.write_text(DRIFTS["a bound"](messages.read_text()))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    bad = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1, bad.stderr
    assert "out of step with protocol/messages.py" in bad.stderr and "max_len=1024" in bad.stderr
    assert ok.stdout == "" and not (tmp_path / "mind").exists()  # --check writes nothing
