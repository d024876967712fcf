#!/usr/bin/env bash
# Writes the tiny random-weight checkpoints the model tests load (CTest fixture).
# The tiny presets split over 1-4 ranks; on top of them: llama with llama3 rope
# scaling over a short original context (all three frequency bands occur),
# Mistral with a single KV head (replicated on every rank) and a sliding window
# of 4 (the test prompts and generations run past it), qwen3-kv2 with 2
# KV heads (replicated at tp 4; tp 3 cannot split them). A larger init std than
# Transformers' 0.02 keeps greedy choices far from ties.
set -euo pipefail
tp=$1
out=$2
rm -rf "$out"
mkdir -p "$out"
std=(--set initializer_range=0.1)
llama3_rope='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
"$tp" make-model --arch llama --preset tiny "${std[@]}" --set "rope_scaling=$llama3_rope" --out "$out/llama"
"$tp" make-model --arch llama --preset tiny "${std[@]}" --set "rope_scaling=$llama3_rope" --dtype bf16 \
  --out "$out/llama-bf16"
"$tp" make-model --arch mistral --preset tiny "${std[@]}" --set num_key_value_heads=1 --set sliding_window=4 \
  --out "$out/mistral"
"$tp" make-model --arch qwen3 --preset tiny "${std[@]}" --out "$out/qwen3"
"$tp" make-model --arch qwen3 --preset tiny "${std[@]}" --set num_key_value_heads=2 --out "$out/qwen3-kv2"
# Config keys that change the math (the reference checks that each does at its ids): Llama's
# mlp_bias; Qwen3's window of 4 under use_sliding_window from layer max_window_layers = 1 on
# (layer 0 keeps full attention); Qwen3-MoE's on every layer (its max_window_layers is not read).
"$tp" make-model --arch llama --preset tiny "${std[@]}" --set mlp_bias=true --seed 4 --out "$out/llama-mlp-bias"
/usr/bin/python3 "$(dirname "$0")/fill_biases.py" "$out/llama-mlp-bias" bias  # make-model's are zeros
# Qwen2: biases on q, k and v (drawn, not make-model's zeros), none on o_proj.
"$tp" make-model --arch qwen2 --preset tiny "${std[@]}" --seed 7 --out "$out/qwen2"
/usr/bin/python3 "$(dirname "$0")/fill_biases.py" "$out/qwen2" bias
window=(--set use_sliding_window=true --set sliding_window=4 --set max_window_layers=1)
"$tp" make-model --arch qwen3 --preset tiny "${std[@]}" "${window[@]}" --seed 5 --out "$out/qwen3-window"
# MoE: 8 experts (ep 1, 2, 4), top-2, routed unevenly (skew_router.py): in every MoE
# layer one expert gets all tokens and most get none (so at ep 4 some ranks receive nothing).
# qwen3_moe has a dense layer in the middle (mlp_only_layers). Both train with the routers'
# load-balancing loss (output_router_logits; inference ignores it).
skew=(/usr/bin/python3 "$(dirname "$0")/skew_router.py")
aux=(--set output_router_logits=true --set router_aux_loss_coef=0.02)
"$tp" make-model --arch mixtral --preset tiny "${std[@]}" "${aux[@]}" --out "$out/mixtral"
"${skew[@]}" "$out/mixtral" "model.layers.{}.block_sparse_moe.gate.weight" 5 6,7
"$tp" make-model --arch qwen3_moe --preset tiny "${std[@]}" "${aux[@]}" --set num_hidden_layers=3 \
  --set 'mlp_only_layers=[1]' --out "$out/qwen3_moe"
"${skew[@]}" "$out/qwen3_moe" "model.layers.{}.mlp.gate.weight" 5 6,7
"$tp" make-model --arch qwen3_moe --preset tiny "${std[@]}" "${window[@]}" --seed 6 --out "$out/qwen3_moe-window"
"${skew[@]}" "$out/qwen3_moe-window" "model.layers.{}.mlp.gate.weight" 5 6,7
# GPT-OSS: sinks, a window of 4 on layer 0 (sliding) and full attention on layer 1, yarn, biases, top-4 of 8
# experts (bf16 too: its sinks and biases converted); the MXFP4 one (its experts' in dims multiples of 32)
# reads blocks and scales at load.
"$tp" make-model --arch gpt_oss --preset tiny "${std[@]}" --out "$out/gpt_oss"
"${skew[@]}" "$out/gpt_oss" "model.layers.{}.mlp.router.weight" 5 6,7
"$tp" make-model --arch gpt_oss --preset tiny "${std[@]}" --dtype bf16 --out "$out/gpt_oss-bf16"
"$tp" make-model --arch gpt_oss --preset tiny "${std[@]}" --set intermediate_size=96 --mxfp4 --seed 3 \
  --out "$out/gpt_oss-mxfp4"
