#!/usr/bin/env bash
# LoRA from the command line: `tp train --lora-*` at tp = 2 writes a PEFT adapter
# (and resumes from its checkpoint); `tp forward --adapter` gives the same logits
# at tp = 1, 2 and 4; `tp merge-adapter` writes a checkpoint whose logits are the
# adapted model's; errors name a target that matches nothing and an adapter that
# does not fit the model.
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/m" >/dev/null
"$tp" make-model --arch llama --preset tiny --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" \
  --out "$dir/other" >/dev/null
source "$src/tests/cli/cli_test_lib.sh"
write_sentences "$dir/train.txt" 200

lora=(train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 1e-2 --logging-steps 2
  --save-steps 3 --lora-r 8 --lora-alpha 16 --lora-dropout 0.1
  --lora-target q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
"$tprun" --nproc-per-node 2 "$tp" "${lora[@]}" --max-steps 6 --output-dir "$dir/out" 2>"$dir/log.txt"
grep -q "LoRA (r=8 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)" "$dir/log.txt" \
  || { cat "$dir/log.txt"; fail "no LoRA summary"; }
for f in adapter_config.json adapter_model.safetensors checkpoint-6/trainer_state.json; do
  [ -f "$dir/out/$f" ] || fail "no $f"
done
[ ! -e "$dir/out/model.safetensors" ] || fail "a LoRA run saves the adapter, not the model"
/usr/bin/python3 - "$dir/out" <<'PY'
import json, struct, sys
c = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert c["peft_type"] == "LORA" and c["r"] == 8 and c["lora_alpha"] == 16 and c["task_type"] == "CAUSAL_LM", c
assert sorted(c["target_modules"]) == sorted("q_proj k_proj v_proj o_proj gate_proj up_proj down_proj".split()), c
data = open(sys.argv[1] + "/adapter_model.safetensors", "rb").read()
h = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
a = h["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
b = h["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
assert a["shape"] == [8, 64] and b["shape"] == [64, 8] and a["dtype"] == "F32", (a, b)
assert len([k for k in h if k != "__metadata__"]) == 2 * 7 * 2, sorted(h)
PY
echo "train --lora-*: PEFT adapter files written"

# Resume from the step-3 checkpoint: the same final adapter (dropout masks follow the step).
rm -rf "$dir/out/checkpoint-6"
cp "$dir/out/adapter_model.safetensors" "$dir/first.safetensors"
"$tprun" --nproc-per-node 2 "$tp" "${lora[@]}" --max-steps 6 --output-dir "$dir/out" \
  --resume-from-checkpoint last 2>"$dir/log2.txt"
cmp -s "$dir/first.safetensors" "$dir/out/adapter_model.safetensors" || fail "the resumed run saved another adapter"
echo "resume: the same adapter, bit for bit"

# The adapter at tp 1, 2, 4 and merged: the same logits.
ids=1,5,9,200,33,7,480
"$tp" forward --model "$dir/m" --adapter "$dir/out" --input-ids $ids --out "$dir/l1.safetensors" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" forward --model "$dir/m" --adapter "$dir/out" --input-ids $ids \
  --out "$dir/l2.safetensors" 2>/dev/null
"$tprun" --nproc-per-node 4 "$tp" forward --model "$dir/m" --adapter "$dir/out" --input-ids $ids \
  --out "$dir/l4.safetensors" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" merge-adapter --model "$dir/m" --adapter "$dir/out" --out "$dir/merged" 2>/dev/null
"$tp" forward --model "$dir/merged" --input-ids $ids --out "$dir/lm.safetensors" 2>/dev/null
"$tp" forward --model "$dir/m" --input-ids $ids --out "$dir/base.safetensors" 2>/dev/null
/usr/bin/python3 - "$dir" <<'PY'
import json, struct, sys
def logits(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    b, t = json.loads(data[8:8 + n])["logits"]["data_offsets"]
    return struct.unpack(f"<{(t - b) // 4}f", data[8 + n + b:8 + n + t])
d = sys.argv[1]
one = logits(d + "/l1.safetensors")
scale = max(abs(x) for x in one)
for other in ("l2", "l4", "lm"):
    diff = max(abs(x - y) for x, y in zip(one, logits(f"{d}/{other}.safetensors")))
    assert diff <= 1e-5 * scale, (other, diff, scale)
moved = max(abs(x - y) for x, y in zip(one, logits(d + "/base.safetensors")))
assert moved > 1e-3 * scale, ("the adapter must change the logits", moved)
print(f"forward --adapter at tp 1, 2, 4 and the merged checkpoint agree (max |logit| {scale:.3g}); "
      f"the base differs by {moved:.3g}")
PY
"$tp" generate --model "$dir/m" --adapter "$dir/out" --prompt "the cat" --max-new-tokens 4 >/dev/null 2>&1 \
  || fail "generate --adapter"

# Errors.
expect 1 "target module 'qkv_proj' matches no Linear or Embedding module of this qwen3 model" -- \
  "$tp" "${lora[@]/q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj/q_proj,qkv_proj}" --max-steps 1 \
  --output-dir "$dir/bad"
expect 1 "but this model needs" -- "$tp" forward --model "$dir/other" --adapter "$dir/out" --input-ids 1,2 \
  --out "$dir/x.safetensors"
expect 1 "no adapter_config.json" -- "$tp" forward --model "$dir/m" --adapter "$dir/m" --input-ids 1,2 \
  --out "$dir/x.safetensors"
expect 2 "'lora_dropout' must be in [0, 1)" -- "$tp" train --model "$dir/m" --data "$dir/train.txt" --seq-len 16 \
  --lora-dropout 1.5 --max-steps 1 --output-dir "$dir/bad"
echo "errors: ok"
