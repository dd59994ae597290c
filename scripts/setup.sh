#!/usr/bin/env bash
# Create .venv (once) and install einspace with pinned dependencies (CPU torch from constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
