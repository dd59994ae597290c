#!/usr/bin/env bash
# Set up, lint, then run the default test suite (slow and GPU tests are excluded by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# On every core (pytest-xdist, one worker per core; `-n 0` after the arguments runs serially). With
# loadgroup the tests marked `ray` share one worker (tests/conftest.py); the rest go where there is room.
.venv/bin/python -m pytest -q --durations=15 -n auto --dist loadgroup "$@"
# The notebooks, executed top to bottom (about 2 minutes); skipped when pytest was given arguments.
if [ $# -eq 0 ]; then
  .venv/bin/python -m pytest -q -n auto notebooks
fi
