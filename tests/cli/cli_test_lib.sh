# Shared by the tp train / LoRA CLI tests (sourced; they set `dir` first).

fail() { echo "FAIL: $*"; exit 1; }

# expect RC "message part" -- command...: runs it, checks the exit code and that stderr holds the text.
expect() {
  local want=$1 text=$2
  shift 3
  set +e
  "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  local rc=$?
  set -e
  [ "$rc" -eq "$want" ] || { cat "$dir/err.txt"; fail "exit $rc, expected $want: $*"; }
  grep -qF -- "$text" "$dir/err.txt" || { cat "$dir/err.txt"; fail "no '$text' in the error of: $*"; }
}

# write_sentences FILE N: N short sentences over a 20-word vocabulary, in a learnable pattern.
write_sentences() {
  local words=(the cat sat on a mat and then it ran far away from home to see what lies beyond hills)
  for i in $(seq 1 "$2"); do
    echo "${words[$((i % 20))]} ${words[$((i * 7 % 20))]} ${words[$((i * 3 % 20))]}, ${words[$((i * 11 % 20))]} ${words[$((i * 13 % 20))]}."
  done >"$1"
}
