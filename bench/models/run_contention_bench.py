#!/usr/bin/env python3
"""Decode on a busy machine (issue 31 item 6): the qwen3-0.6b preset (bf16), batch 1,
greedy decode, with and without one competing busy process on the 2 cores.

The competitor is what a user's other job would be: another bench_inference
decoding on 1 thread without end (it reads memory and keeps one core busy). Each
round measures, in an order that alternates between rounds:
  quiet: tp=1 (1 thread), tp=2 (1 thread per rank);
  busy:  tp=1 (1 thread), tp=1 (2 threads), tp=2 (1 thread per rank), the
         competitor started before each run and killed after it.
The figures are medians (min-max) over the rounds of decode tokens/s and of the
per-round ratios; the target: busy tp=2 >= 1.2x busy tp=1 (1 thread), whose
ranks have 4/3 of a core between them against its 1, and the quiet tp=2 / tp=1
ratio unchanged.

  bench/models/run_contention_bench.py [--build build] [--model out/qwen3-0.6b] [--rounds 3] [--json FILE]
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import inference_arguments, run_json, setup, summary  # noqa: E402


def main():
    ap = inference_arguments(__doc__, "out/qwen3-0.6b", 3, 64)
    ap.set_defaults(prefill=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()
    bench, tprun, env = setup(a.build, "models/bench_inference", a.model)
    args = ["--model", a.model, "--reps", "1", "--prefill", str(a.prefill), "--decode", str(a.decode),
            "--warmup-decode", "8", "--skip-ceilings"]
    runs = {
        "tp1": lambda: run_json([bench] + args, env),
        "tp1_2threads": lambda: run_json([bench] + args, dict(env, OMP_NUM_THREADS="2")),
        "tp2": lambda: run_json([tprun, "--nproc-per-node", "2", bench] + args, env),
    }

    def busy(run):
        competitor = subprocess.Popen([bench, "--model", a.model, "--reps", "1000", "--prefill", "16", "--decode",
                                       "100000", "--skip-ceilings"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(5)  # loaded and decoding
        try:
            return run()
        finally:
            os.killpg(competitor.pid, signal.SIGKILL)
            competitor.wait()

    rounds = []
    for r in range(a.rounds):
        order = ["tp1", "tp2"] if r % 2 == 0 else ["tp2", "tp1"]
        busy_order = ["tp1", "tp1_2threads", "tp2"] if r % 2 == 0 else ["tp2", "tp1_2threads", "tp1"]
        got = {}
        for name in order:
            got["quiet_" + name] = runs[name]()
        for name in busy_order:
            got["busy_" + name] = busy(runs[name])
        rate = {k: v["decode_tokens_per_s"] for k, v in got.items()}
        rounds.append({"rates": rate, "runs": got})
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {v:.2f}" for k, v in rate.items()) + " tok/s",
              file=sys.stderr)

    def med(key):
        return summary([x["rates"][key] for x in rounds], "{:.2f}")

    def ratio(num, den):
        return summary([x["rates"][num] / x["rates"][den] for x in rounds], "{:.2f}")

    print(f"decode tokens/s over {a.rounds} rounds, median (min-max):")
    for key in ["quiet_tp1", "quiet_tp2", "busy_tp1", "busy_tp1_2threads", "busy_tp2"]:
        print(f"  {key}: {med(key)}")
    print(f"quiet tp2 / tp1: {ratio('quiet_tp2', 'quiet_tp1')}")
    print(f"busy tp2 / busy tp1 (1 thread): {ratio('busy_tp2', 'busy_tp1')} (target >= 1.2)")
    print(f"busy tp1 2 threads / busy tp1: {ratio('busy_tp1_2threads', 'busy_tp1')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rounds, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
