#!/usr/bin/env bash
# scripts/demo builds what it runs and nothing else: its build step names the
# targets of the binaries it calls (build/src/tp, build/src/tprun), and building
# those targets in a fresh build tree compiles no test, benchmark, fuzz target or
# Python module (a dry run of the generated build: nothing is compiled here).
set -euo pipefail
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
demo=$src/scripts/demo
build_line=$(grep -E '^scripts/build( |$)' "$demo") || fail "scripts/demo has no scripts/build step"
built=$(echo "$build_line" | sed 's/#.*//' | grep -oE -- '--target [A-Za-z0-9_]+' | awk '{print $2}' | sort -u | xargs || true)
used=$(grep -oE 'build/src/[A-Za-z0-9_]+' "$demo" | sed 's|build/src/||' | sort -u | xargs)
[ -n "$built" ] || fail "scripts/demo builds every target ($build_line); it runs only: $used"
[ "$built" = "$used" ] || fail "scripts/demo builds '$built' but runs '$used'"
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release >"$dir/cfg.log" 2>&1 || { cat "$dir/cfg.log"; fail configure; }
targets=()
for t in $built; do targets+=(--target "$t"); done
# -k: in a dry run the libraries are never made, so make stops at the first link without it.
cmake --build "$dir/build" "${targets[@]}" -- -n -k >"$dir/plan.log" 2>&1 || true
for f in src/tp/cli/main.cpp src/tp/models/llama.cpp; do
  grep -q "$f" "$dir/plan.log" || { tail "$dir/plan.log"; fail "the dry run does not compile $f (the check reads nothing)"; }
done
if grep -E "(/tests/|/bench/|/fuzz/|/python/)[^ ]*\.cpp" "$dir/plan.log" | head -3 | grep .; then
  fail "building the demo's targets compiles the sources above"
fi
echo "scripts/demo builds $built: no test, benchmark, fuzz target or Python module"
