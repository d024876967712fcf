#!/usr/bin/env bash
# Quantized checkpoints for test_quantized_checkpoint and test_quantized_forward (CTest fixture), each written by
# `tp quantize` and dequantized by the independent numpy reference (dequantize_reference.py) into <name>.deq, which
# also checks every weight against the original within half its scale. The lists of names:
#  - models.txt: a tiny qwen3 (in_features 256 and 512, out_features 128 to 512, so groups of 32 and 128 fit whole
#    and at tp 4 o_proj's 64 inputs per rank cut a group of 128) in every format and setting tp reads;
#  - arch_models.txt: every other dense architecture at the same sizes, in one or two settings each, so that across
#    them every format and both bit widths appear, and GPT-OSS with its attention quantized;
#  - moe_models.txt: every MoE architecture, its experts quantized under the Hub's per-expert names;
#  - real_models.txt, real_moe_models.txt: reduced real shapes (the real hidden, intermediate and head sizes, one
#    layer, a vocabulary of 1024).
set -euo pipefail
tp=$1
out=$2
ref="$(dirname "$0")/dequantize_reference.py"
rm -rf "$out"
mkdir -p "$out"

# quantize LIST: for each "name base flags..." line of stdin, `tp quantize` base into name, the numpy
# dequantization of name into name.deq, and name appended to LIST.
quantize() {
  while read -r name base flags; do
    # shellcheck disable=SC2086
    "$tp" quantize --model "$out/$base" --out "$out/$name" $flags
    /usr/bin/python3 "$ref" "$out/$name" "$out/$name.deq" --original "$out/$base"
    echo "$name" >>"$out/$1"
  done
}

dims=(--set hidden_size=256 --set intermediate_size=512 --set num_attention_heads=8 --set head_dim=32
      --set num_key_value_heads=4 --set initializer_range=0.1)
"$tp" make-model --arch qwen3 --preset tiny "${dims[@]}" --out "$out/base" >/dev/null
"$tp" make-model --arch qwen3 --preset tiny "${dims[@]}" --dtype bf16 --seed 1 --out "$out/base-bf16" >/dev/null
quantize models.txt <<'EOF'
gptq-v1-4b-g128-asym base --format gptq --bits 4 --group-size 128
gptq-v1-4b-g32-sym base --format gptq --bits 4 --group-size 32 --sym
gptq-v1-8b-gall-asym base --format gptq --bits 8 --group-size -1
gptq-v1-8b-g128-sym base --format gptq --bits 8 --group-size 128 --sym
gptq-v1-4b-g128-asym-act base --format gptq --bits 4 --group-size 128 --desc-act --seed 3
gptq-v1-8b-g32-sym-act base --format gptq --bits 8 --group-size 32 --sym --desc-act
gptq-v2-4b-g32-asym base --format gptq --bits 4 --group-size 32 --checkpoint-format gptq_v2
gptq-v2-8b-g128-asym base --format gptq --bits 8 --group-size 128 --checkpoint-format gptq_v2
gptq-v2-4b-gall-sym base --format gptq --bits 4 --group-size -1 --sym --checkpoint-format gptq_v2
gptq-v2-4b-g32-asym-act base --format gptq --bits 4 --group-size 32 --desc-act --checkpoint-format gptq_v2
awq-4b-g128 base --format awq --bits 4 --group-size 128
awq-4b-g32 base --format awq --bits 4 --group-size 32
ct-4b-g128-sym base --format compressed-tensors --bits 4 --group-size 128 --sym
ct-4b-g32-asym base --format compressed-tensors --bits 4 --group-size 32
ct-8b-channel-sym base --format compressed-tensors --bits 8 --group-size -1 --sym
ct-8b-g128-asym base --format compressed-tensors --bits 8 --group-size 128
ct-4b-channel-asym-bf16 base-bf16 --format compressed-tensors --bits 4 --group-size -1
EOF

# The other dense architectures at the tiny qwen3's sizes (Phi-3 keeps its head_dim 16, which its longrope factors
# fit): Llama, Mistral, Qwen2 (biased q/k/v: the biases stay next to the codes), Phi-3 (fused qkv_proj and
# gate_up_proj: a rank's rows of q, k and v are three spans), Gemma 3.
for arch in llama mistral qwen2 gemma3_text; do
  "$tp" make-model --arch $arch --preset tiny "${dims[@]}" --out "$out/$arch-base" >/dev/null
done
"$tp" make-model --arch phi3 --preset tiny --set hidden_size=256 --set intermediate_size=512 \
  --set num_attention_heads=16 --set num_key_value_heads=8 --set initializer_range=0.1 --out "$out/phi3-base" >/dev/null
