#!/usr/bin/env bash
# `tp train` as a user runs it: a tiny Llama with a real BPE tokenizer, trained
# at tp = 2 through tprun on a text file; what lands in the output directory
# (checkpoints, log history, loss curve, a Hugging Face model that inspect
# --verify, generate and a resume accept), then every input error the issue
# lists: each is exit 1 (2 for usage) before any step, naming what is wrong.
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/m" >/dev/null
source "$src/tests/cli/cli_test_lib.sh"
write_sentences "$dir/train.txt" 300
head -40 "$dir/train.txt" >"$dir/eval.txt"

# The common flags; each case adds --data, --seq-len and --lr (options given once).
base=(train --batch-size 4 --lr-scheduler cosine --logging-steps 2 --save-steps 3)
train=("${base[@]}" --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --lr 3e-3 --warmup-steps 2)

# ---- a run at tp = 2: progress lines, files, a saved model the other commands take
"$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --max-steps 6 --eval-data "$dir/eval.txt" --eval-steps 3 \
  --output-dir "$dir/out" 2>"$dir/log.txt"
grep -q "step 2/6 | " "$dir/log.txt" || { cat "$dir/log.txt"; fail "no progress line per logging step"; }
grep -q "eval_loss" "$dir/log.txt" || fail "no eval line"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json \
  log_history.jsonl checkpoint-3/trainer_state.json checkpoint-6/model_rank1.safetensors; do
  [ -f "$dir/out/$f" ] || fail "output-dir has no $f"
done
[ "$(grep -c '"loss"' "$dir/out/log_history.jsonl")" -eq 3 ] || fail "log_history.jsonl: expected 3 train logs"
[ "$(grep -c '"eval_loss"' "$dir/out/log_history.jsonl")" -eq 2 ] || fail "log_history.jsonl: expected 2 eval logs"
if command -v gnuplot >/dev/null; then
  [ "$(head -c 4 "$dir/out/loss_curve.png" | od -An -tx1 | tr -d ' ')" = "89504e47" ] || fail "loss_curve.png is not a PNG"
fi
"$tp" inspect --model "$dir/out" --verify >/dev/null || fail "inspect --verify rejects the saved model"
"$tprun" --nproc-per-node 2 "$tp" generate --model "$dir/out" --prompt "the cat" --max-new-tokens 4 >/dev/null 2>&1 ||
  fail "generate cannot run the saved model at tp 2"
ls -a "$dir/out" | grep -q "^\.tmp-checkpoint" && fail "a partial checkpoint was left behind"
echo "tp train at tp 2: logs, checkpoints, loss curve, a saved model that inspect --verify and generate take"

# ---- resume: the newest checkpoint, on to step 9; another tp size is refused
"$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --max-steps 9 --output-dir "$dir/out" \
  --resume-from-checkpoint last 2>"$dir/log.txt"
grep -q "step 8/9 | " "$dir/log.txt" || { cat "$dir/log.txt"; fail "the resumed run did not continue"; }
grep -q "step 2/9 | " "$dir/log.txt" && fail "the resumed run started again from step 1"
[ -d "$dir/out/checkpoint-9" ] || fail "no checkpoint-9 after the resumed run"
expect 1 "tp_size: 2 in the checkpoint, 1 now" -- "$tp" "${train[@]}" --max-steps 12 --output-dir "$dir/out" \
  --resume-from-checkpoint last
expect 1 "not a tp training checkpoint" -- "$tp" "${train[@]}" --max-steps 12 --output-dir "$dir/out2" \
  --resume-from-checkpoint "$dir/m"
# A damaged checkpoint file is an error naming it and the field, not a bare json exception.
cp -r "$dir/out/checkpoint-9" "$dir/damaged"
sed -i 's/"global_step": *[0-9]*/"global_step": "nine"/' "$dir/damaged/trainer_state.json"
grep -q '"global_step": "nine"' "$dir/damaged/trainer_state.json" || fail "could not damage trainer_state.json"
expect 1 "damaged/trainer_state.json: [json.exception.type_error.302] type must be number" -- \
  "$tprun" --nproc-per-node 2 "$tp" "${train[@]}" --max-steps 12 --output-dir "$dir/out3" \
  --resume-from-checkpoint "$dir/damaged"
