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
