#!/usr/bin/env python3
"""Issue-28 benchmark: the qwen3-0.6b preset (or --model: any checkpoint, e.g. the qwen3-30b-a3b 2-layer cut, whose
experts tp quantize quantizes too) with bf16 weights, and the same weights as tp quantize writes them in GPTQ
8-bit and 4-bit (groups of 128; the embeddings and routers stay bf16, and lm_head too except in the -lm-head
variants), batch 1, prefill 512 and decode 64 tokens, at tp = 1 (1 thread) and tp = 2 (1 thread per rank).

Rounds, as run_inference_bench.py's pairs: each round runs the three checkpoints at tp = 1 (pinned to one core,
alternating between rounds) and then at tp = 2, back to back, so that every ratio against bf16 is taken within a
round whose memory bandwidth was about the same; the report gives the median (min-max) over the rounds. Each tp = 1
run measures the machine's ceilings right after itself (bench_inference: the bf16 matmul rate, the read
bandwidth, and a short read pass around each 16-token decode chunk). Bytes read per token are what the ranks
hold of the Linears (bf16: 2 a weight; quantized: codes, f16 scales and zero points as ops::QuantizedLinear
holds them), from bench_inference's weight_bytes_rank0; decode also reads the KV cache (the mean over the decode
steps of every layer's cached keys and values, kv_cache_bytes_per_decode_token_rank0), reported with them as a
second share of the read bandwidth. After each checkpoint's pair, bench/distributed/bench_sync_stream reads the
same token's bytes (its layers' weights and KV cache in 2 pieces a layer, then lm_head) as plain read passes with
tp's collectives between the pieces, at tp = 1 and 2: the tp2/tp1 that a decode made of nothing but its reads and
collectives reaches in that round, beside the model's (and the same passes without the collectives: the bus alone).

  bench/models/run_quant_bench.py [--build build] [--model out/qwen3-0.6b] [--rounds 3] [--chart PNG] [--json F]
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import draw_lines, inference_arguments, run_json, setup, summary  # noqa: E402

# -lm-head: lm_head quantized too (tp quantize --lm-head; GPTQModel's lm_head true): a small model's largest Linear.
VARIANTS = [("bf16", None), ("int8", ["--bits", "8"]), ("int4-g128", ["--bits", "4"]),
            ("int8-lm-head", ["--bits", "8", "--lm-head"]), ("int4-g128-lm-head", ["--bits", "4", "--lm-head"])]


def quantized_checkpoint(build, model, name, flags):
    """`model` quantized by tp quantize into `model`-`name` (written once)."""
    out = f"{model.rstrip('/')}-{name}"
    if not os.path.exists(os.path.join(out, "config.json")):
        tp = os.path.join(build, "src", "tp")
        subprocess.run([tp, "quantize", "--model", model, "--out", out, "--format", "gptq", "--group-size", "128"]
                       + flags, check=True)
    return out


def ceiling_ratio(run):
    """tp2 / tp1 of bench_sync_stream's token (the variant's bytes as read passes, tp's collectives between them)."""
    return run["read_passes"]["tp2"]["tokens_per_s_synced"] / run["read_passes"]["tp1"]["tokens_per_s_synced"]


