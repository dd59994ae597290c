#!/usr/bin/env bash
# Set up, lint, then run the default test suite (slow and GPU tests are excluded by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=15 "$@"
# The notebooks, executed top to bottom (about 2 minutes); skipped when pytest was given arguments.
if [ $# -eq 0 ]; then
  .venv/bin/python -m pytest -q notebooks
fi
