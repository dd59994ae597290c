#!/usr/bin/env bash
# Create .venv (once) and install einspace with pinned dependencies (CPU torch from constraints.txt).
# The argument names the extras (default `test`: what the test script needs); `bash scripts/setup.sh ""`
# installs the package alone, which is all the quick start's search needs.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1-test}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