# GPT-OSS's attention (biased, its sinks a parameter of self_attn) quantized, its fused experts as they are (their
# MXFP4 form is test_gpt_oss's); 16 heads, so that o_proj's 128 inputs are 32 a rank at tp 4.
"$tp" make-model --arch gpt_oss --preset tiny --set num_attention_heads=16 --set num_key_value_heads=8 \
  --set initializer_range=0.1 --out "$out/gpt_oss-base" >/dev/null
quantize arch_models.txt <<'EOF'
llama-awq-4b-g32 llama-base --format awq --bits 4 --group-size 32
mistral-ct-8b-channel-asym mistral-base --format compressed-tensors --bits 8 --group-size -1
qwen2-gptq-v1-4b-g32-asym-act qwen2-base --format gptq --bits 4 --group-size 32 --desc-act --seed 7
phi3-awq-4b-g32 phi3-base --format awq --bits 4 --group-size 32
phi3-gptq-v2-8b-g128-sym phi3-base --format gptq --bits 8 --group-size 128 --sym --checkpoint-format gptq_v2
gemma3_text-ct-4b-g32-asym gemma3_text-base --format compressed-tensors --bits 4 --group-size 32
gpt_oss-gptq-v1-4b-g32-asym gpt_oss-base --format gptq --bits 4 --group-size 32
EOF

# MoE models with their experts quantized under the Hub's per-expert names (Qwen3-MoE's and DeepSeek's
# mlp.experts.E.*_proj, Mixtral's block_sparse_moe.experts.E.w1/w2/w3), DeepSeek's MLA projections and shared
# experts too; expert intermediate 128, so that tp 4 holds whole groups of 32, and o_proj's inputs 384 (Qwen3-MoE)
# or 128 (Mixtral's 16 heads, DeepSeek's 8): 96 or 32 a rank at tp 4. DeepSeek at hidden 128, kv_lora_rank and
# V3's q_lora_rank 32: one group of kv_b_proj's and q_b_proj's inputs.
"$tp" make-model --arch qwen3_moe --preset tiny --set moe_intermediate_size=128 --set initializer_range=0.1 \
  --out "$out/qwen3_moe-base" >/dev/null
"$tp" make-model --arch mixtral --preset tiny --set intermediate_size=128 --set num_attention_heads=16 \
  --set num_key_value_heads=8 --set initializer_range=0.1 --out "$out/mixtral-base" >/dev/null
ds=(--set hidden_size=128 --set intermediate_size=128 --set moe_intermediate_size=128 --set num_attention_heads=8
    --set num_key_value_heads=8 --set initializer_range=0.1)
"$tp" make-model --arch deepseek_v2 --preset tiny "${ds[@]}" --out "$out/deepseek_v2-base" >/dev/null
"$tp" make-model --arch deepseek_v3 --preset tiny "${ds[@]}" --set q_lora_rank=32 --out "$out/deepseek_v3-base" >/dev/null
quantize moe_models.txt <<'EOF'
qwen3_moe-gptq-4b-g32-act qwen3_moe-base --format gptq --bits 4 --group-size 32 --desc-act --seed 5
qwen3_moe-ct-8b-channel-sym qwen3_moe-base --format compressed-tensors --bits 8 --group-size -1 --sym
mixtral-awq-4b-g32 mixtral-base --format awq --bits 4 --group-size 32
deepseek_v2-awq-4b-g32 deepseek_v2-base --format awq --bits 4 --group-size 32
deepseek_v3-gptq-v2-8b-g32-sym deepseek_v3-base --format gptq --bits 8 --group-size 32 --sym --checkpoint-format gptq_v2
EOF

# Reduced real shapes, in the settings of the Hub's quantized checkpoints of these models: Qwen3-0.6B in GPTQ int4
# g128 act-order, Qwen3-30B-A3B (16 of its 128 experts) in compressed-tensors W4A16 g128, whose experts' 768 inputs
# are 192 a rank at tp 4: a cut group of 128.
"$tp" make-model --arch qwen3 --preset qwen3-0.6b --layers 1 --set vocab_size=1024 --out "$out/qwen3-0.6b-base" >/dev/null
"$tp" make-model --arch qwen3_moe --preset qwen3-30b-a3b --layers 1 --set vocab_size=1024 --set num_experts=16 \
  --out "$out/qwen3-30b-a3b-base" >/dev/null
quantize real_models.txt <<'EOF'
qwen3-0.6b-gptq-4b-g128-act qwen3-0.6b-base --format gptq --bits 4 --group-size 128 --desc-act
EOF
quantize real_moe_models.txt <<'EOF'
qwen3-30b-a3b-ct-4b-g128-sym qwen3-30b-a3b-base --format compressed-tensors --bits 4 --group-size 128 --sym
EOF
# (the real-shape bases, 220 MB, are needed no more)
rm -rf "$out/qwen3-0.6b-base" "$out/qwen3-30b-a3b-base"
