#!/usr/bin/env bash
# fail_fast.sh MODE COMMAND...: runs COMMAND (an mpirun of fail_fast_main) and
# checks how the job ends. MODE ok: exit 0. Otherwise: a non-zero exit within
# 10 s (a hang is killed at 20 s and fails), and for "throw" the message
# "[rank r] error: ..." on stderr.
set -u
mode=$1
shift
err=$(mktemp)
start=$(date +%s%N)
timeout -k 2 20 "$@" 2>"$err" >/dev/null
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "mode=$mode rc=$rc elapsed=${elapsed_ms}ms"
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$err"; rm -f "$err"; exit 1; }
if [ "$mode" = ok ]; then
  [ $rc -eq 0 ] || fail "expected exit 0"
else
  # mpirun itself exits 137 when a rank died of SIGKILL: tell a hang by the clock.
  [ $elapsed_ms -lt 20000 ] || fail "the job hung (killed by timeout after ${elapsed_ms} ms)"
  [ $rc -ne 0 ] || fail "expected a non-zero exit"
  [ $elapsed_ms -lt 10000 ] || fail "took ${elapsed_ms} ms (limit 10000)"
  if [ "$mode" = throw ]; then
    grep -q '^\[rank [0-9]*\] error: deliberate failure on the last rank' "$err" || fail "no '[rank r] error:' line"
  fi
fi
rm -f "$err"
echo PASS
