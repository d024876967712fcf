#!/usr/bin/env python3
"""Issue-13 benchmark: a Qwen3-30B-A3B-shaped MoE (128 experts, top-8, bf16) cut to a
few layers, batch 1, prefill 512 and decode D tokens on 1 rank, at ep = 2 (token
dispatch, tp 1) and at tp = 2 (each expert cut in two), 1 thread per rank.

As run_inference_bench.py: PAIRS of runs taken back to back (a 1-rank process pinned to
alternating cores, then the ep = 2 job, then the tp = 2 job), every ratio within its
pair, medians (min-max) over the pairs. A decode step must read the active parameters:
every non-expert weight, the routers, and the 8 routed experts of each sparse layer
(bench_inference's active_weight_bytes_per_token); the 1-rank decode rate in bytes of
those per second is compared with the read bandwidth measured in the same process, chunk
by chunk. Communication per token comes from ProcessGroup::collective_seconds() of each
group, waiting for the slower rank included: the ep group's (token dispatch: two all-to-alls
per sparse layer and the all-reduce that puts the ranks' token chunks back together) and the
tp group's (all-reduces, and lm_head's all-gather).

  tp make-model --arch qwen3_moe --preset qwen3-30b-a3b --layers 2 --dtype bf16 --out out/qwen3-30b-a3b-2l
  bench/models/run_moe_bench.py [--build build] [--model out/qwen3-30b-a3b-2l] [--pairs 3]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import inference_arguments, run_json, setup, summary  # noqa: E402


def main():
    a = inference_arguments(__doc__, "out/qwen3-30b-a3b-2l", 3, 64).parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        raise SystemExit(f"{a.model}: no model; write it first (see --help)")
    bench, tprun, env = setup(a.build, "models/bench_inference", a.model)
    args = ["--model", a.model, "--reps", "1", "--prefill", str(a.prefill), "--decode", str(a.decode)]
    cores = sorted(os.sched_getaffinity(0))
    runs = []
    for i in range(a.pairs):
        core = cores[i % len(cores)]
        one = run_json(["taskset", "-c", str(core), bench] + args, env)
        ep2 = run_json([tprun, "--nproc-per-node", "2", bench] + args + ["--ep-size", "2", "--tp-size", "1",
                                                                         "--skip-ceilings"], env)
        tp2 = run_json([tprun, "--nproc-per-node", "2", bench] + args + ["--skip-ceilings"], env)
        runs.append((one, ep2, tp2))
        print(f"run {i + 1}/{a.pairs}: 1 rank (core {core}) prefill {one['prefill_s_median']:.2f} s decode "
              f"{one['decode_tokens_per_s']:.2f} tok/s | ep2 {ep2['prefill_s_median']:.2f} s "
              f"{ep2['decode_tokens_per_s']:.2f} tok/s | tp2 {tp2['prefill_s_median']:.2f} s "
              f"{tp2['decode_tokens_per_s']:.2f} tok/s", file=sys.stderr)

    one0 = runs[0][0]
    active = one0["active_weight_bytes_per_token"]
    print(f"model {a.model}: active weight bytes per token {active / 1e6:.1f} MB of "
          f"{one0['expert_weight_bytes_all'] / 1e6:.0f} MB of experts; 1 rank reads "
          f"{one0['weight_bytes_rank0'] / 1e6:.1f} MB per decode token")
    share = [o["decode_weight_read_share_by_chunk_median"] for o, _, _ in runs]
    print(f"1 rank decode: {summary([o['decode_tokens_per_s'] for o, _, _ in runs], '{:.2f}')} tok/s, the active "
          f"bytes at {summary(share, '{:.0%}')} of the read bandwidth of the same moments "
          f"({summary([o['read_bandwidth_gbs_same_run'] for o, _, _ in runs], '{:.1f}')} GB/s after the run)")
    for name, k in (("ep2", 1), ("tp2", 2)):
        dec = [r[0]["decode_s_median"] / r[k]["decode_s_median"] for r in runs]
        pre = [r[0]["prefill_s_median"] / r[k]["prefill_s_median"] for r in runs]
        print(f"{name}: decode speed-up {summary(dec, '{:.2f}')}x, prefill-{a.prefill} speed-up "
              f"{summary(pre, '{:.2f}')}x; per token: decode ep group (all-to-alls + chunk all-reduce) "
              f"{summary([r[k]['decode_ep_collective_s_per_token'] * 1e3 for r in runs], '{:.2f}')} ms, tp group "
              f"(all-reduces + lm_head gather) "
              f"{summary([r[k]['decode_tp_collective_s_per_token'] * 1e3 for r in runs], '{:.2f}')} ms; prefill "
              f"ep group {summary([r[k]['prefill_ep_collective_s_per_token'] * 1e3 for r in runs], '{:.3f}')} ms, "
              f"tp group {summary([r[k]['prefill_tp_collective_s_per_token'] * 1e3 for r in runs], '{:.3f}')} ms; "
              f"rank 0 reads {runs[0][k]['weight_bytes_rank0'] / 1e6:.0f} MB per decode token")


if __name__ == "__main__":
    main()
