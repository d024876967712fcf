# Shell helpers of the tp serve tests (sourced): start a server on a free port
# and stop it with SIGTERM. The caller sets -euo pipefail and $server_pid="".

# start_server LOG CMD...: runs CMD in the background (--port 0) and sets $port from its banner.
start_server() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do
    port=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$log" 2>/dev/null || true)
    [ -n "$port" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || { echo "server exited:"; cat "$log"; exit 1; }
    sleep 0.1
  done
  echo "no banner from the server:"; cat "$log"; exit 1
}

# stop_server LOG: SIGTERM, then every rank must be gone within 10 s after a clean stop.
stop_server() {
  local log=$1
  kill -TERM "$server_pid"
  for _ in $(seq 100); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$server_pid" 2>/dev/null; then echo "server still running 10 s after SIGTERM"; exit 1; fi
  set +e
  wait "$server_pid"
  rc=$?
  set -e
  server_pid=
  grep -q "tp serve: stopped after" "$log" || { echo "no clean stop (rc $rc):"; cat "$log"; exit 1; }
  echo "SIGTERM: stopped cleanly (rc $rc)"
}
