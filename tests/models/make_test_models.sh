#!/usr/bin/env bash
# Writes the tiny random-weight checkpoints the model tests load (CTest fixture).
# Sizes are set so every model splits over 1, 2, 3 and 4 ranks (GQA, and MQA for
# Mistral, which replicates its single KV head); qwen3-kv2 has 2 KV heads, which
# tp = 4 replicates and tp = 3 cannot split. A larger init std than Transformers'
# 0.02 keeps greedy choices far from ties.
set -euo pipefail
tp=$1
out=$2
rm -rf "$out"
mkdir -p "$out"
common=(--set initializer_range=0.1 --set vocab_size=516)
# llama3 rope scaling with a short original context, so all three frequency bands occur.
llama3_rope='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
"$tp" make-model --arch llama --preset tiny "${common[@]}" --set num_attention_heads=24 --set num_key_value_heads=12 \
  --set head_dim=8 --set "rope_scaling=$llama3_rope" --out "$out/llama"
"$tp" make-model --arch llama --preset tiny "${common[@]}" --set num_attention_heads=24 --set num_key_value_heads=12 \
  --set head_dim=8 --dtype bf16 --out "$out/llama-bf16"
"$tp" make-model --arch mistral --preset tiny "${common[@]}" --set num_key_value_heads=1 --out "$out/mistral"
"$tp" make-model --arch qwen3 --preset tiny "${common[@]}" --set num_attention_heads=24 --set num_key_value_heads=12 \
  --out "$out/qwen3"
"$tp" make-model --arch qwen3 --preset tiny "${common[@]}" --set num_key_value_heads=2 --out "$out/qwen3-kv2"
