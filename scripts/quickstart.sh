#!/usr/bin/env bash
# The main job: set up, then a real search (regularised evolution seeded with a small ResNet on the
# bundled 8x8 digits, two evaluations at a time on a local Ray instance), then its report.
# Rerunning resumes the search in runs/quickstart, or, once complete, only prints the results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh ""   # the package alone: the search needs none of the test tools
.venv/bin/einspace search experiments/quickstart.yaml
.venv/bin/einspace report runs/quickstart --top 3
