#!/usr/bin/env bash
# Runs the whole test suite (fast core tests + slow TFX/Beam/PostgreSQL tests) on every core
# (pytest-xdist, one test file per worker at a time: module fixtures are built once).
# Creates the environment first when it is missing. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the quick core loop, or `-n 0` to run serially;
# SAGE_TEST_WORKERS sets the number of workers (default: one per core).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n "${SAGE_TEST_WORKERS:-auto}" --dist loadfile "$@"