def main():
    ap = inference_arguments(__doc__, "out/qwen3-0.6b", 3, 64)
    ap.set_defaults(pairs=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chart", help="a PNG of decode tokens/s by tp size and weight format")
    ap.add_argument("--json", help="also write every run's numbers here")
    a = ap.parse_args()

    bench, tprun, env = setup(a.build, "models/bench_inference", a.model)
    models = {name: a.model if flags is None else quantized_checkpoint(a.build, a.model, name, flags)
              for name, flags in VARIANTS}
    sync_stream = os.path.join(a.build, "bench", "distributed", "bench_sync_stream")
    with open(os.path.join(a.model, "config.json")) as f:
        layers = json.load(f)["num_hidden_layers"]  # 2 all-reduces a layer (attention's and the MLP's)
    cores = sorted(os.sched_getaffinity(0))
    rounds = []
    for i in range(a.rounds):
        core = cores[i % len(cores)]
        runs = {}
        for name, _ in VARIANTS:
            args = ["--model", models[name], "--reps", "1", "--prefill", str(a.prefill), "--decode", str(a.decode)]
            one = run_json(["taskset", "-c", str(core), bench] + args, env)
            two = run_json([tprun, "--nproc-per-node", "2", bench] + args + ["--skip-ceilings"], env)
            # The same token's bytes as plain read passes with tp's collectives: what tp2/tp1 could reach this round.
            token = ["--mb", str((one["weight_bytes_rank0"] - one["lm_head_bytes_rank0"]
                                  + one["kv_cache_bytes_per_decode_token_rank0"]) / 1e6),
                     "--head-mb", str(one["lm_head_bytes_rank0"] / 1e6), "--segments", str(2 * layers)]
            ceiling = {"tp1": run_json(["taskset", "-c", str(core), sync_stream] + token, env),
                       "tp2": run_json([tprun, "--nproc-per-node", "2", sync_stream] + token, env)}
            runs[name] = {"tp1": one, "tp2": two, "read_passes": ceiling}
            print(f"round {i + 1}/{a.rounds} {name}: tp1 on core {core}: prefill {one['prefill_s_median']:.3f} s, "
                  f"decode {one['decode_tokens_per_s']:.1f} tok/s | tp2: prefill {two['prefill_s_median']:.3f} s, "
                  f"decode {two['decode_tokens_per_s']:.1f} tok/s | read passes: tp2/tp1 "
                  f"{ceiling_ratio(runs[name]):.2f}", file=sys.stderr)
        rounds.append(runs)

    def each(f):
        return [f(r) for r in rounds]

    shape = os.path.basename(a.model.rstrip("/"))
    print(f"{shape}, prefill {a.prefill} + decode {a.decode}, over {a.rounds} rounds, median (min-max):")
    for name, _ in VARIANTS:
        one = each(lambda r: r[name]["tp1"])
        bytes_tp1 = one[0]["weight_bytes_rank0"]
        bytes_tp2 = rounds[0][name]["tp2"]["weight_bytes_rank0"]
        print(f"{name}: weight bytes read per token {bytes_tp1 / 1e6:.0f} MB at tp1, {bytes_tp2 / 1e6:.0f} MB a rank at tp2")
        print(f"  tp1 decode {summary([o['decode_tokens_per_s'] for o in one], '{:.1f}')} tok/s, "
              f"{summary(each(lambda r: r[name]['tp1']['decode_tokens_per_s'] / r['bf16']['tp1']['decode_tokens_per_s']), '{:.2f}')}x bf16's; "
              f"weights read at {summary([o['decode_weight_read_share_by_chunk_median'] for o in one], '{:.0%}')} of the "
              f"read bandwidth around each chunk ({summary([o['read_bandwidth_gbs_same_run'] for o in one], '{:.1f}')} GB/s "
              f"after the run); with the KV cache's {one[0]['kv_cache_bytes_per_decode_token_rank0'] / 1e6:.0f} MB a "
              f"token, {summary([o['decode_weight_and_kv_read_share_by_chunk_median'] for o in one], '{:.0%}')}")
        print(f"  tp1 prefill {summary([o['prefill_tokens_per_s'] for o in one], '{:.0f}')} tok/s, "
              f"{summary(each(lambda r: r['bf16']['tp1']['prefill_s_median'] / r[name]['tp1']['prefill_s_median']), '{:.2f}')}x "
              f"bf16's rate ({summary([o['prefill_matmul_gflops_per_rank'] for o in one], '{:.0f}')} GFLOP/s; bf16 matmul "
              f"{summary([o['bf16_matmul_gflops_same_run'] for o in one], '{:.0f}')})")
        print(f"  tp2 / tp1: decode {summary(each(lambda r: r[name]['tp2']['decode_tokens_per_s'] / r[name]['tp1']['decode_tokens_per_s']), '{:.2f}')}x, "
              f"prefill {summary(each(lambda r: r[name]['tp1']['prefill_s_median'] / r[name]['tp2']['prefill_s_median']), '{:.2f}')}x; "
              f"its bytes as read passes with tp's collectives {summary(each(lambda r: ceiling_ratio(r[name])), '{:.2f}')}x "
              f"(without them {summary(each(lambda r: r[name]['read_passes']['tp2']['tokens_per_s_unsynced'] / r[name]['read_passes']['tp1']['tokens_per_s_unsynced']), '{:.2f}')}x); "
              f"peak RSS a rank {max(rounds[0][name]['tp2']['peak_rss_bytes_per_rank']) / 2**30:.2f} GiB "
              f"(tp1 {one[0]['peak_rss_bytes_per_rank'][0] / 2**30:.2f})")
        same = all(r[name]["tp1"]["tokens"] == r[name]["tp2"]["tokens"] for r in rounds)
        print(f"  greedy tokens tp1 == tp2: {same}")
    if a.chart:
        import statistics
        series = [(name, [(tp, statistics.median(each(lambda r: r[name][f"tp{tp}"]["decode_tokens_per_s"])))
                          for tp in (1, 2)], "linespoints") for name, _ in VARIANTS]
        if draw_lines(a.chart, f"{shape} decode (batch 1, after {a.prefill} tokens): tokens/s by weight format",
                      "ranks (tp size)", "tokens/s", series):
            print(f"chart: {a.chart}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rounds, f, indent=1)


if __name__ == "__main__":
    main()
