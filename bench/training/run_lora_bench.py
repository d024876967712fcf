#!/usr/bin/env python3
"""LoRA against full fine-tuning: the qwen3-0.6b preset, seq 512, batch 1, bf16
compute (f32 master weights), AdamW; a LoRA adapter of rank 16 (alpha 32) on every
attention and MLP projection against training the whole model, at tp = 1 (1 thread)
and tp = 2 (1 thread per rank). Step time, peak RSS per rank, and the optimizer
state and gradient bytes each rank holds (reported by the process).

The machine is noisy, so the runs come in PAIRS (full fine-tuning, then LoRA, at once,
at the same tp size) and ratios are taken within a pair; the report gives the
median (min-max) over the pairs.

  bench/training/run_lora_bench.py [--build build] [--model out/qwen3-0.6b] [--pairs 2] [--json FILE]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import run_json, setup, summary  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (after one warmup step)")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()

    bench, tprun, env = setup(a.build, "training/bench_training", a.model)
    args = ["--model", a.model, "--seq-len", "512", "--batch", "1", "--steps", str(a.steps), "--dtype", "bf16",
            "--skip-ceilings"]
    launch = {1: ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0])], 2: [tprun, "--nproc-per-node", "2"]}

    runs = {1: [], 2: []}
    for i in range(a.pairs):
        for size in (1, 2):
            full = run_json(launch[size] + [bench] + args, env)
            lora = run_json(launch[size] + [bench] + args + ["--lora-r", str(a.lora_r)], env)
            runs[size].append((full, lora))
            print(f"pair {i + 1}/{a.pairs} tp{size}: full {full['step_s_median']:.2f} s/step, "
                  f"LoRA {lora['step_s_median']:.2f} s/step", file=sys.stderr)

    print(f"qwen3-0.6b, seq 512, batch 1, bf16 compute, AdamW; LoRA r {a.lora_r} on q,k,v,o,gate,up,down; "
          f"{a.pairs} pairs, median (min-max):")
    for size in (1, 2):
        pairs = runs[size]
        f0, l0 = pairs[0]
        time_ratio = [lo["step_s_median"] / fu["step_s_median"] for fu, lo in pairs]
        rss_ratio = [max(lo["peak_rss_bytes_per_rank"]) / max(fu["peak_rss_bytes_per_rank"]) for fu, lo in pairs]
        gib = 1 << 30
        print(f"tp{size}: step full {summary([fu['step_s_median'] for fu, _ in pairs], '{:.2f}')} s, LoRA "
              f"{summary([lo['step_s_median'] for _, lo in pairs], '{:.2f}')} s (LoRA / full "
              f"{summary(time_ratio, '{:.2f}')}); peak RSS per rank full "
              f"{max(f0['peak_rss_bytes_per_rank']) / gib:.2f} GiB, LoRA {max(l0['peak_rss_bytes_per_rank']) / gib:.2f} "
              f"GiB (LoRA / full {summary(rss_ratio, '{:.2f}')}); trainable parameters {f0['trainable_parameters']} vs "
              f"{l0['trainable_parameters']}; optimizer state per rank {max(f0['optimizer_state_bytes_per_rank']) / gib:.2f} "
              f"GiB vs {max(l0['optimizer_state_bytes_per_rank']) / (1 << 20):.1f} MiB; gradients "
              f"{f0['gradient_bytes_per_rank'] / gib:.2f} GiB vs {l0['gradient_bytes_per_rank'] / (1 << 20):.1f} MiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(k): [{"full": fu, "lora": lo} for fu, lo in v] for k, v in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
