#!/usr/bin/env bash
# The main job: set up, then sample five trees from the paper's space for 3x32x32 images.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/einspace check grammars/einspace.pcfg
.venv/bin/einspace sample grammars/einspace.pcfg --input 3,32,32 -n 5 --random-seed 0
