#!/usr/bin/env bash
# Runs the whole test suite (fast core tests + slow TFX/Beam/PostgreSQL tests).
# Creates the environment first when it is missing. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick core loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
