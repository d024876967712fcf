#!/usr/bin/env bash
# `tp chat` on a tiny random model with a real (tiny) byte-level BPE tokenizer
# and a chat template in its tokenizer_config.json:
#  - a 2-turn conversation piped in: the second prompt holds the first answer,
#    and tprun with 2 ranks answers exactly as 1 rank;
#  - Ctrl-C (SIGINT to rank 0) during a long answer ends that answer only: the
#    session goes on and answers the next line, at 1 and 2 ranks;
#  - a model folder without a chat template is an error naming the folder.
set -euo pipefail
tp=$1
tprun=$2
tokenizer_dir=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The tiny tokenizer with its two special tokens moved next to the vocabulary
# (ids 265, 266) and a third one (267), so that a random model over 268 ids
# (split in 2) only emits decodable ids.
mkdir -p "$dir/tok"
/usr/bin/python3 - "$tokenizer_dir" "$dir/tok" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
text = open(f"{src}/tokenizer.json").read()
text = text.replace('"id": 300', '"id": 265').replace('"id": 301', '"id": 266').replace("[300]", "[265]")
tok = json.loads(text)
tok["added_tokens"].append(dict(tok["added_tokens"][-1], id=267, content="<|pad|>"))
json.dump(tok, open(f"{out}/tokenizer.json", "w"))
config = json.load(open(f"{src}/tokenizer_config.json"))
config["chat_template"] = (
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
json.dump(config, open(f"{out}/tokenizer_config.json", "w"))
PY
"$tp" make-model --arch qwen3 --preset tiny --set initializer_range=0.1 --set vocab_size=268 --set max_position_embeddings=8192 \
  --tokenizer "$dir/tok/tokenizer.json" --out "$dir/m" >/dev/null 2>&1

chat=(chat --model "$dir/m" --system "be brief" --max-new-tokens 6 --show-prompt)
printf 'hello there\n\nsecond question\n' | "$tp" "${chat[@]}" >"$dir/one.out" 2>"$dir/one.err" || { cat "$dir/one.err"; fail "tp chat"; }
printf 'hello there\n\nsecond question\n' | "$tprun" --nproc-per-node 2 "$tp" "${chat[@]}" >"$dir/two.out" 2>"$dir/two.err" ||
  { cat "$dir/two.err"; fail "tprun tp chat"; }
/usr/bin/python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
answers = open(f"{d}/one.out", encoding="utf-8", errors="replace").read().split("\n")[:2]
prompts = [json.loads(l[len("[prompt] "):]) for l in open(f"{d}/one.err") if l.startswith("[prompt] ")]
assert len(prompts) == 2, prompts
assert prompts[0] == "<|bos|>system: be brief<|eos|>\nuser: hello there<|eos|>\nassistant:", prompts[0]
# The second prompt: the first prompt, the first answer as the assistant's turn, the new line.
assert prompts[1].startswith(prompts[0]), prompts[1]
assert prompts[1].endswith("<|eos|>\nuser: second question<|eos|>\nassistant:"), prompts[1]
first_answer = prompts[1][len(prompts[0]):-len("<|eos|>\nuser: second question<|eos|>\nassistant:")]
assert len(first_answer) > 0, "empty first answer"
print(f"tp chat: 2 turns, the second prompt holds the first answer {first_answer!r}")
PY
cmp -s "$dir/one.out" "$dir/two.out" || { diff "$dir/one.out" "$dir/two.out"; fail "2 ranks answer differently from 1"; }
echo "tp chat: 2 ranks give the same answers as 1"
# A MoE under expert parallelism with tp_size 1: both ranks are tp rank 0, one reads stdin.
"$tp" make-model --arch qwen3_moe --preset tiny --set initializer_range=0.1 --set vocab_size=268 \
  --set max_position_embeddings=8192 --tokenizer "$dir/tok/tokenizer.json" --out "$dir/moe" >/dev/null 2>&1
moe_chat=(chat --model "$dir/moe" --system "be brief" --max-new-tokens 6)
printf 'hello there\nsecond question\n' | "$tp" "${moe_chat[@]}" >"$dir/moe1.out" 2>"$dir/moe1.err" ||
  { cat "$dir/moe1.err"; fail "tp chat (moe)"; }
printf 'hello there\nsecond question\n' | timeout 120 "$tprun" --nproc-per-node 2 "$tp" "${moe_chat[@]}" --ep-size 2 \
  --tp-size 1 >"$dir/moe2.out" 2>"$dir/moe2.err" || { cat "$dir/moe2.err"; fail "tprun tp chat --ep-size 2 --tp-size 1"; }
[ "$(wc -l <"$dir/moe1.out")" -ge 2 ] || fail "the moe chat answered $(wc -l <"$dir/moe1.out") turns, not 2"
cmp -s "$dir/moe1.out" "$dir/moe2.out" || { diff "$dir/moe1.out" "$dir/moe2.out"; fail "ep 2 x tp 1 answers differently from 1 rank"; }
echo "tp chat: a MoE at ep 2 x tp 1 gives the same answers as 1 rank"
# --json: a line per turn whose answer is the streamed one.
printf 'hello there\nsecond question\n' | "$tp" "${chat[@]}" --json >"$dir/one.json" 2>/dev/null
/usr/bin/python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
turns = [json.loads(l) for l in open(f"{d}/one.json")]
streamed = open(f"{d}/one.out", encoding="utf-8", errors="replace").read().split("\n")[:2]
assert len(turns) == 2 and all(len(t["token_ids"]) == 6 and not t["stopped"] for t in turns), turns
assert [t["answer"] for t in turns] == streamed, (turns, streamed)
print("tp chat --json: one line per turn, the same answers")
PY

# rank0_pid NRANKS JOB_PID: the pid of rank 0's tp process (the job itself at 1 rank;
# under tprun, the process whose environment says OMPI_COMM_WORLD_RANK=0).
rank0_pid() {
  if [ "$1" = 1 ]; then echo "$2"; return; fi
  local pid
  for pid in $(pgrep -f "$tp chat" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then echo "$pid"; return; fi
  done
}

# wait_for PATTERN COUNT: until int.err has COUNT lines matching (10 s at most).
wait_for() {
  local i
  for i in $(seq 1 100); do
    [ "$(grep -c -- "$1" "$dir/int.err" || true)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# answers: how many answers int.out holds (each ends with a newline).
answers() { tr -cd '\n' <"$dir/int.out" | wc -c; }

# interrupt_turn N LINE WHAT [STREAMED]: sends LINE and SIGINT to rank 0 ($pid)
# once its prompt is shown (the flag is cleared before that) and, with STREAMED,
# once more than that many bytes of the answer have streamed, until the answer is
# interrupted: the N-th "[interrupted]". A greedy answer that ends by itself (EOS)
# before the signal lands is no failure: which prompt the random model sees
# depends on where the previous answer was cut, and some end within a few tokens
# (once in ~28 runs under load). Then the line is sent again, 5 times at most.
interrupt_turn() {
  local want=$1 line=$2 what=$3 streamed=${4:-0} try prompts before size i
  for try in 1 2 3 4 5; do
    prompts=$(grep -c "^\[prompt\] " "$dir/int.err" || true)
    before=$(answers)
    size=$(stat -c %s "$dir/int.out")
    echo "$line" >&3
    wait_for "^\[prompt\] " $((prompts + 1)) || { cat "$dir/int.err"; fail "no prompt for '$line' ($what)"; }
    for i in $(seq 1 300); do  # the answer streams (or has ended)
      [ "$(stat -c %s "$dir/int.out")" -gt $((size + streamed)) ] || [ "$(answers)" -gt "$before" ] && break
      sleep 0.1
    done
    kill -INT "$pid"
    for i in $(seq 1 100); do
      [ "$(grep -c "\[interrupted\]" "$dir/int.err" || true)" -ge "$want" ] && return 0
      [ "$(answers)" -gt "$before" ] && break  # ended, by itself or just now by the signal
      sleep 0.1
    done
    [ "$(grep -c "\[interrupted\]" "$dir/int.err" || true)" -ge "$want" ] && return 0
    [ "$(answers)" -gt "$before" ] || { cat "$dir/int.err"; fail "SIGINT did not stop the answer ($what)"; }
    echo "tp chat: the answer to '$line' ended before the signal ($what); asking again"
  done
  fail "5 answers in a row ended before SIGINT reached them ($what)"
}

# interrupt NRANKS: a long answer stopped by SIGINT, then a second one: the session goes on.
interrupt() {
  local n=$1 fifo=$dir/in.$1
  mkfifo "$fifo"
  local long=(chat --model "$dir/m" --max-new-tokens 100000 --show-prompt)
  if [ "$n" = 1 ]; then
    "$tp" "${long[@]}" <"$fifo" >"$dir/int.out" 2>"$dir/int.err" &
  else
    "$tprun" --nproc-per-node "$n" "$tp" "${long[@]}" <"$fifo" >"$dir/int.out" 2>"$dir/int.err" &
  fi
  local job=$!
  exec 3>"$fifo"
  pid=""
  local i
  for i in $(seq 1 300); do  # rank 0's process, once it has loaded the model
    [ -z "$pid" ] && pid=$(rank0_pid "$n" "$job")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || { cat "$dir/int.err"; fail "no rank 0 process found ($n ranks)"; }
  interrupt_turn 1 "tell me a long story" "$n ranks, first answer" 20  # mid-answer
  interrupt_turn 2 "and now?" "$n ranks, second answer"
  exec 3>&-  # EOF ends the session
  local rc=0
  timeout 120 tail --pid="$job" -f /dev/null || true
  wait "$job" || rc=$?
  [ "$rc" = 0 ] || { cat "$dir/int.err"; fail "tp chat exited with $rc after SIGINT ($n ranks)"; }
  grep -q 'user: and now?' "$dir/int.err" || fail "the second prompt is missing the second line ($n ranks)"
  rm -f "$fifo"
  echo "tp chat: SIGINT stopped the answer, the session answered the next line ($n ranks)"
}
interrupt 1
interrupt 2

rm "$dir/m/tokenizer_config.json"
set +e
printf 'hi\n' | "$tp" chat --model "$dir/m" >/dev/null 2>"$dir/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "has no chat template" "$dir/err.txt" || { echo "rc=$rc"; cat "$dir/err.txt"; fail "no-template error"; }
echo "tp chat: a folder without a chat template is an error naming it"
