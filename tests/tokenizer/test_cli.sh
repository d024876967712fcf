#!/usr/bin/env bash
# CLI tests of `tp tokenize` / `tp detokenize` on the tiny committed tokenizer:
# outputs and exit codes (0 ok, 1 runtime error, 2 usage error).
#   test_cli.sh TP_BINARY DATA_DIR
set -u
tp=$1
model=$2/tiny
failures=0

# expect CODE EXPECTED_STDOUT_OR_STDERR_SUBSTRING -- ARGS...
expect() {
  local code=$1 want=$2
  shift 3
  local out rc
  out=$("$tp" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code || "$out" != *"$want"* ]]; then
    echo "FAIL: tp $* -> exit $rc, output: $out (wanted exit $code and '$want')"
    failures=$((failures + 1))
  fi
}

expect 0 "300,259,264" -- tokenize --model "$model" --text "hello world"
expect 0 "259,264,301" -- tokenize --model "$model" --text "hello world<|eos|>" --no-special-tokens
expect 0 '{"ids":[300,259,264],"tokens":["<|bos|>","hello","Ġworld"]}' -- tokenize --tokenizer "$model/tokenizer.json" --text "hello world" --json
printf 'hello\nworld' > "${TMPDIR:-/tmp}/tp_cli_text.$$"
expect 0 "300,259,10,119,261,108,100" -- tokenize --model "$model" --text-file "${TMPDIR:-/tmp}/tp_cli_text.$$"
rm -f "${TMPDIR:-/tmp}/tp_cli_text.$$"
expect 0 "<|bos|>hello world" -- detokenize --model "$model" --ids 300,259,264
expect 0 "hello world" -- detokenize --model "$model" --ids "300, 259, 264" --skip-special-tokens
# Exact output: the text and one newline.
out=$("$tp" detokenize --model "$model" --ids 259,264 | od -c | head -1)
[[ "$out" == *"h   e   l   l   o       w   o   r   l   d  \n"* ]] || { echo "FAIL: detokenize output bytes: $out"; failures=$((failures + 1)); }

expect 2 "give exactly one of --model DIR or --tokenizer FILE" -- tokenize --text hi
expect 2 "give exactly one of --model DIR or --tokenizer FILE" -- tokenize --model "$model" --tokenizer "$model/tokenizer.json" --text hi
expect 2 "give the text with --text T or --text-file F" -- tokenize --model "$model"
expect 2 "excludes" -- tokenize --model "$model" --text a --text-file b
expect 2 "'x' is not a token id" -- detokenize --model "$model" --ids 1,x
expect 2 "--ids" -- detokenize --model "$model"
expect 1 "cannot decode token id 999" -- detokenize --model "$model" --ids 999
expect 1 "has no tokenizer.json" -- tokenize --model /nonexistent --text hi
expect 1 "cannot open --text-file" -- tokenize --model "$model" --text-file /nonexistent/file

bad=$(mktemp -d)
echo '{"model": {"type": "Unigram"}}' > "$bad/tokenizer.json"
expect 1 "model type 'Unigram' is not supported; supported: BPE" -- tokenize --model "$bad" --text hi
echo '{"model": ' > "$bad/tokenizer.json"
expect 1 "not valid JSON" -- tokenize --model "$bad" --text hi
rm -rf "$bad"

if [[ $failures -ne 0 ]]; then
  echo "$failures CLI checks failed"
  exit 1
fi
echo "all CLI checks passed"
