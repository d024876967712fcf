#!/usr/bin/env bash
# A quantized lm_head (`tp quantize --lm-head`: GPTQModel's lm_head true, compressed-tensors' lm_head left out of
# ignore). The tiny qwen3 ties lm_head to its embedding, so the copy is written untied: the embedding as it was,
# lm_head quantized from the same weight. Oracles: `tp forward` on it equals it on the checkpoint the independent
# numpy reference dequantized (dequantize_reference.py, which also checks lm_head against the embedding within
# half a scale) at tp 1, and tp 2 and 4 equal tp 1 (lm_head column-parallel over the vocabulary, each rank its
# codes); greedy tokens (decode runs the integer kernels on lm_head too) equal the dequantized model's at tp 1 and 2;
# `tp plan` names lm_head's format; LoRA trains over the frozen quantized head. Refused by name: AWQ with
# --lm-head, and a checkpoint that says tie_word_embeddings true while its lm_head is quantized.
# Usage: test_quantized_lm_head.sh TP TPRUN SOURCE_DIR
set -euo pipefail
tp=$1
tprun=$2
src=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$src/tests/cli/cli_test_lib.sh"
compare() { /usr/bin/python3 "$src/tests/models/f32_tensors.py" compare "$@"; }
tokens() { sed -n 's/.*"token_ids":\(\[\[[^]]*\],\[[^]]*\]\]\).*/\1/p'; }
ids=1,17,300,5,99,42,511,7,256,3
gen=(generate --dtype f32 --input-ids 1,2,3 --input-ids 9,8 --max-new-tokens 6 --json)

# vocab 512: GPTQ packs lm_head's zero points eight to a word along the vocabulary.
"$tp" make-model --arch qwen3 --preset tiny --set hidden_size=256 --set intermediate_size=512 --set vocab_size=512 \
  --set num_attention_heads=8 --set head_dim=32 --set num_key_value_heads=4 --set initializer_range=0.1 \
  --out "$dir/base" >/dev/null
grep -q '"tie_word_embeddings": true' "$dir/base/config.json" || fail "the base model should tie its embeddings"
for setting in "gptq --bits 4 --group-size 32" "compressed-tensors --bits 8 --group-size -1 --sym"; do
  name=${setting%% *}
  q=$dir/$name
  # shellcheck disable=SC2086
  "$tp" quantize --model "$dir/base" --out "$q" --format $setting --lm-head >/dev/null
  /usr/bin/python3 "$src/tests/models/dequantize_reference.py" "$q" "$q.deq" --original "$dir/base" >/dev/null
  grep -q '"tie_word_embeddings": false' "$q/config.json" || fail "$name: the quantized copy should be untied"
  [ -f "$q.deq/config.json" ] && /usr/bin/python3 - "$q" <<'PY' || fail "$name: lm_head is not stored quantized"
import json, struct, sys
d = sys.argv[1]
raw = open(d + "/model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert "lm_head.weight" not in names and ("lm_head.qweight" in names or "lm_head.weight_packed" in names), sorted(names)
assert "model.embed_tokens.weight" in names
PY
  "$tp" forward --model "$q" --dtype f32 --input-ids $ids --out "$dir/q1.safetensors" 2>"$dir/err.txt" ||
    { cat "$dir/err.txt"; fail "$name: tp 1"; }
  "$tp" forward --model "$q.deq" --dtype f32 --input-ids $ids --out "$dir/d1.safetensors" 2>/dev/null
  compare "$dir/d1.safetensors" "$dir/q1.safetensors" 1e-5 "$name: quantized lm_head vs numpy-dequantized, tp 1"
  for np in 2 4; do
    "$tprun" --nproc-per-node $np "$tp" forward --model "$q" --dtype f32 --input-ids $ids \
      --out "$dir/q$np.safetensors" 2>"$dir/err.txt" || { cat "$dir/err.txt"; fail "$name: tp $np"; }
    compare "$dir/q1.safetensors" "$dir/q$np.safetensors" 1e-5 "$name: tp $np vs tp 1"
  done
  t_deq=$("$tp" "${gen[@]}" --model "$q.deq" 2>/dev/null | tokens)
  t1=$("$tp" "${gen[@]}" --model "$q" 2>/dev/null | tokens)
  t2=$("$tprun" --nproc-per-node 2 "$tp" "${gen[@]}" --model "$q" 2>/dev/null | tokens)
  [ -n "$t1" ] && [ "$t1" = "$t_deq" ] && [ "$t1" = "$t2" ] ||
    fail "$name: greedy tokens: dequantized $t_deq, tp 1 $t1, tp 2 $t2"
  echo "$name: greedy tokens dequantized = tp 1 = tp 2 = $t1"
  "$tp" plan --model "$q" --tp-size 2 >"$dir/plan.txt" 2>&1
  grep -E "^lm_head.weight .*$name" "$dir/plan.txt" >/dev/null || { cat "$dir/plan.txt"; fail "$name: plan"; }
done

# LoRA over the frozen quantized head and layers: the losses of the same run over the dequantized weights.
# (The tiny tokenizer's ids, for tp train's data, are below the vocabulary's 512.)
for m in gptq gptq.deq; do cp "$src/tests/tokenizer/data/tiny/tokenizer.json" "$dir/$m/"; done
write_sentences "$dir/train.txt" 100
lora=(train --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 1e-2 --logging-steps 1 --max-steps 2
  --dtype f32 --lora-r 4 --lora-alpha 8 --lora-target q_proj,v_proj)
"$tp" "${lora[@]}" --model "$dir/gptq" --output-dir "$dir/lq" 2>"$dir/log.txt" || { cat "$dir/log.txt"; fail "LoRA"; }
"$tp" "${lora[@]}" --model "$dir/gptq.deq" --output-dir "$dir/ld" 2>/dev/null
/usr/bin/python3 - "$dir/lq/log_history.jsonl" "$dir/ld/log_history.jsonl" <<'PY' || fail "LoRA losses differ"
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:])
assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(a, b)), (a, b)
print("LoRA over the quantized head: losses", a, "=", b)
PY

expect 2 "AWQ GEMM checkpoints keep lm_head unquantized" -- \
  "$tp" quantize --model "$dir/base" --out "$dir/awq" --format awq --bits 4 --group-size 32 --lm-head
sed -i 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$dir/gptq/config.json"
expect 1 "'lm_head.weight' is quantized in the checkpoint, but config.json ties it to 'model.embed_tokens.weight'" -- \
  "$tp" forward --model "$dir/gptq" --dtype f32 --input-ids $ids --out "$dir/x.safetensors"
echo "test_quantized_lm_head: ok"
