#!/usr/bin/env bash
# Shared by the conformance tests whose goldens a node script renders from npm
# reference packages: runs `node REF_DIR/make_reference.mjs OUT` into a
# temporary folder and fails if any committed REF_DIR/*.json differs.
# Exit 77 (CTest: skipped) when node or one of the NEEDED folders is missing.
# Usage: check_node_reference.sh REF_DIR NEEDED...
set -euo pipefail
ref=$1
shift
for needed in "$@"; do
  if ! command -v node >/dev/null || [[ ! -d $needed ]]; then
    echo "node or the npm packages are missing ($needed): run scripts/install-npm-deps"
    exit 77
  fi
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
node "$ref/make_reference.mjs" "$out"
status=0
for f in "$ref"/*.json; do
  name=$(basename "$f")
  [[ $name == package*.json ]] && continue
  if ! diff -q "$f" "$out/$name" >/dev/null; then
    echo "$(basename "$ref")/$name differs from a fresh node run:"
    diff "$f" "$out/$name" | head -20
    status=1
  fi
done
[[ $status -eq 0 ]] && echo "$ref/*.json match a fresh node run"
exit $status
