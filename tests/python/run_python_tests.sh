#!/usr/bin/env bash
# run_python_tests.sh TP TPRUN PYTHONPATH SRC RANKS: makes a tiny Llama with a
# real BPE tokenizer, writes what the `tp` command gives for it at RANKS ranks
# (logits, greedy and sampled tokens, token ids, a trained model), then runs the
# Python tests (tests/python/test_*.py) on RANKS ranks, which compare the
# bindings against those files.
set -euo pipefail
tp=$1
tprun=$2
pythonpath=$(cd "$3" && pwd)
src=$(cd "$4" && pwd)
ranks=$5
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python=/usr/bin/python3
run() { if [ "$ranks" -gt 1 ]; then "$tprun" --nproc-per-node "$ranks" "$@"; else "$@"; fi; }

# m: ids only (a random model's tokens need not decode); mt: with the tokenizer, for text and training.
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 --out "$dir/m" >/dev/null
"$tp" make-model --arch llama --preset tiny --set initializer_range=0.1 --set vocab_size=302 \
  --tokenizer "$src/tests/tokenizer/data/tiny/tokenizer.json" --out "$dir/mt" >/dev/null
source "$src/tests/cli/cli_test_lib.sh"
write_sentences "$dir/train.txt" 80

# moe: a tiny Qwen3-MoE for expert parallelism (every rank holds its experts).
"$tp" make-model --arch qwen3_moe --preset tiny --set initializer_range=0.1 --out "$dir/moe" >/dev/null

ref=$dir/ref
mkdir -p "$ref"
ids=1,5,9,300,42,7,7,3
run "$tp" forward --model "$dir/m" --input-ids "$ids" --out "$ref/logits.safetensors" >/dev/null
run "$tp" generate --model "$dir/m" --input-ids "$ids" --max-new-tokens 12 --json >"$ref/greedy.json" 2>/dev/null
run "$tp" forward --model "$dir/moe" --tp-size 1 --ep-size "$ranks" --input-ids "$ids" \
  --out "$ref/moe_logits.safetensors" >/dev/null 2>&1
run "$tp" generate --model "$dir/m" --input-ids "$ids" --max-new-tokens 12 --temperature 0.8 --top-k 20 \
  --top-p 0.9 --seed 3 --json >"$ref/sampled.json" 2>/dev/null
"$tp" tokenize --model "$dir/mt" --text "the cat sat on a mat" --json >"$ref/tokens.json"
run "$tp" train --model "$dir/mt" --data "$dir/train.txt" --seq-len 16 --batch-size 4 --lr 3e-3 --max-steps 4 \
  --logging-steps 1 --save-steps 100 --disable-tqdm --output-dir "$ref/trained" >/dev/null 2>&1
"$tp" --version >"$ref/version.txt"

export PYTHONPATH=$pythonpath TP_TEST_MODEL=$dir/m TP_TEST_TEXT_MODEL=$dir/mt TP_TEST_MOE_MODEL=$dir/moe TP_TEST_REF=$ref TP_TEST_DATA=$dir/train.txt TP_TEST_RANKS=$ranks
export TP_TEST_OUT=$dir/py TP_TEST_SRC=$src
cd "$src/tests/python"
run "$python" -m unittest -v test_bindings 2>&1