"${skew[@]}" "$out/gpt_oss-mxfp4" "model.layers.{}.mlp.router.weight" 5 6,7
# Gemma 3 text: layer 0 sliding (window 4, local rope base), layer 1 global (linear-scaled rope), one KV head
# (replicated on every rank, as gemma-3-1b's), logits capped at 2; its (1 + w) norm weights, zeros as drawn,
# drawn like biases so that each norm's weight matters.
"$tp" make-model --arch gemma3_text --preset tiny "${std[@]}" --set num_key_value_heads=1 --seed 12 --out "$out/gemma3"
/usr/bin/python3 "$(dirname "$0")/fill_biases.py" "$out/gemma3" "norm.weight"
"$tp" make-model --arch gemma3_text --preset tiny "${std[@]}" --dtype bf16 --seed 12 --out "$out/gemma3-bf16"
# The same language model inside Gemma3ForConditionalGeneration's files (both prefixes), with a vision tower.
/usr/bin/python3 "$(dirname "$0")/make_gemma3_vlm.py" "$out/gemma3" "$out/gemma3-vlm" hub
/usr/bin/python3 "$(dirname "$0")/make_gemma3_vlm.py" "$out/gemma3" "$out/gemma3-vlm-v5" v5
# DeepSeek-V2's MLA with and without the query LoRA, layer 1 MoE with shared experts
# (greedy; group-limited in q-lora), and DeepSeek-V3 (sigmoid, noaux_tc), skewed alike.
"$tp" make-model --arch deepseek_v2 --preset tiny "${std[@]}" --out "$out/deepseek_v2"
"$tp" make-model --arch deepseek_v2 --preset tiny-q-lora "${std[@]}" --out "$out/deepseek_v2-q-lora"
"$tp" make-model --arch deepseek_v3 --preset tiny "${std[@]}" --out "$out/deepseek_v3"
for m in deepseek_v2 deepseek_v2-q-lora deepseek_v3; do
  "${skew[@]}" "$out/$m" "model.layers.{}.mlp.gate.weight" 5 6,7
done
# Phi-3: fused q|k|v and gate|up, 12 of 16 head dims rotary, LongRoPE trained on 32 positions
# (the tests' prompts and generations stay within: short_factor); phi3-long's original context
# of 2 positions puts every call of the tests (3 tokens and more) on long_factor, and the
# reference's cached step after a 2-token prefill crosses from one to the other.
"$tp" make-model --arch phi3 --preset tiny "${std[@]}" --out "$out/phi3"
"$tp" make-model --arch phi3 --preset tiny "${std[@]}" --set original_max_position_embeddings=2 --seed 12 \
  --out "$out/phi3-long"
# Phi-3-mini-4k's window (2047) on every layer, at 4 here; bf16 weights (and KV cache).
"$tp" make-model --arch phi3 --preset tiny "${std[@]}" --set sliding_window=4 --seed 13 --out "$out/phi3-window"
"$tp" make-model --arch phi3 --preset tiny "${std[@]}" --dtype bf16 --out "$out/phi3-bf16"
# Each routing branch of each MoE config, on routers left as drawn (the skewed ones above send
# nearly all weight to one expert, where renormalising or not changes little): Qwen3-MoE with
# norm_topk_prob false (Transformers' default) and true, its layer 0 dense by decoder_sparse_step 2;
# Mixtral (always renormalised); GPT-OSS (top-k of the logits, then a softmax over the k);
# DeepSeek-V2 group-limited to the best of 4 groups of 2 (with more groups kept, top-2 would be
# greedy's) and a routed_scaling_factor, never renormalised whatever norm_topk_prob says;
# DeepSeek-V3 (sigmoid, noaux_tc groups, correction bias) with and without norm_topk_prob.
# The reference checks that each branch changes the logits.
"$tp" make-model --arch qwen3_moe --preset tiny "${std[@]}" --set norm_topk_prob=false --set decoder_sparse_step=2 \
  --seed 7 --out "$out/qwen3_moe-route"