echo "resume: continues from the newest checkpoint; another tp size or a damaged trainer_state.json is an error naming it"

# ---- data parallel: dp 2 x tp 1 with --batch-size 2 logs the losses of one rank with --batch-size 4
dp=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --lr 3e-3 --max-steps 4 --logging-steps 1
  --save-steps 1000 --no-save-model --json)
"$tp" "${dp[@]}" --batch-size 4 --output-dir "$dir/dp-one" >"$dir/one.json" 2>"$dir/log.txt" ||
  { cat "$dir/log.txt"; fail "the one-rank run failed"; }
"$tprun" --nproc-per-node 2 "$tp" "${dp[@]}" --batch-size 2 --dp-replicate-size 2 --output-dir "$dir/dp-two" \
  >"$dir/two.json" 2>"$dir/log.txt" || { cat "$dir/log.txt"; fail "the dp 2 run failed"; }
grep -q '"dp_replicate_size":2' "$dir/two.json" || fail "the dp run does not report dp_replicate_size 2"
/usr/bin/python3 - "$dir/dp-one/log_history.jsonl" "$dir/dp-two/log_history.jsonl" <<'PY' || fail "dp 2 != one rank"
import json, sys
one, two = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(one) == len(two) == 4, (one, two)
for a, b in zip(one, two):
    assert abs(a - b) <= 1e-4 * abs(a), (one, two)
PY
expect 2 "(dp_replicate_size 2 x dp_shard_size 1 x tp_size 2 = 4) does not match num_processes (1)" -- \
  "$tp" "${dp[@]}" --dp-replicate-size 2 --tp-size 2 --output-dir "$dir/o"
expect 2 "dp_shard_size is 0; parallelism sizes must be >= 1" -- "$tp" "${dp[@]}" --dp-shard-size 0 \
  --output-dir "$dir/o"
expect 2 "--fsdp full_shard shards over --dp-shard-size, which is 1" -- "$tp" "${dp[@]}" --fsdp --output-dir "$dir/o"
expect 2 "fsdp option 'offload' is not supported" -- "$tp" "${dp[@]}" --dp-shard-size 2 --fsdp "full_shard offload" \
  --output-dir "$dir/o"
echo "data parallel: dp 2 logs one rank's losses for the same global batch; sizes that do not fit are usage errors"

# ---- bad input: an error before any step
: >"$dir/empty.txt"
bad=("${base[@]}" --model "$dir/m" --output-dir "$dir/o")
expect 1 "empty.txt holds no text" -- "$tp" "${bad[@]}" --data "$dir/empty.txt" --seq-len 16
head -2 "$dir/train.txt" >"$dir/short.txt"
expect 1 "fewer than one block of seq_len 200" -- "$tp" "${bad[@]}" --data "$dir/short.txt" --seq-len 200
expect 1 "above the model's max_position_embeddings 256" -- "$tp" "${bad[@]}" --data "$dir/train.txt" --seq-len 1000
expect 2 "learning_rate must be > 0, got 0" -- "$tp" "${bad[@]}" --data "$dir/train.txt" --lr 0
expect 2 "learning_rate must be > 0, got -1" -- "$tp" "${bad[@]}" --data "$dir/train.txt" --lr -1
expect 1 "output_dir /proc/tp-train-test is not writable" -- "$tp" "${base[@]}" --model "$dir/m" \
  --data "$dir/train.txt" --seq-len 16 --output-dir /proc/tp-train-test
expect 1 "does not exist" -- "$tp" "${bad[@]}" --data "$dir/missing.txt"
printf '{"text": "ok"}\nnot json\n' >"$dir/bad.jsonl"
expect 1 "bad.jsonl:2: not a JSON object" -- "$tp" "${bad[@]}" --data "$dir/bad.jsonl"
mkdir "$dir/no-tok"
cp "$dir/m/config.json" "$dir/m/model.safetensors" "$dir/no-tok/"
expect 1 "has no tokenizer.json" -- "$tp" "${base[@]}" --model "$dir/no-tok" --data "$dir/train.txt" --output-dir "$dir/o"
expect 2 "lr_scheduler_type 'wavy' is not supported" -- "$tp" train --model "$dir/m" --data "$dir/train.txt" \
  --lr-scheduler wavy --output-dir "$dir/o"
