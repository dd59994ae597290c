#!/usr/bin/env bash
# Set up, lint, then run the default test suite (slow and GPU tests are excluded by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# On every core (pytest-xdist: one worker per core, tests handed to whichever is free; `-n 0` after
# the arguments runs serially). Each worker runs its own module fixtures, and its own local Ray
# instance when it gets tests of test_search_ray.py. (`--dist loadgroup` would keep the `ray` tests on
# one worker, but with pytest 9.2 it silently groups nothing: pytest-xdist issue 1386.)
.venv/bin/python -m pytest -q --durations=15 -n auto "$@"
# The notebooks, executed top to bottom (about half a minute on two cores); skipped when pytest was given arguments.
if [ $# -eq 0 ]; then
  .venv/bin/python -m pytest -q -n auto notebooks
fi
