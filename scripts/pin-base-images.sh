#!/usr/bin/env bash
# Resolves the Dockerfile's base-image tags to the digests they point to now, as build arguments:
#   scripts/pin-base-images.sh > docker/base-images.env
#   docker build $(sed 's/^/--build-arg /' docker/base-images.env) -t IMAGE .
# Needs a machine that reaches the registry and `docker buildx` (or `crane`). Each FROM line of
# the Dockerfile reads `NAME:TAG@${ARG}`; the ARG is printed with the digest of NAME:TAG (the
# multi-platform index's digest: BuildKit checks the platform image it pulls against it).
set -euo pipefail
cd "$(dirname "$0")/.."
digest() {
  if command -v crane >/dev/null 2>&1; then
    crane digest "$1"
  else
    docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])'
  fi
}
grep -E '^FROM [^ ]+@\$\{[A-Z_]+\}' Dockerfile | awk '{print $2}' | sort -u | while read -r ref; do
  image="${ref%@*}"
  arg="${ref#*\$\{}"; arg="${arg%\}}"
  d="$(digest "$image")"
  [[ "$d" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "no digest for $image: $d" >&2; exit 1; }
  echo "$arg=$d"
done
