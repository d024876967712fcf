#!/usr/bin/env bash
# `tp make-model` with another layer count (--layers N, --set num_hidden_layers=N)
# writes a config whose per-layer keys list N layers, for every architecture:
# `tp forward` loads each one. GPT-OSS's layer_types keeps alternating; a
# layer_types given with --set must list one type per layer (a usage error).
set -euo pipefail
tp=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for arch in llama mistral qwen3 mixtral qwen3_moe gpt_oss deepseek_v2 deepseek_v3; do
  for how in "--layers 5" "--set num_hidden_layers=3"; do
    # shellcheck disable=SC2086
    "$tp" make-model --arch "$arch" --preset tiny $how --out "$dir/$arch" >/dev/null || fail "$arch $how: make-model"
    "$tp" forward --model "$dir/$arch" --input-ids 1,2,3 --out "$dir/logits.safetensors" >"$dir/log" 2>&1 ||
      { cat "$dir/log"; fail "$arch $how: tp forward refused the config make-model wrote"; }
  done
done
"$tp" make-model --arch gpt_oss --preset tiny --layers 5 --out "$dir/g" >/dev/null
/usr/bin/python3 - "$dir/g/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
want = ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"]
assert c["num_hidden_layers"] == 5 and c["layer_types"] == want, (c["num_hidden_layers"], c["layer_types"])
PY
"$tp" make-model --arch qwen3 --preset tiny --layers 5 --out "$dir/q" >/dev/null
grep -q '"max_window_layers": 5' "$dir/q/config.json" || fail "qwen3 --layers 5: max_window_layers did not follow"
set +e
msg=$("$tp" make-model --arch gpt_oss --preset tiny --layers 3 --set 'layer_types=["full_attention"]' \
  --out "$dir/bad" 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || fail "a layer_types of the wrong length: exit $rc, want 2 ($msg)"
echo "$msg" | grep -q "layer_types: 1 types for 3 layers" || fail "message: $msg"
[ ! -e "$dir/bad" ] || fail "a refused make-model wrote $dir/bad"
echo "make-model: per-layer keys follow the layer count for every architecture"