"$tp" make-model --arch qwen3_moe --preset tiny "${std[@]}" --set norm_topk_prob=true --seed 7 \
  --out "$out/qwen3_moe-route-norm"
"$tp" make-model --arch mixtral --preset tiny "${std[@]}" --seed 8 --out "$out/mixtral-route"
"$tp" make-model --arch gpt_oss --preset tiny "${std[@]}" --seed 9 --out "$out/gpt_oss-route"
"$tp" make-model --arch deepseek_v2 --preset tiny "${std[@]}" --set topk_method=group_limited_greedy \
  --set n_group=4 --set topk_group=1 --set routed_scaling_factor=2.5 --set norm_topk_prob=true --seed 10 \
  --out "$out/deepseek_v2-route"
"$tp" make-model --arch deepseek_v3 --preset tiny "${std[@]}" --seed 11 --out "$out/deepseek_v3-route"
"$tp" make-model --arch deepseek_v3 --preset tiny "${std[@]}" --set norm_topk_prob=false --seed 11 \
  --out "$out/deepseek_v3-route-nonorm"
# The training suite's query-LoRA MLA model keeps dense layers: the skewed, group-limited
# router's gradients are too small (~1e-7) for a 1e-5 relative comparison across tp sizes.
"$tp" make-model --arch deepseek_v2 --preset tiny-q-lora "${std[@]}" --set first_k_dense_replace=2 \
  --out "$out/deepseek_v2-q-lora-dense"
# Small models for the training oracle (tests/reference/reference_training.py); mistral-train
# takes another seed, or its weights (and so its golden) would be llama-train's.
train=(--preset tiny --set hidden_size=32 --set intermediate_size=64 --set num_attention_heads=4
  --set num_key_value_heads=2 --set head_dim=8 --set vocab_size=128 "${std[@]}")
"$tp" make-model --arch llama "${train[@]}" --out "$out/llama-train"
"$tp" make-model --arch mistral "${train[@]}" --seed 2 --out "$out/mistral-train"
"$tp" make-model --arch qwen3 "${train[@]}" --out "$out/qwen3-train"
# qwen2-train's RoPE base is small enough that every frequency turns within its 16 positions: the
# key bias's gradient comes from how q . R(j - i) b varies with j, and a pair that barely turns
# (base 1e6) gets a gradient of rounding size, which Adam would scale up to lr-sized steps.
"$tp" make-model --arch qwen2 "${train[@]}" --set rope_theta=100 --seed 8 --out "$out/qwen2-train"
/usr/bin/python3 "$(dirname "$0")/fill_biases.py" "$out/qwen2-train" bias
# Phi-3's: 6 of 8 head dims rotary (3 factors a list), its 16-token sequences past an original context of 8.
phi3_rope='{"type": "longrope", "short_factor": [1.0, 1.1, 1.3], "long_factor": [1.0, 2.0, 4.0]}'
"$tp" make-model --arch phi3 "${train[@]}" --set "rope_scaling=$phi3_rope" --set original_max_position_embeddings=8 \
  --out "$out/phi3-train"
"$tp" make-model --arch gemma3_text "${train[@]}" --seed 3 --out "$out/gemma3-train"
# Larger ones for the memory estimate's grid (tests/training/test_memory_estimate.cpp):
# activations, logits and optimizer state all a visible part of a step's peak.
mem=(--preset tiny --set hidden_size=256 --set intermediate_size=512 --set num_attention_heads=8
  --set num_key_value_heads=4 --set head_dim=32 --set vocab_size=4096 --set num_hidden_layers=4
  --set max_position_embeddings=1024 "${std[@]}")
"$tp" make-model --arch qwen3 "${mem[@]}" --out "$out/qwen3-mem"
"$tp" make-model --arch llama "${mem[@]}" --out "$out/llama-mem"
# The MoE one: 8 experts, top-2, with the load-balancing loss (coef 0.1: visible in the gradients).
# Its routers are not skewed: an expert whose probability underflows gets gradients of ~1e-9,
# where AdamW's update m / (sqrt(v) + eps) turns their rounding into lr-sized weight changes.
"$tp" make-model --arch qwen3_moe "${train[@]}" --set moe_intermediate_size=16 --set output_router_logits=true \
  --set router_aux_loss_coef=0.1 --out "$out/qwen3_moe-train"
