#!/usr/bin/env bash
# Regenerates the reference ids with node (reference/make_reference.mjs) and
# fails if they differ from the committed reference/*.json (77: skipped
# without node or the npm packages).
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../check_node_reference.sh" "$here/reference" "$here/reference/node_modules/@lenml/tokenizers"
