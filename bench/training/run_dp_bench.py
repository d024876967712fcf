#!/usr/bin/env python3
"""Tensor parallel against data parallel on this machine's 2 cores: tp = 2 against
dp = 2 (dp_replicate 2, DDP-like) and dp_shard = 2 (ZeRO-like), 1 thread per rank,
the same global batch (2 blocks of seq 512 per step: tp = 2 runs both blocks on
both ranks, each dp rank one), bf16 compute with f32 master weights, AdamW.
Tokens/s of the global batch and the communication time per step (rank 0): for
tp, the time inside the tp group's collectives (all of it in the step's critical
path); for dp, the data-parallel communication the step waited for (what the
bucketed all-reduces / reduce-scatters did not hide behind the backward, plus the
all-gather of updated weights under dp_shard). Peak RSS and optimizer state per
rank come from the processes.

The full qwen3-0.6b preset does not fit dp = 2 here: one rank holding the whole
model, its gradients and AdamW state peaks at ~14 GB in f32 (17 GB with bf16
compute copies), and dp needs that on both ranks of a 24 GiB machine. So the
default model is the qwen3-0.6b preset cut to --layers 8 (its vocabulary, width,
heads and MLP unchanged); --model takes any other.

The machine is noisy, so runs come in PAIRS (tp = 2, then dp = 2 and dp_shard = 2,
at once; the order alternates between pairs), ratios are taken within a pair, and
the report gives the median (min-max) over the pairs.

  bench/training/run_dp_bench.py [--build build] [--model out/qwen3-0.6b-8l] [--pairs 3] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import run_json, setup, summary  # noqa: E402

LAYOUTS = {"tp2": ["--tp-size", "2"], "dp2": ["--dp-replicate-size", "2"], "dp_shard2": ["--dp-shard-size", "2"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b-8l")
    ap.add_argument("--layers", type=int, default=8, help="num_hidden_layers of the model written when absent")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warmup step)")
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()

    if not os.path.exists(os.path.join(a.model, "config.json")):
        subprocess.run([os.path.join(a.build, "src", "tp"), "make-model", "--arch", "qwen3", "--preset", "qwen3-0.6b",
                        "--layers", str(a.layers), "--out", a.model], check=True)
    bench, tprun, env = setup(a.build, "training/bench_training", a.model)
    common = ["--model", a.model, "--seq-len", "512", "--steps", str(a.steps), "--dtype", "bf16", "--skip-ceilings"]
    batch = {"tp2": "2", "dp2": "1", "dp_shard2": "1"}  # per dp rank: the same global batch of 2 blocks

    runs = []
    for i in range(a.pairs):
        order = list(LAYOUTS) if i % 2 == 0 else list(reversed(LAYOUTS))
        pair = {}
        for name in order:
            pair[name] = run_json([tprun, "--nproc-per-node", "2", bench] + common + ["--batch", batch[name]] +
                                  LAYOUTS[name], env)
        runs.append(pair)
        print(f"pair {i + 1}/{a.pairs}: " + " | ".join(
            f"{n} {pair[n]['step_s_median']:.2f} s/step, comm {comm(pair[n]):.3f} s" for n in LAYOUTS), file=sys.stderr)

    first = runs[0]
    print(f"{a.model} (global batch 2 x seq 512, bf16 compute, AdamW, 1 thread per rank), {a.pairs} pairs, "
          f"median (min-max):")
    for name in LAYOUTS:
        tok = [r[name]["tokens_per_s"] for r in runs]
        line = (f"{name}: {summary(tok, '{:.1f}')} tok/s, {summary([r[name]['step_s_median'] for r in runs], '{:.2f}')}"
                f" s/step, communication {summary([comm(r[name]) for r in runs], '{:.3f}')} s/step, peak RSS per rank "
                f"{max(first[name]['peak_rss_bytes_per_rank']) / (1 << 30):.2f} GiB, optimizer state per rank "
                f"{max(first[name]['optimizer_state_bytes_per_rank']) / (1 << 30):.2f} GiB")
        if name != "tp2":
            line += f"; tokens/s vs tp2 {summary([r[name]['tokens_per_s'] / r['tp2']['tokens_per_s'] for r in runs], '{:.2f}')}x"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


def comm(run):
    """Rank 0's communication per step: tp collectives plus data-parallel waits."""
    return run["tp_collective_s_median"] + run["dp_exposed_communication_s_median"]


if __name__ == "__main__":
    main()
