#!/usr/bin/env python3
"""Training benchmark: the qwen3-0.6b preset, seq 512, batch 1, bf16 compute with f32
master weights, AdamW; tokens/s per optimizer step at tp = 1 (1 thread) and tp = 2
(1 thread per rank), against PyTorch doing the same step in the same session.

The machine is noisy (memory bandwidth swings within minutes; its two cores differ
by up to ~10% in GEMM rate), so tp's numbers come from PAIRS: a tp = 1 process
pinned to one core, then at once a tp = 2 job, alternating the tp = 1 core; ratios
are taken within a pair and the report gives the median (min-max) over the pairs.
Each tp = 1 process measures the matmul rates right after its steps (bf16 and f32
GEMMs through ops::linear). PyTorch (bench/training/torch_train_step.py, Debian's
torch 1.13) runs its tp = 2 layout over gloo and its best single process (2 threads)
--torch-runs times each in the same session, after the pairs.

  bench/training/run_training_bench.py [--build build] [--model out/qwen3-0.6b] [--pairs 3] [--torch-steps 2]
                                       [--torch-runs 1] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import run_json, setup, summary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed tp steps per run (after one warmup step)")
    ap.add_argument("--torch-steps", type=int, default=2, help="timed PyTorch steps per run; 0 skips PyTorch")
    ap.add_argument("--torch-runs", type=int, default=1, help="PyTorch runs of each kind (medians reported)")
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()

    bench, tprun, env = setup(a.build, "training/bench_training", a.model)
    args = ["--model", a.model, "--seq-len", "512", "--batch", "1", "--steps", str(a.steps), "--dtype", "bf16"]
    cores = sorted(os.sched_getaffinity(0))

    pairs = []
    for i in range(a.pairs):
        core = cores[i % len(cores)]
        one = run_json(["taskset", "-c", str(core), bench] + args, env)
        two = run_json([tprun, "--nproc-per-node", "2", bench] + args + ["--skip-ceilings"], env)
        one["core"] = core
        pairs.append((one, two))
        print(f"pair {i + 1}/{a.pairs}: tp1 on core {core}: {one['step_s_median']:.2f} s/step | tp2: "
              f"{two['step_s_median']:.2f} s/step | bf16 / f32 matmul {one['bf16_matmul_gflops_same_run']:.0f} / "
              f"{one['f32_matmul_gflops_same_run']:.0f} GFLOP/s", file=sys.stderr)

    torch = {"tp2": [], "single": []}
    if a.torch_steps > 0:
        script = os.path.join(HERE, "torch_train_step.py")
        base = ["/usr/bin/python3", script, "--model", a.model, "--seq-len", "512", "--batch", "1",
                "--warmup", "1", "--steps", str(a.torch_steps)]
        torch_env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
        for _ in range(a.torch_runs):
            for name, extra in (("tp2", ["--tp", "2", "--threads", "1"]), ("single", ["--tp", "1", "--threads", "2"])):
                torch[name].append(run_json(base + extra, torch_env))
                print(f"PyTorch {name}: {torch[name][-1]['median_step_s']:.2f} s/step "
                      f"({torch[name][-1]['tokens_per_s']:.1f} tok/s)", file=sys.stderr)

    speedup = [o["step_s_median"] / t["step_s_median"] for o, t in pairs]
    share_bf16 = [o["matmul_gflops_per_rank"] / o["bf16_matmul_gflops_same_run"] for o, _ in pairs]
    share_f32 = [o["matmul_gflops_per_rank"] / o["f32_matmul_gflops_same_run"] for o, _ in pairs]
    rss = [max(t["peak_rss_bytes_per_rank"]) / o["peak_rss_bytes_per_rank"][0] for o, t in pairs]
    tok1 = [o["tokens_per_s"] for o, _ in pairs]
    tok2 = [t["tokens_per_s"] for _, t in pairs]
    print(f"over {a.pairs} pairs, median (min-max); qwen3-0.6b, seq 512, batch 1, bf16 compute, f32 masters, AdamW:")
    print(f"tp1 {summary(tok1, '{:.1f}')} tok/s, tp2 {summary(tok2, '{:.1f}')} tok/s; "
          f"tp2 / tp1 speedup {summary(speedup, '{:.2f}')}x (target >= 1.8)")
    print(f"tp1 matmul rate (6 x Linear params x tokens + attention) {summary(share_bf16, '{:.0%}')} of the same "
          f"run's bf16 matmul rate (target >= 50%), {summary(share_f32, '{:.0%}')} of its f32 matmul rate")
    print(f"peak RSS per rank tp2 / tp1 {summary(rss, '{:.2f}')} (target <= 0.6)")
    if torch["tp2"]:
        t2 = statistics.median([r["tokens_per_s"] for r in torch["tp2"]])
        t1 = statistics.median([r["tokens_per_s"] for r in torch["single"]])
        print(f"PyTorch {torch['tp2'][0].get('torch', '')} ({a.torch_runs} run(s) each, medians): tp2 {t2:.1f} tok/s, "
              f"one process with 2 threads {t1:.1f} tok/s; tp's tp2 is {statistics.median(tok2) / t2:.2f}x "
              f"PyTorch's tp2 (target >= 2.5) and {statistics.median(tok2) / t1:.2f}x its single process (target >= 2)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"pairs": [{"tp1": o, "tp2": t} for o, t in pairs], "torch": torch}, f, indent=1)


if __name__ == "__main__":
    main()
