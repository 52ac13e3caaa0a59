"""The systemd units in contrib/ are valid units for this install (checked by systemd itself)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs systemd-analyze

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("unit", ["mindhand-mind.service", "mindhand-hand.service"])
def test_unit_files_verify(tmp_path, unit):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    text = (ROOT / "contrib" / "systemd" / unit).read_text().replace("/opt/mindhand/bin", str(BIN))
    for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "Restart=on-failure", "ExecReload="):
        assert key in text
    (tmp_path / unit).write_text(text)
    r = subprocess.run([analyze, "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if unit in ln and "not executable" not in ln]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
