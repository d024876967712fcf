#!/usr/bin/env bash
# Issue-6 benchmark: qwen3-0.6b preset (bf16 weights), batch 1, prefill 512 and
# decode 128 tokens at tp = 1 (1 thread) and tp = 2 (1 thread per rank) in one
# run, with the bf16 matmul rate and the read bandwidth measured alongside.
#   bench/models/run_inference_bench.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
build=${1:-build}
model=${2:-out/qwen3-0.6b}
[ -f "$model/config.json" ] || "$build/src/tp" make-model --arch qwen3 --preset qwen3-0.6b --out "$model"
bench=$build/bench/models/bench_inference
one=$(OMP_NUM_THREADS=1 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$bench" --model "$model" --reps 3)
two=$(OMP_NUM_THREADS=1 "$build/src/tprun" --nproc-per-node 2 "$bench" --model "$model" --reps 3 --skip-ceilings)
# Two threads' read bandwidth: the ceiling for two ranks reading at once.
bw2=$(OMP_NUM_THREADS=2 "$bench" --model "$model" --reps 1 --prefill 1 --decode 1 | sed -n 's/.*"read_bandwidth_gbs_same_run":\([0-9.]*\).*/\1/p')
echo "tp=1: $one"
echo "tp=2: $two"
/usr/bin/env python3 - "$one" "$two" "$bw2" <<'PY'
import json, sys
a, b, bw2 = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
rss1, rss2 = a["peak_rss_bytes_per_rank"][0], max(b["peak_rss_bytes_per_rank"])
print(f"prefill {a['prefill_tokens']} tokens: tp1 {a['prefill_tokens_per_s']:.0f} tok/s, tp2 {b['prefill_tokens_per_s']:.0f} tok/s"
      f" -> speedup {b['prefill_tokens_per_s'] / a['prefill_tokens_per_s']:.2f}x (target >= 1.8)")
print(f"tp1 prefill matmul rate {a['prefill_matmul_gflops_per_rank']:.0f} GFLOP/s = "
      f"{a['prefill_matmul_gflops_per_rank'] / a['bf16_matmul_gflops_same_run']:.0%} of bf16 matmul "
      f"{a['bf16_matmul_gflops_same_run']:.0f} GFLOP/s (target >= 60%)")
print(f"decode {a['decode_tokens']} tokens: tp1 {a['decode_tokens_per_s']:.1f} tok/s reading {a['decode_weight_read_gbs_rank0']:.1f} GB/s = "
      f"{a['decode_weight_read_gbs_rank0'] / a['read_bandwidth_gbs_same_run']:.0%} of 1-thread read bandwidth "
      f"{a['read_bandwidth_gbs_same_run']:.1f} GB/s (target >= 70%)")
agg = 2 * b["decode_weight_read_gbs_rank0"]
print(f"decode tp2 {b['decode_tokens_per_s']:.1f} tok/s, both ranks reading {agg:.1f} GB/s = {agg / bw2:.0%} of 2-thread read bandwidth {bw2:.1f} GB/s")
print(f"peak RSS per rank: tp1 {rss1 / 2**20:.0f} MiB, tp2 {rss2 / 2**20:.0f} MiB -> {rss2 / rss1:.2f}x (target <= 0.6)")
PY
