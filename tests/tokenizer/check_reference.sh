#!/usr/bin/env bash
# Regenerates the reference ids with node (make_reference.mjs) into a temporary
# folder and fails if they differ from the committed reference/*.json.
# Exit 77 (CTest: skipped) when node or the npm packages are missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=$here/reference
if ! command -v node >/dev/null || [[ ! -d $ref/node_modules/@lenml/tokenizers ]]; then
  echo "node or the npm packages are missing: run scripts/install-npm-deps"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
node "$ref/make_reference.mjs" "$out"
status=0
for f in "$ref"/*.json; do
  name=$(basename "$f")
  [[ $name == package*.json ]] && continue
  if ! diff -q "$f" "$out/$name" >/dev/null; then
    echo "reference/$name differs from a fresh node run:"
    diff "$f" "$out/$name" | head -20
    status=1
  fi
done
[[ $status -eq 0 ]] && echo "reference ids match a fresh node run"
exit $status
