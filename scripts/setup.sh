#!/usr/bin/env bash
# Creates .venv (Python 3.10) and installs sage-tfx with the pinned TFX 1.15 stack.
# Idempotent: a second run only re-checks the install (seconds). Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python310() {
  local c
  for c in "${PYTHON:-}" python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10 \
           /root/.pyenv/versions/3.10*/bin/python3.10 /usr/local/bin/python3.10 /usr/bin/python3.10; do
    [ -n "$c" ] || continue
    if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 10)' >/dev/null 2>&1; then
      command -v "$c" || echo "$c"
      return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    c="$(pyenv root)/versions/$(pyenv versions --bare | grep '^3\.10' | tail -n1)/bin/python3.10"
    [ -x "$c" ] && { echo "$c"; return 0; }
  fi
  return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
  PY=$(find_python310) || { echo "setup: Python 3.10 is required (TFX 1.15); set PYTHON=/path/to/python3.10" >&2; exit 1; }
  echo "setup: creating .venv with $PY"
  rm -rf .venv
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  echo "setup: installing uv"
  .venv/bin/python -m pip install -q --disable-pip-version-check uv==0.13.9
fi
stamp=.venv/.sage-tfx-installed
want=$(cat requirements/lock.txt setup.py | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing the pinned stack (requirements/lock.txt) and sage-tfx"
  .venv/bin/uv pip install -q --python .venv/bin/python -r requirements/lock.txt
  .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
  echo "$want" > "$stamp"
fi
echo "setup: ready ($(.venv/bin/python --version), $(.venv/bin/python -c 'import importlib.metadata as m; print("tfx", m.version("tfx"), "tensorflow", m.version("tensorflow"), "tensorflow-privacy", m.version("tensorflow-privacy"))'))"
