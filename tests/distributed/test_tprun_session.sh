#!/usr/bin/env bash
# tprun gives each job its own Open MPI session directory (concurrent jobs
# sharing one race: open-mpi/ompi#8510), waits for mpirun and removes it:
#  - after a job, nothing of it is left under $TMPDIR;
#  - SIGTERM to tprun ends the job: its ranks are gone, tprun exits non-zero
#    within seconds, and the directory is removed too.
set -euo pipefail
tprun=$1
env_check=$2
dir=$(mktemp -d)
trap 'pkill -f "sleep 47.25" 2>/dev/null || true; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export TMPDIR=$dir/tmp
mkdir -p "$TMPDIR"

"$tprun" --nproc-per-node 2 "$env_check" >"$dir/out" 2>"$dir/err" || { cat "$dir/out" "$dir/err"; fail "tprun job"; }
session=$(sed -n 's/.*session directory \(.*\))$/\1/p' "$dir/out")
case "$session" in "$TMPDIR"/tprun-*) ;; *) cat "$dir/out"; fail "session directory '$session' is not under \$TMPDIR" ;; esac
[ ! -e "$session" ] || fail "tprun left $session behind"
[ -z "$(ls -A "$TMPDIR")" ] || { ls -la "$TMPDIR"; fail "tprun left files under \$TMPDIR"; }
echo "tprun: the job ran in $session, removed when it ended"

"$tprun" --nproc-per-node 2 sleep 47.25 >"$dir/sleep.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ "$(pgrep -f -x "sleep 47.25" | wc -l)" -ge 2 ] && break; sleep 0.1; done
[ "$(pgrep -f -x "sleep 47.25" | wc -l)" -ge 2 ] || { cat "$dir/sleep.out"; fail "the 2 ranks did not start"; }
kill -TERM "$pid"
start=$(date +%s)
rc=0
wait "$pid" || rc=$?
elapsed=$(($(date +%s) - start))
[ "$rc" -ne 0 ] || fail "tprun exited 0 after SIGTERM"
[ "$elapsed" -le 15 ] || fail "tprun took ${elapsed}s to end after SIGTERM"
sleep 0.5
[ -z "$(pgrep -f -x "sleep 47.25" || true)" ] || fail "ranks still running after tprun ended"
[ -z "$(ls -A "$TMPDIR")" ] || { ls -la "$TMPDIR"; fail "tprun left files under \$TMPDIR after SIGTERM"; }
echo "tprun: SIGTERM ended the job in ${elapsed}s (exit $rc), nothing left behind"