echo "bad input: empty data, data shorter than a block, seq_len above the model's, lr <= 0, an unwritable" \
  "output dir, a missing file, bad JSON lines, no tokenizer, an unknown schedule: errors naming them"

# ---- a loss that diverges stops the run naming the step; the checkpoint before it stays whole
expect 1 "the loss is" -- "$tp" train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 4 \
  --lr 1e30 --max-grad-norm 0 --max-steps 8 --save-steps 1 --output-dir "$dir/nan"
grep -qE "step [0-9]+: the loss is (nan|inf|-nan)" "$dir/err.txt" || { cat "$dir/err.txt"; fail "no step in the error"; }
last=$(ls -d "$dir/nan"/checkpoint-* | sort -t- -k2 -n | tail -1)
for f in trainer_state.json training_state.json config.json model_rank0.safetensors optimizer_rank0.safetensors; do
  [ -f "$last/$f" ] || fail "$last lacks $f after the run stopped"
done
# It loads: a resume that has nothing left to do reads every file of it.
step=${last##*-}
"$tp" train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 1e30 --max-grad-norm 0 \
  --max-steps "$step" --output-dir "$dir/nan" --resume-from-checkpoint "$last" --no-save-model \
  2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "$last does not load"; }
echo "a diverging loss: error naming the step, $(basename "$last") intact"

echo "memory: --estimate-memory predicts without data or weights; a run that cannot fit stops before loading"
"$tp" train --model "$dir/m" --seq-len 16 --batch-size 4 --tp-size 2 --estimate-memory --json >"$dir/estimate.json"
python3 - "$dir/estimate.json" <<'PY' || fail "--estimate-memory --json is not the estimate"
import json, sys
e = json.load(open(sys.argv[1]))
parts = ["weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "loss_bytes"]
assert all(e[k] > 0 for k in parts), e
assert e["total_bytes"] >= sum(e[k] for k in parts), e
PY
"$tp" train --model "$dir/m" --seq-len 16 --batch-size 4 --estimate-memory | grep -q "predicted peak per rank" ||
  fail "--estimate-memory printed no prediction"
# 2^22 blocks of 16 tokens: terabytes of activations. The error names the fixes, and nothing was written.
expect 1 "would run out of memory. Options: --gradient-checkpointing" -- "$tp" train --model "$dir/m" \
  --data "$dir/train.txt" --seq-len 16 --max-steps 1 --batch-size 4194304 --output-dir "$dir/too-big"
grep -q "predicted peak per rank" "$dir/err.txt" || fail "no predicted-peak line before the error"
[ ! -e "$dir/too-big" ] || fail "a run that cannot fit wrote its output directory"
expect 2 "parallelism sizes must be >= 1" -- "$tp" train --model "$dir/m" --dp-shard-size 0 --estimate-memory

echo "training-only noise keys: refused by name, not ignored"
tok=(--tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json")
"$tp" make-model --arch llama --preset tiny --set attention_dropout=0.1 "${tok[@]}" --out "$dir/dropout" >/dev/null
expect 1 "'attention_dropout' is 0.1: tp's Trainer applies no attention dropout" -- "$tp" train \
  --model "$dir/dropout" --data "$dir/train.txt" --seq-len 16 --max-steps 1 --output-dir "$dir/dropout-out"
"$tp" make-model --arch phi3 --preset tiny --set resid_pdrop=0.1 "${tok[@]}" --out "$dir/resid" >/dev/null
expect 1 "'resid_pdrop' is 0.1: tp's Trainer applies no residual dropout" -- "$tp" train \
  --model "$dir/resid" --data "$dir/train.txt" --seq-len 16 --max-steps 1 --output-dir "$dir/resid-out"
"$tp" make-model --arch mixtral --preset tiny --set router_jitter_noise=0.01 "${tok[@]}" --out "$dir/jitter" \
  >/dev/null
expect 1 "'router_jitter_noise' is 0.01" -- "$tp" train --model "$dir/jitter" --data "$dir/train.txt" --seq-len 16 \
  --max-steps 1 --output-dir "$dir/jitter-out"
