#!/usr/bin/env bash
# Quantized checkpoints for test_quantized_checkpoint (CTest fixture): a tiny qwen3 (in_features 256 and 512,
# out_features 128 to 512, so groups of 32 and 128 fit whole and at tp 4 o_proj's 64 rows per rank cut a group of
# 128), written by `tp quantize` in every format and setting tp reads, each dequantized by the independent numpy
# reference (dequantize_reference.py) into <name>.deq, which also checks every weight against the original
# within half its scale. models.txt lists the names.
set -euo pipefail
tp=$1
out=$2
ref="$(dirname "$0")/dequantize_reference.py"
rm -rf "$out"
mkdir -p "$out"
dims=(--set hidden_size=256 --set intermediate_size=512 --set num_attention_heads=8 --set head_dim=32
      --set num_key_value_heads=4 --set initializer_range=0.1)
"$tp" make-model --arch qwen3 --preset tiny "${dims[@]}" --out "$out/base" >/dev/null
"$tp" make-model --arch qwen3 --preset tiny "${dims[@]}" --dtype bf16 --seed 1 --out "$out/base-bf16" >/dev/null
# name base flags...
while read -r name base flags; do
  # shellcheck disable=SC2086
  "$tp" quantize --model "$out/$base" --out "$out/$name" $flags
  /usr/bin/python3 "$ref" "$out/$name" "$out/$name.deq" --original "$out/$base"
  echo "$name" >>"$out/models.txt"
done <<'EOF'
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

# MoE models with their experts quantized under the Hub's per-expert names (Qwen3-MoE's mlp.experts.E.*_proj,
# Mixtral's block_sparse_moe.experts.E.w1/w2/w3), expert intermediate 64 so that tp 2 holds whole groups of 32:
# moe_models.txt lists them.
"$tp" make-model --arch qwen3_moe --preset tiny --set moe_intermediate_size=64 --set initializer_range=0.1 \
  --out "$out/qwen3_moe-base" >/dev/null
"$tp" make-model --arch mixtral --preset tiny --set intermediate_size=64 --set initializer_range=0.1 \
  --out "$out/mixtral-base" >/dev/null
while read -r name base flags; do
  # shellcheck disable=SC2086
  "$tp" quantize --model "$out/$base" --out "$out/$name" $flags
  /usr/bin/python3 "$ref" "$out/$name" "$out/$name.deq" --original "$out/$base"
  echo "$name" >>"$out/moe_models.txt"
done <<'EOF'
qwen3_moe-gptq-4b-g32-act qwen3_moe-base --format gptq --bits 4 --group-size 32 --desc-act --seed 5
qwen3_moe-ct-8b-channel-sym qwen3_moe-base --format compressed-tensors --bits 8 --group-size -1 --sym
mixtral-awq-4b-g32 mixtral-base --format awq --bits 4 --group-size 32
EOF
