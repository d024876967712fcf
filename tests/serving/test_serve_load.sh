#!/usr/bin/env bash
# The load test (load_test.py) against `tp serve` on a tiny model:
#   test_serve_load.sh TP TPRUN ROOT [NPROC [CLIENTS [SECONDS]]]
# CTest runs a short version (8 clients, 10 s); the README's numbers come
# from 32 clients for 60 s.
set -euo pipefail
tp=$1
tprun=$2
root=$3
nproc=${4:-1}
clients=${5:-8}
seconds=${6:-10}
here=$root/tests/serving
dir=$(mktemp -d)
server_pid=
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$dir"' EXIT
source "$here/serve_helpers.sh"

"$tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --out "$dir/m" >/dev/null
launch=("$tp")
[ "$nproc" -gt 1 ] && launch=("$tprun" --nproc-per-node "$nproc" "$tp")
start_server "$dir/serve.log" "${launch[@]}" serve --model "$dir/m" --port 0 --max-num-seqs 8 --disable-log-requests
/usr/bin/python3 "$here/load_test.py" --url "http://127.0.0.1:$port" --clients "$clients" --duration "$seconds" \
  --vocab 516 ${LOAD_TEST_JSON:+--json "$LOAD_TEST_JSON"}
stop_server "$dir/serve.log"
