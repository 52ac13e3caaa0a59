# Sourced by scripts/test, scripts/check and scripts/demo: make .venv with the package and its test extras, from
# nothing but a Python 3.11+ on PATH. Re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "mindhand needs Python 3.11 or newer on PATH (or set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.mindhand-installed"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# Keep compiled bytecode, as an installed package has it (pip compiles on install; an editable one does
# not). Without it every `mind`/`hand` process a test starts compiles its modules again, and pytest
# rewrites the asserts of every test module on each run: 5 s of the fast loop's 34 s, measured.
unset PYTHONDONTWRITEBYTECODE
