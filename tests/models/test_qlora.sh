#!/usr/bin/env bash
# LoRA over a quantized base (QLoRA): `tp train --lora-*` on a GPTQ 4-bit act-order checkpoint trains the adapter
# over the frozen codes. The oracle is the same run on the f32 checkpoint that the independent numpy reference
# dequantized from the same files (dequantize_reference.py): the losses and the saved adapter agree within f32
# rounding, at tp 1 and tp 2 (each rank its shard of the codes), and the losses of a bf16 step with gradient
# checkpointing and of FSDP over two data-parallel ranks; `tp forward --adapter` over the codes equals it
# over the dequantized weights. Training the codes themselves, and merging into them, are refused by name.
# Usage: test_qlora.sh TP TPRUN SOURCE_DIR
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$src/tests/cli/cli_test_lib.sh"

"$tp" make-model --arch qwen3 --preset tiny --set hidden_size=256 --set intermediate_size=512 \
  --set num_attention_heads=8 --set head_dim=32 --set num_key_value_heads=4 --set initializer_range=0.1 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/base" >/dev/null
"$tp" quantize --model "$dir/base" --out "$dir/q" --format gptq --bits 4 --group-size 32 --desc-act --seed 3 \
  >/dev/null
/usr/bin/python3 "$src/tests/models/dequantize_reference.py" "$dir/q" "$dir/deq" --original "$dir/base" >/dev/null
write_sentences "$dir/train.txt" 200

lora=(train --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 1e-2 --logging-steps 1 --max-steps 4
  --dtype f32 --lora-r 8 --lora-alpha 16 --lora-target q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
"$tp" "${lora[@]}" --model "$dir/q" --output-dir "$dir/q1" 2>"$dir/log.txt" || { cat "$dir/log.txt"; fail "tp 1"; }
grep -q "LoRA (r=8" "$dir/log.txt" || { cat "$dir/log.txt"; fail "no LoRA summary"; }
"$tp" "${lora[@]}" --model "$dir/deq" --output-dir "$dir/d1" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" "${lora[@]}" --model "$dir/q" --output-dir "$dir/q2" 2>"$dir/log.txt" ||
  { cat "$dir/log.txt"; fail "tp 2"; }
# A bf16 step with gradient checkpointing at tp 2: the base's products in bf16 over the codes, as over the weights.
bf16=("${lora[@]/f32/bf16}" --gradient-checkpointing)
"$tprun" --nproc-per-node 2 "$tp" "${bf16[@]}" --model "$dir/q" --output-dir "$dir/qb" 2>"$dir/log.txt" ||
  { cat "$dir/log.txt"; fail "bf16"; }
"$tprun" --nproc-per-node 2 "$tp" "${bf16[@]}" --model "$dir/deq" --output-dir "$dir/db" 2>/dev/null
# FSDP over two data-parallel ranks (tp 1): the frozen codes stay whole on each rank, the adapter is sharded.
"$tprun" --nproc-per-node 2 "$tp" "${lora[@]}" --dp-shard-size 2 --fsdp full_shard --model "$dir/q" \
  --output-dir "$dir/qf" 2>"$dir/log.txt" || { cat "$dir/log.txt"; fail "fsdp"; }
"$tprun" --nproc-per-node 2 "$tp" "${lora[@]}" --dp-shard-size 2 --fsdp full_shard --model "$dir/deq" \
  --output-dir "$dir/df" 2>/dev/null

PYTHONPATH="$src/tests/models" /usr/bin/python3 - "$dir" <<'PY'
import json, sys
from f32_tensors import read
d = sys.argv[1]
def losses(run):
    rows = [json.loads(line) for line in open(f"{d}/{run}/log_history.jsonl")]
    return [r["loss"] for r in rows if "loss" in r]
def adapter(run):
    return read(f"{d}/{run}/adapter_model.safetensors")
want = losses("d1")
assert len(want) == 4, want
for run in ("q1", "q2"):
    got = losses(run)
    assert len(got) == len(want) and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, want)), (run, got, want)
assert want[-1] < want[0], ("the adapter must learn", want)
# bf16: act-order sums the inputs in another order, and an activation rounded to bf16 on the other side of a
# boundary moves by 2^-8 of itself: 2e-3 (the losses fall by a quarter over the 4 steps).
got, ref_bf16 = losses("qb"), losses("db")
assert len(got) == 4 and all(abs(a - b) <= 2e-3 * abs(b) for a, b in zip(got, ref_bf16)), ("bf16", got, ref_bf16)
got, ref_fsdp = losses("qf"), losses("df")
assert len(got) == 4 and all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, ref_fsdp)), ("fsdp", got, ref_fsdp)
ref = adapter("d1")
assert len(ref) == 2 * 7 * 2, sorted(ref)
for run in ("q1", "q2"):
    a = adapter(run)
    assert sorted(a) == sorted(ref), run
    # AdamW's first steps move a weight by about lr whatever its gradient's size, so a gradient within rounding of
    # zero may move either way: the adapters are compared as wholes (relative L2), the losses element by element.
    diff = sum(sum((x - y) ** 2 for x, y in zip(a[k], ref[k])) for k in ref) ** 0.5
    scale = sum(sum(y * y for y in ref[k]) for k in ref) ** 0.5
    print(f"{run}: adapter relative L2 difference {diff / scale:.3g}")
    assert diff <= 1e-3 * scale, (run, diff, scale)
    moved = max(max(abs(v) for v in a[k]) for k in a if k.endswith("lora_B.weight"))
    assert moved > 0, "lora_B left at zero: no gradient reached it"
print(f"QLoRA: losses {['%.5f' % x for x in want]} over the codes at tp 1 and 2 = over the dequantized weights; "
      f"adapters within 1e-3 (relative L2)")
PY

# The adapter over the codes and over the dequantized weights: the same logits.
ids=1,5,9,200,33,7,480
"$tp" forward --model "$dir/q" --adapter "$dir/q1" --dtype f32 --input-ids $ids --out "$dir/lq.safetensors" 2>/dev/null
"$tp" forward --model "$dir/deq" --adapter "$dir/q1" --dtype f32 --input-ids $ids --out "$dir/ld.safetensors" \
  2>/dev/null
/usr/bin/python3 "$src/tests/models/f32_tensors.py" compare "$dir/ld.safetensors" "$dir/lq.safetensors" 1e-5 \
  "forward --adapter over the codes = over the dequantized weights"

expect 1 "parameter 'model.layers.0.self_attn.q_proj.weight' is quantized (4-bit codes): a quantized model cannot be fine-tuned itself" -- \
  "$tp" train --model "$dir/q" --data "$dir/train.txt" --seq-len 16 --max-steps 1 --output-dir "$dir/full"
expect 1 "is quantized (4-bit codes): an adapter trained over quantized codes merges into the unquantized model" -- \
  "$tp" merge-adapter --model "$dir/q" --adapter "$dir/q1" --out "$dir/merged"
echo "training the codes and merging into them: refused by name"
