#!/usr/bin/env bash
# tprun across two "nodes" on this machine: two tprun invocations (node 0 and
# node 1, 2 ranks each) on 127.0.0.1 form one 4-rank job. Checks the world's
# collectives and a split along nodes, `tp train` at tp = 4 on 2 nodes against
# the same run on one node of 4 ranks, that a rank failing on node 1 (or node 1's
# tprun being killed) ends both tprun non-zero within seconds, and the errors
# when a node never shows up. Every run is bounded: a hang fails the test.
#   test_tprun_multinode.sh TPRUN TPRUN_ENV_CHECK TP SOURCE_DIR
set -uo pipefail
tprun=$1
env_check=$2
tp=$3
src=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export TMPDIR=$dir  # tprun's and OpenMPI's run files, also those a killed tprun leaves
source "$src/tests/cli/cli_test_lib.sh"  # fail, expect, write_sentences

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# start_node R NAME COMMAND...: tprun as node R of the 2-node job at 127.0.0.1:$port, in the background
# (pid in node_pid[R], output in $dir/NAME.nodeR.{out,err}). tprun_env_check checks MASTER_* against
# TP_EXPECT_MASTER.
declare -a node_pid rc
start_node() {
  local r=$1 name=$2
  shift 2
  TP_EXPECT_MASTER="127.0.0.1:$port" "$tprun" --nproc-per-node 2 --nnodes 2 --node-rank "$r" \
    --master-addr 127.0.0.1 --master-port "$port" --join-timeout "${join_timeout:-30}" "$@" \
    >"$dir/$name.node$r.out" 2>"$dir/$name.node$r.err" &
  node_pid[$r]=$!
}

# wait_nodes NAME R...: waits for those nodes until $limit s after $started (then SIGKILLs them: a hang);
# their exit codes land in rc[R], the time the last one took in elapsed_ms.
wait_nodes() {
  local name=$1 r
  shift
  for r in "$@"; do
    while kill -0 "${node_pid[$r]}" 2>/dev/null && [ $(($(now_ms) - started)) -lt $((limit * 1000)) ]; do
      sleep 0.1
    done
    if kill -0 "${node_pid[$r]}" 2>/dev/null; then
      kill -9 "${node_pid[$r]}"
      wait "${node_pid[$r]}"
      show "$name"
      fail "$name: node $r's tprun hung (killed after $limit s)"
    fi
    wait "${node_pid[$r]}"
    rc[$r]=$?
  done
  elapsed_ms=$(($(now_ms) - started))
}

show() { tail -n 20 "$dir/$1".node*.err "$dir/$1".node*.out; }

# on_two_nodes NAME COMMAND...: COMMAND as one job of 2 nodes x 2 ranks (node 1 started first, as
# either may be); exit codes in rc[0] and rc[1].
on_two_nodes() {
  local name=$1
  shift
  rc=()
  port=$(free_port)
  started=$(now_ms)
  start_node 1 "$name" "$@"
  start_node 0 "$name" "$@"
  wait_nodes "$name" 0 1
}

# on_one_node NAME COMMAND...: COMMAND as a job of 1 node x 4 ranks; exit code in rc[0].
on_one_node() {
  local name=$1
  shift
  rc=()
  started=$(now_ms)
  "$tprun" --nproc-per-node 4 "$@" >"$dir/$name.node0.out" 2>"$dir/$name.node0.err" &
  node_pid[0]=$!
  wait_nodes "$name" 0
}

# expect_ok NAME: both nodes (or the one) exited 0.
expect_ok() {
  for r in "${!rc[@]}"; do
    [ "${rc[$r]}" -eq 0 ] || { show "$1"; fail "$1: node $r's tprun exited ${rc[$r]}"; }
  done
}

limit=60

# ---- (1) one world of 4 ranks over both nodes: ranks 0-3, all-reduce of the rank numbers, a group per node
on_two_nodes collectives "$env_check"
expect_ok collectives
grep -qF "tprun_env_check: 4 ranks ok (world sum 6, 2 per node," "$dir/collectives.node0.out" ||
  { show collectives; fail "no '4 ranks ok' from rank 0"; }
echo "2 nodes x 2 ranks: one world of 4 (RANK, LOCAL_RANK, NODE_RANK, MASTER_*), all-reduce 6, per-node groups" \
  "(${elapsed_ms} ms)"

# ---- (2) tp train at tp = 4 across the two nodes logs the losses of the same run on one node
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/m" >/dev/null || fail "make-model"
write_sentences "$dir/train.txt" 300
train=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 3e-3 --max-steps 4
  --logging-steps 1 --save-steps 1000)

# same_losses A B: the "loss" of each logged step in A/log_history.jsonl equals B's (within 1e-6).
same_losses() {
  /usr/bin/python3 - "$dir/$1/log_history.jsonl" "$dir/$2/log_history.jsonl" <<'EOF'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:])
print("losses", a, "and", b)
sys.exit(0 if len(a) == len(b) > 0 and all(abs(x - y) <= 1e-6 * max(1, abs(y)) for x, y in zip(a, b)) else 1)
EOF
}

on_one_node train1 "$tp" "${train[@]}" --output-dir "$dir/one"
expect_ok train1
on_two_nodes train2 "$tp" "${train[@]}" --output-dir "$dir/two"
expect_ok train2
same_losses two one || fail "tp = 4 on 2 nodes x 2 ranks logged other losses than on 1 node x 4"
echo "tp train at tp 4: 2 nodes x 2 ranks log the losses of 1 node x 4 (${elapsed_ms} ms)"

