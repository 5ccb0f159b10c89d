#!/usr/bin/env bash
# Sets up the environment and runs the main job on real data (see README.md).
# Extra arguments go to the job, e.g. `bash scripts/demo.sh --days 30`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m sage_tfx.pipelines.sage_demo "$@"
