#!/usr/bin/env python3
"""Issue-6 benchmark: qwen3-0.6b preset (bf16 weights), batch 1, prefill 512 and
decode 128 tokens at tp = 1 (1 thread) and tp = 2 (1 thread per rank).

This machine is noisy on the scale of seconds (its memory bandwidth swings by 2x
with the neighbours' load) and its two cores differ (one runs GEMMs ~10% slower),
so one tp = 1 run against one tp = 2 run says little. Instead it runs PAIRS: a
tp = 1 process, then at once a tp = 2 job, alternating the core the tp = 1 process
is pinned to (as an unpinned process lands on either). Every ratio is taken within
a pair, and the report gives the median (min-max) over the pairs. Each tp = 1
process measures its ceilings (bf16 matmul rate, read bandwidth) right after its
own run, and decode is also compared chunk by chunk (16 tokens) with a short read
pass right before and after each chunk, since the bandwidth drifts within seconds;
the tp = 2 job measures the read bandwidth each rank gets while both read.

  bench/models/run_inference_bench.py [--build build] [--model out/qwen3-0.6b] [--pairs 6]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import inference_arguments, run_json, setup, summary  # noqa: E402



def main():
    ap = inference_arguments(__doc__, "out/qwen3-0.6b", 6, 128)
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()

    bench, tprun, env = setup(a.build, "models/bench_inference", a.model)
    args = ["--model", a.model, "--reps", "1", "--prefill", str(a.prefill), "--decode", str(a.decode)]
    cores = sorted(os.sched_getaffinity(0))

    pairs = []
    for i in range(a.pairs):
        core = cores[i % len(cores)]
        one = run_json(["taskset", "-c", str(core), bench] + args, env)
        two = run_json([tprun, "--nproc-per-node", "2", bench] + args, env)
        one["core"] = core
        pairs.append((one, two))
        print(f"pair {i + 1}/{a.pairs}: tp1 on core {core}: prefill {one['prefill_s_median']:.3f} s, decode "
              f"{one['decode_s_median']:.2f} s | tp2: prefill {two['prefill_s_median']:.3f} s, decode "
              f"{two['decode_s_median']:.2f} s", file=sys.stderr)

    speedup = [o["prefill_s_median"] / t["prefill_s_median"] for o, t in pairs]
    matmul_share = [o["prefill_matmul_gflops_per_rank"] / o["bf16_matmul_gflops_same_run"] for o, _ in pairs]
    onednn_share = [o["prefill_matmul_gflops_per_rank"] / o["bf16_onednn_matmul_gflops_same_run"] for o, _ in pairs]
    decode_share = [o["decode_weight_read_share_by_chunk_median"] for o, _ in pairs]
    decode_share_after = [o["decode_weight_read_gbs_rank0"] / o["read_bandwidth_gbs_same_run"] for o, _ in pairs]
    decode_speedup = [o["decode_s_median"] / t["decode_s_median"] for o, t in pairs]
    decode_share2 = [t["decode_weight_read_share_by_chunk_median"] for _, t in pairs]
    rss = [max(t["peak_rss_bytes_per_rank"]) / o["peak_rss_bytes_per_rank"][0] for o, t in pairs]
    for c in cores:
        on_c = [o["prefill_s_median"] for o, _ in pairs if o["core"] == c]
        if on_c:
            print(f"tp1 prefill on core {c}: {summary(on_c, '{:.3f}')} s; bf16 matmul there "
                  f"{summary([o['bf16_matmul_gflops_same_run'] for o, _ in pairs if o['core'] == c], '{:.0f}')} GFLOP/s")
    print(f"over {a.pairs} pairs, median (min-max):")
    print(f"prefill {a.prefill} tokens: tp2 / tp1 speedup {summary(speedup, '{:.2f}')}x (target >= 1.9)")
    print(f"tp1 prefill matmul rate (linear + attention FLOPs) {summary(matmul_share, '{:.0%}')} of tp's bf16 matmul "
          f"rate (target >= 85%), {summary(onednn_share, '{:.0%}')} of oneDNN's own bf16 kernel's "
          f"({summary([o['bf16_matmul_gflops_same_run'] for o, _ in pairs], '{:.0f}')} and "
          f"{summary([o['bf16_onednn_matmul_gflops_same_run'] for o, _ in pairs], '{:.0f}')} GFLOP/s)")
    print(f"decode {a.decode} tokens: tp1 reads weights at {summary(decode_share, '{:.0%}')} of the read bandwidth "
          f"measured around each 16-token chunk (target >= 85%); {summary(decode_share_after, '{:.0%}')} of the "
          f"1 GiB bandwidth measured after the run; tp1 {summary([o['decode_tokens_per_s'] for o, _ in pairs], '{:.1f}')} tok/s")
    print(f"decode tp2 / tp1 speedup {summary(decode_speedup, '{:.2f}')}x (target >= 1.8); each tp2 rank reads weights at "
          f"{summary(decode_share2, '{:.0%}')} of what it gets while both read, around each chunk "
          f"({summary([t['read_bandwidth_gbs_same_run'] for _, t in pairs], '{:.1f}')} GB/s per rank, vs "
          f"{summary([o['read_bandwidth_gbs_same_run'] for o, _ in pairs], '{:.1f}')} GB/s alone)")
    print(f"peak RSS per rank tp2 / tp1 {summary(rss, '{:.2f}')} (target <= 0.6)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"tp1": o, "tp2": t} for o, t in pairs], f, indent=1)


if __name__ == "__main__":
    main()
