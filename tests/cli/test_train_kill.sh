#!/usr/bin/env bash
# A tp = 2 training job whose rank is killed (SIGKILL) while it writes a
# checkpoint leaves no partial checkpoint-N: every checkpoint-N directory that
# exists is whole, and the next run resumes from the newest one and removes the
# hidden leftovers. The model is made large enough (~20M parameters, ~120 MB of
# checkpoint per rank) that a save takes long enough to be caught mid-write.
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'pkill -9 -f "$dir/m" 2>/dev/null || true; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$tp" make-model --arch llama --preset tiny --set hidden_size=512 --set intermediate_size=1536 \
  --set num_attention_heads=8 --set num_key_value_heads=4 --set head_dim=64 --set num_hidden_layers=6 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/m" >/dev/null
for i in $(seq 1 400); do echo "line $i of the text, with words that repeat and repeat."; done >"$dir/train.txt"
run=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 2 --save-steps 1 --logging-steps 1
  --output-dir "$dir/out" --no-save-model)

caught=0
for attempt in 1 2 3 4 5; do
  rm -rf "$dir/out"
  "$tprun" --nproc-per-node 2 "$tp" "${run[@]}" --max-steps 200 >"$dir/log.txt" 2>&1 &
  job=$!
  # Rank 1's process (tprun execs `tp` in each rank; the rank is in its environment).
  victim=""
  for _ in $(seq 1 1000); do
    for p in $(pgrep -f -- "$tp train --model $dir/m" || true); do
      tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$p
    done
    [ -n "$victim" ] && break
    sleep 0.01
  done
  [ -n "$victim" ] || { kill -9 "$job" 2>/dev/null; cat "$dir/log.txt"; fail "rank 1 never started"; }
  # Kill it while it writes its optimizer file of a checkpoint (after a first whole one).
  for _ in $(seq 1 3000); do
    compgen -G "$dir/out/checkpoint-*" >/dev/null &&
      compgen -G "$dir/out/.tmp-checkpoint-*/optimizer_rank1.safetensors.tmp" >/dev/null && break
    sleep 0.005
  done
  kill -9 "$victim"
  set +e
  wait "$job"
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
  if compgen -G "$dir/out/.tmp-checkpoint-*" >/dev/null; then
    caught=1
    break
  fi
done
[ "$caught" -eq 1 ] || fail "5 attempts and the kill never landed inside a save"
killed=$(ls -d "$dir/out"/.tmp-checkpoint-* | head -1)
step=${killed##*-}
[ -e "$dir/out/checkpoint-$step" ] && fail "checkpoint-$step exists although its save was killed"
for c in "$dir/out"/checkpoint-*; do
  for f in trainer_state.json training_state.json config.json model_rank0.safetensors model_rank1.safetensors \
    optimizer_rank0.safetensors optimizer_rank1.safetensors; do
    [ -f "$c/$f" ] || fail "$(basename "$c") is incomplete: no $f"
  done
done
echo "rank 1 killed while saving checkpoint-$step: no checkpoint-$step, $(ls -d "$dir/out"/checkpoint-* | wc -l) whole earlier checkpoints"

# The next run resumes from the newest whole checkpoint and clears the leftovers.
newest=$(ls -d "$dir/out"/checkpoint-* | sort -t- -k2 -n | tail -1)
"$tprun" --nproc-per-node 2 "$tp" "${run[@]}" --max-steps "$step" --resume-from-checkpoint last >"$dir/log.txt" 2>&1 ||
  { cat "$dir/log.txt"; fail "cannot resume after the kill"; }
grep -q "step $step/$step" "$dir/log.txt" || { cat "$dir/log.txt"; fail "the resumed run did not reach step $step"; }
compgen -G "$dir/out/.tmp-checkpoint-*" >/dev/null && fail "the partial checkpoint was not cleaned up"
[ -f "$dir/out/checkpoint-$step/training_state.json" ] || fail "no checkpoint-$step after the resumed run"
echo "resumed from $(basename "$newest") to step $step; the partial directory is gone"
