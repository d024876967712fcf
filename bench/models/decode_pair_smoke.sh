#!/usr/bin/env bash
# CTest smoke test of the same-second benchmarks on a tiny qwen3 (written here by `tp make-model`):
# - bench_decode_pair over the model and its GPTQ 4-bit copy decodes, turn by turn, the greedy tokens that
#   bench_inference decodes for each alone (same prompt, same steps), at tp = 1 and 2, and reports finite rates;
# - bench_sync_stream at tp = 1 and 2 reports positive rates for a few-MB token.
#   decode_pair_smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
export OMP_NUM_THREADS=1 GLIBC_TUNABLES=glibc.malloc.hugetlb=1
"$build/src/tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --dtype bf16 --out "$work/qwen3" \
  >/dev/null
"$build/src/tp" quantize --model "$work/qwen3" --out "$work/qwen3-int4" --format gptq --bits 4 --group-size 32 \
  >/dev/null
# 1 warm-up turn + 3 turns of 2 tokens: 8 decode steps after the prompt's token.
for np in 1 2; do
  "$build/src/tprun" --nproc-per-node $np "$build/bench/models/bench_decode_pair" --model "$work/qwen3" \
    --model "$work/qwen3-int4" --prefill 12 --tokens 2 --turns 3 | tail -n 1 > "$work/pair_np$np.json"
  for m in qwen3 qwen3-int4; do
    "$build/src/tprun" --nproc-per-node $np "$build/bench/models/bench_inference" --model "$work/$m" --reps 1 \
      --prefill 12 --decode 8 --skip-ceilings | tail -n 1 > "$work/${m}_np$np.json"
  done
  "$build/src/tprun" --nproc-per-node $np "$build/bench/distributed/bench_sync_stream" --mb 8 --head-mb 2 \
    --segments 4 --tokens 4 --reps 1 | tail -n 1 > "$work/sync_np$np.json"
done
/usr/bin/python3 - "$work" <<'PY'
import json, math, os, sys
work = sys.argv[1]
for np in (1, 2):
    pair = json.load(open(os.path.join(work, f"pair_np{np}.json")))
    assert pair["ranks"] == np, pair
    for m, name in zip(pair["models"], ("qwen3", "qwen3-int4")):
        alone = json.load(open(os.path.join(work, f"{name}_np{np}.json")))
        assert m["tokens"] == alone["tokens"], (np, name, m["tokens"], alone["tokens"])
        assert m["decode_tokens_per_s"] > 0 and math.isfinite(m["rate_over_first_median"]), m
    sync = json.load(open(os.path.join(work, f"sync_np{np}.json")))
    assert sync["ranks"] == np and sync["tokens_per_s_synced"] > 0 and sync["tokens_per_s_unsynced"] > 0, sync
print("decode pair smoke test: the turn-by-turn tokens are each model's own, at tp 1 and 2")
PY
