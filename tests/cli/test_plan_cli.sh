#!/usr/bin/env bash
# `tp plan` as a user runs it: the qwen3-0.6b preset at tp_size 4 (JSON), a bad
# plan (exit 1, message on stderr) and a usage error (exit 2). `tp plan` reads
# config.json only, so the checkpoint is written with one layer to stay fast.
set -euo pipefail
tp=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tp" make-model --arch qwen3 --preset qwen3-0.6b --layers 1 --out "$dir/q" >/dev/null
"$tp" plan --model "$dir/q" --tp-size 4 --json >"$dir/plan.json" 2>"$dir/warnings.txt"
/usr/bin/env python3 - "$dir/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["tp_size"] == 4, plan["tp_size"]
params = {p["name"]: p for p in plan["parameters"]}
for name, p in params.items():
    assert len(p["local_shapes"]) == 4 and len(p["bytes_per_rank"]) == 4, name
    if name.endswith("_proj.weight"):
        full = 2
        for s in p["global_shape"]:
            full *= s
        assert all(4 * b == full for b in p["bytes_per_rank"]), (name, p["bytes_per_rank"], full)
for norm in ("q_norm", "k_norm"):
    assert params[f"model.layers.0.self_attn.{norm}.weight"]["style"] == "replicated_with_grad_allreduce"
assert params["model.embed_tokens.weight"]["style"] == "embedding_rowwise"
assert params["lm_head.weight"]["style"] == "colwise_gather_output"
assert params["lm_head.weight"]["tied_to"] == "model.embed_tokens.weight"
ops = sorted((c["module"], c["op"]) for c in plan["collectives"])
assert ("model.layers.0.self_attn.o_proj", "all_reduce") in ops and ("lm_head", "all_gather") in ops, ops
per_rank, total = plan["total_bytes_per_rank"], plan["total_bytes_unsharded"]
assert all(abs(b - total / 4) < total * 0.01 for b in per_rank), (per_rank, total)
print("tp plan --json: ok,", per_rank[0], "bytes per rank of", total)
PY

# A plan naming an unknown style: exit 1, the message on stderr.
echo '{"model.layers.*.mlp.up_proj": "colwize"}' >"$dir/bad_plan.json"
set +e
"$tp" plan --model "$dir/q" --tp-size 4 --tp-plan "$dir/bad_plan.json" >/dev/null 2>"$dir/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] || { echo "bad plan: exit $rc, expected 1"; exit 1; }
grep -q "colwize" "$dir/err.txt" && grep -q "supported styles are" "$dir/err.txt" || { cat "$dir/err.txt"; exit 1; }
# tp_size 3 cannot split 16 heads: exit 1 naming the sizes.
set +e
"$tp" plan --model "$dir/q" --tp-size 3 >/dev/null 2>"$dir/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "num_attention_heads 16 is not divisible by tp_size 3" "$dir/err.txt" || { echo "rc=$rc"; cat "$dir/err.txt"; exit 1; }
# Missing --tp-size: usage error, exit 2.
set +e
"$tp" plan --model "$dir/q" >/dev/null 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || { echo "missing --tp-size: exit $rc, expected 2"; exit 1; }
echo "tp plan errors: ok"

# GPT-OSS's MXFP4 experts: at inference each rank keeps its slice packed (codes and an f16 scale a block of 32:
# 4.5 bits a weight) where it holds whole blocks of 32 inputs; down_proj's 96 inputs cut in 48 a rank at tp 2 are
# not whole blocks, so there they are read dequantised (4 bytes a weight in this f32 model), and whole at tp 3.
"$tp" make-model --arch gpt_oss --preset tiny --set intermediate_size=96 --mxfp4 --out "$dir/oss" >/dev/null
for t in 1 2 3; do "$tp" plan --model "$dir/oss" --tp-size $t --json >"$dir/oss$t.json" 2>/dev/null; done
/usr/bin/env python3 - "$dir" <<'PY'
import json, sys
for t in (1, 2, 3):
    plan = json.load(open(f"{sys.argv[1]}/oss{t}.json"))
    rows = {p["name"]: p for p in plan["parameters"]}
    for name in ("gate_up_proj", "down_proj"):
        p = rows[f"model.layers.0.mlp.experts.{name}"]
        for local, b in zip(p["local_shapes"], p["bytes_per_rank"]):
            e, n_in, out = local
            whole_blocks = n_in % 32 == 0
            assert p.get("quantized") == ("mxfp4" if whole_blocks else None), (t, name, p)
            want = e * out * n_in * 9 // 16 if whole_blocks else 4 * e * out * n_in
            assert b == want, (t, name, local, b, want)
print("tp plan: MXFP4 experts at 4.5 bits a weight where a rank holds whole blocks (tp 1, 2, 3)")
PY
