#!/usr/bin/env bash
# `tp forward` and `tp generate` through `tprun`: 2 ranks give the logits and the
# tokens of 1 rank; bad token ids are a usage error (exit 2) naming the value.
set -euo pipefail
tp=$1
tprun=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --out "$dir/m" >/dev/null
"$tp" forward --model "$dir/m" --input-ids 1,2,3,4,5 --out "$dir/one.safetensors" 2>/dev/null
"$tprun" --nproc-per-node 2 "$tp" forward --model "$dir/m" --input-ids 1,2,3,4,5 --out "$dir/two.safetensors" 2>/dev/null
/usr/bin/python3 - "$dir/one.safetensors" "$dir/two.safetensors" <<'PY'
import json, struct, sys
def logits(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    e = json.loads(data[8:8 + n])["logits"]
    assert e["dtype"] == "F32" and e["shape"] == [5, 516], e
    b, t = e["data_offsets"]
    return struct.unpack(f"<{(t - b) // 4}f", data[8 + n + b:8 + n + t])
a, b = logits(sys.argv[1]), logits(sys.argv[2])
scale = max(abs(x) for x in a)
diff = max(abs(x - y) for x, y in zip(a, b))
assert diff <= 1e-4 * scale, (diff, scale)
print(f"tp forward: tp2 vs tp1 max diff {diff:.3g} (max |logit| {scale:.3g})")
PY
gen=(generate --model "$dir/m" --input-ids 1,2,3 --input-ids 9,8 --max-new-tokens 6 --json)
one=$("$tp" "${gen[@]}" 2>/dev/null | sed -n 's/.*"token_ids":\(\[\[[^]]*\],\[[^]]*\]\]\).*/\1/p')
two=$("$tprun" --nproc-per-node 2 "$tp" "${gen[@]}" 2>/dev/null | sed -n 's/.*"token_ids":\(\[\[[^]]*\],\[[^]]*\]\]\).*/\1/p')
[ -n "$one" ] && [ "$one" = "$two" ] || { echo "generate: tp1 $one vs tp2 $two"; exit 1; }
echo "tp generate: same tokens on 1 and 2 ranks: $one"
set +e
"$tp" forward --model "$dir/m" --input-ids 1,x,3 --out "$dir/bad.safetensors" 2>"$dir/err.txt"
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "'x' is not a token id" "$dir/err.txt" || { echo "rc=$rc"; cat "$dir/err.txt"; exit 1; }
set +e
"$tp" forward --model "$dir/m" --input-ids 1,516 --out "$dir/bad.safetensors" 2>"$dir/err.txt"
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "token id 516 is outside the vocabulary" "$dir/err.txt" || { echo "rc=$rc"; cat "$dir/err.txt"; exit 1; }
echo "bad ids: ok"