# ---- (2b) dp 2 x tp 2: a tp group per node (tp innermost), dp groups {0,2} {1,3} across the two nodes;
# the same losses as on one node, and as tp 4 with the same global batch (4 blocks)
dp_train=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 2 --lr 3e-3 --max-steps 4
  --logging-steps 1 --save-steps 1000 --dp-replicate-size 2 --tp-size 2)
on_one_node dp1 "$tp" "${dp_train[@]}" --output-dir "$dir/dp-one"
expect_ok dp1
on_two_nodes dp2 "$tp" "${dp_train[@]}" --output-dir "$dir/dp-two"
expect_ok dp2
same_losses dp-two dp-one || fail "dp 2 x tp 2 on 2 nodes logged other losses than on 1 node"
/usr/bin/python3 - "$dir/dp-two/log_history.jsonl" "$dir/one/log_history.jsonl" <<'EOF' ||
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:])
sys.exit(0 if len(a) == len(b) == 4 and all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(a, b)) else 1)
EOF
  fail "dp 2 x tp 2 across nodes does not log tp 4's losses for the same global batch"
echo "dp 2 x tp 2 with dp groups across the nodes: the losses of 1 node, and of tp 4 (${elapsed_ms} ms)"

# ---- (2c) FSDP over dp_shard 2 x tp 2: each layer's shards gathered across the nodes, gradients
# reduce-scattered back; the losses of dp_replicate 2 x tp 2 with the same global batch (1e-5)
fsdp_train=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 2 --lr 3e-3 --max-steps 4
  --logging-steps 1 --save-steps 1000 --dp-shard-size 2 --tp-size 2 --fsdp)
on_two_nodes fsdp2 "$tp" "${fsdp_train[@]}" --output-dir "$dir/fsdp-two"
expect_ok fsdp2
/usr/bin/python3 - "$dir/fsdp-two/log_history.jsonl" "$dir/dp-one/log_history.jsonl" <<'EOF' ||
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:])
print("losses", a, "and", b)
sys.exit(0 if len(a) == len(b) == 4 and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b)) else 1)
EOF
  fail "FSDP over dp_shard 2 x tp 2 across nodes does not log dp_replicate 2 x tp 2's losses"
echo "FSDP dp_shard 2 x tp 2 across the nodes: the losses of dp_replicate 2 x tp 2 (${elapsed_ms} ms)"

# ---- (3) a node that fails ends the job: every tprun exits non-zero within seconds
limit=30
on_two_nodes fail "$env_check" --fail  # rank 3 (node 1) throws while the others wait in an all-reduce
[ "${rc[0]}" -ne 0 ] && [ "${rc[1]}" -ne 0 ] || { show fail; fail "a failing rank: exit codes ${rc[0]} and ${rc[1]}"; }
[ "$elapsed_ms" -lt 15000 ] || fail "a failing rank: the nodes took ${elapsed_ms} ms to exit"
grep -qF "[rank 3] error: deliberate failure on the last rank" "$dir/fail.node0.err" ||
  { show fail; fail "no error line"; }
echo "rank 3 on node 1 throws: node 0 exits ${rc[0]}, node 1 exits ${rc[1]} (${elapsed_ms} ms)"

port=$(free_port)
start_node 1 killed sleep 60
start_node 0 killed sleep 60
sleep 3
grep -q "joined the job" "$dir/killed.node1.err" || { show killed; fail "node 1 never joined"; }
kill -9 "${node_pid[1]}"
{ wait "${node_pid[1]}"; } 2>/dev/null  # reaped here, where bash's "Killed" line can be silenced
started=$(now_ms)
wait_nodes killed 0
[ "${rc[0]}" -ne 0 ] || fail "node 1's tprun was killed, yet node 0 exited 0"
[ "$elapsed_ms" -lt 15000 ] || fail "node 1's tprun was killed: node 0 took ${elapsed_ms} ms to exit"
grep -qF "node 1 (127.0.0.1:" "$dir/killed.node0.err" || { show killed; fail "node 0 did not name node 1"; }
echo "node 1's tprun killed: node 0 exits ${rc[0]} in ${elapsed_ms} ms, naming node 1"

# ---- (4) a node that never shows up: a bounded wait, then an error naming the address, who joined, who is missing
# alone R MESSAGE: node R started by itself exits 1 after --join-timeout, saying MESSAGE.
alone() {
  started=$(now_ms)
  start_node "$1" alone "$env_check"
  wait_nodes alone "$1"
  [ "${rc[$1]}" -eq 1 ] || { show alone; fail "node $1 alone: exit ${rc[$1]}, expected 1"; }
  grep -qF "$2" "$dir/alone.node$1.err" || { show alone; fail "node $1 alone: no '$2'"; }
}
join_timeout=2
port=$(free_port)
alone 0 "node 0: 1 of 2 nodes joined at 127.0.0.1:$port within 2 s; missing node ranks: 1"
alone 1 "node 1: node 0's tprun: nobody answered at 127.0.0.1:$port within 2 s"
echo "a node missing: node 0 and node 1 each stop after --join-timeout 2 naming 127.0.0.1:$port (${elapsed_ms} ms)"

# ---- usage errors (exit 2)
expect 2 "--nnodes 2 needs --master-addr A" -- "$tprun" --nnodes 2 --node-rank 1 "$env_check"
expect 2 "--node-rank 2 must be below --nnodes 2" -- "$tprun" --nnodes 2 --node-rank 2 --master-addr 127.0.0.1 \
  "$env_check"
echo PASS
