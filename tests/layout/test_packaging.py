"""One version, written once (`protocol.__version__`), and what an installed mindhand promises: both
programs say it, the package metadata is built from it, and each package ships its `py.typed`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import hand
import mind
import protocol
from hand import cli as hand_cli
from mind import main as mind_main

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_the_packages_share_it() -> None:
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "protocol.__version__"}
    assert mind.__version__ == hand.__version__ == protocol.__version__
    assert all(part.isdigit() for part in protocol.__version__.split("."))


def test_mind_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        mind_main.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"mind {protocol.__version__}\n"


def test_hand_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        hand_cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"hand {protocol.__version__}\n"


@pytest.mark.parametrize("package", ["protocol", "mind", "hand"])
def test_each_package_ships_its_py_typed_marker(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"][package]
