#!/usr/bin/env bash
# CTest smoke test of bench/models/run_speedup_chart.py: the whole chart command on a
# tiny qwen3 (written here by `tp make-model`), tiny sizes (1 round, prefill 16 and 24,
# 4 decode steps, tp = 1 and 2, both engines); passes when it exits 0 (PyTorch fed tp's
# tokens agreed with them), and wrote a PNG and a JSON saying so.
#   speedup_chart_smoke.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
"$build/src/tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --dtype bf16 --out "$work/qwen3" \
  >/dev/null
"$here/run_speedup_chart.py" --build "$build" --model "$work/qwen3" --rounds 1 --contexts 16,24 --decode 4 \
  --tp 1,2 --warmup-prefill 4 --warmup-decode 1 --timeout 120 --out "$work/chart"
head -c 8 "$work/chart.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "no PNG"; exit 1; }
/usr/bin/python3 - "$work/chart.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["agreement"] == "PASS", j["agreement"]
assert j["checks"] and all(c["passed"] for c in j["checks"]), j["checks"]
for key in ("prefill_16", "decode_16", "prefill_24", "decode_24"):
    s = j["summary"][key]
    assert s["tp2"]["tp_s"][0] > 0 and s["tp2"]["torch_s"][0] > 0 and s["torch_single_2threads_s"][0] > 0, key
print("speedup chart smoke test: PNG and JSON written, agreement", j["agreement"])
PY
