#!/usr/bin/env bash
# The test command: install what the tests need (fast when already there), check the import
# layers with import-linter, then pytest.
#   bash scripts/test.sh [pytest args...]
# ATTNTRACE_SKIP_INSTALL=1 skips the install step. PYTHON picks the interpreter.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHON

if [ "${ATTNTRACE_SKIP_INSTALL:-0}" != "1" ]; then
  bash scripts/install-test-deps.sh
fi

# the layers of the package (pyproject.toml [tool.importlinter]): an upward import fails here
"$PYTHON" -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())'  # lint-imports

exec "$PYTHON" -m pytest -q "$@"
