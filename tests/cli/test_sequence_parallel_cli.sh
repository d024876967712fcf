#!/usr/bin/env bash
# --sequence-parallel as a user runs it: `tp plan` shows the all-gathers and
# reduce-scatters that replace the all-reduces; at tp = 2 through tprun, `tp
# forward` gives the same logits with it as without (a prompt of 5 tokens: 3 and 2
# per rank), `tp generate` the same tokens, and `tp train` the same logged losses,
# also with 2 data-parallel replicas of tp 2.
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$src/tests/cli/cli_test_lib.sh"
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 --out "$dir/m" >/dev/null

"$tp" plan --model "$dir/m" --tp-size 2 --sequence-parallel >"$dir/plan.txt" 2>/dev/null
grep -q "tp_size 2 · sequence parallel" "$dir/plan.txt" || { cat "$dir/plan.txt"; fail "no sequence parallel header"; }
grep -qE "collectives per forward: .*all_gather .*reduce_scatter" "$dir/plan.txt" || fail "no gathers / reduce-scatters"
grep -q "all_reduce" "$dir/plan.txt" && fail "an all-reduce is left under sequence parallelism"
echo "tp plan --sequence-parallel: all-gathers and reduce-scatters, no all-reduce"

fwd=(forward --model "$dir/m" --input-ids 1,2,3,4,5)
"$tprun" --nproc-per-node 2 "$tp" "${fwd[@]}" --out "$dir/off.safetensors" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" "${fwd[@]}" --sequence-parallel --out "$dir/on.safetensors" 2>/dev/null
cmp -s "$dir/off.safetensors" "$dir/on.safetensors" || fail "tp forward: other logits with --sequence-parallel"
gen=(generate --model "$dir/m" --input-ids 1,2,3 --input-ids 9 --max-new-tokens 6 --json)
off=$("$tprun" --nproc-per-node 2 "$tp" "${gen[@]}" 2>/dev/null | sed -n 's/.*"token_ids":\(\[\[[^]]*\],\[[^]]*\]\]\).*/\1/p')
on=$("$tprun" --nproc-per-node 2 "$tp" "${gen[@]}" --sequence-parallel 2>/dev/null |
  sed -n 's/.*"token_ids":\(\[\[[^]]*\],\[[^]]*\]\]\).*/\1/p')
[ -n "$off" ] && [ "$off" = "$on" ] || fail "generate: $off without, $on with --sequence-parallel"
echo "tp forward / generate at tp 2: the same logits (bitwise) and tokens with --sequence-parallel"

"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/t" >/dev/null
write_sentences "$dir/train.txt" 200
train=(train --model "$dir/t" --data "$dir/train.txt" --seq-len 15 --batch-size 2 --lr 3e-3 --max-steps 4
  --logging-steps 1)
"$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --save-steps 2 --output-dir "$dir/off" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --sequence-parallel --output-dir "$dir/on" 2>/dev/null
# Under data parallelism too: 2 replicas of tp 2 (4 ranks), each sequence-parallel within its tp group.
dp=(--nproc-per-node 4 "$tp" "${train[@]}" --tp-size 2 --dp-replicate-size 2)
"$tprun" "${dp[@]}" --output-dir "$dir/dp-off" 2>/dev/null
"$tprun" "${dp[@]}" --sequence-parallel --output-dir "$dir/dp-on" 2>/dev/null
/usr/bin/python3 - "$dir" <<'PY'
import json, sys
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/{run}/log_history.jsonl") if '"loss"' in l]
for off, on, layout in (("off", "on", "tp 2"), ("dp-off", "dp-on", "dp 2 x tp 2")):
    a, b = losses(off), losses(on)
    assert len(a) == 4 and len(b) == 4, (off, a, b)
    assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (off, a, b)
    print(f"tp train at {layout}, seq 15: the same losses with --sequence-parallel:", b)
PY

# A checkpoint saved without sequence parallelism resumes with it (the layout splits no parameter),
# and the resumed steps log the uninterrupted run's losses.
cp -r "$dir/off" "$dir/resumed"
rm -rf "$dir/resumed/checkpoint-4" "$dir/resumed/log_history.jsonl"
"$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --sequence-parallel --output-dir "$dir/resumed" \
  --resume-from-checkpoint "$dir/resumed/checkpoint-2" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "resume with --sequence-parallel"; }
/usr/bin/python3 - "$dir" <<'PY'
import json, sys
def losses(run):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/{run}/log_history.jsonl") if '"loss"' in l}
a, b = losses("off"), losses("resumed")
assert 3 in b and 4 in b, b
assert all(abs(a[s] - b[s]) <= 1e-5 * abs(a[s]) for s in (3, 4)), (a, b)
print("resumed with --sequence-parallel from a checkpoint saved without: steps 3-4 log", b[3], b[4])
PY
