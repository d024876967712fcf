#!/usr/bin/env python3
"""Training memory benchmark: peak memory per rank against sequence length for
gradient checkpointing off / selective / full at tp = 1 and 2 (the qwen3-0.6b preset,
batch 1, bf16 compute with f32 masters, AdamW), with PyTorch's peak for the same step
(bench/training/torch_train_step.py, no checkpointing) in the same run at 512 and 1024
tokens, each policy's step time against the step without checkpointing, and what
--estimate-memory predicted for every point. Draws the chart (gnuplot, like the loss
curve) and prints the issue's targets.

Peaks per rank: the allocator's high-water mark of a step (every tensor byte, state
included) and the resident set. A point whose prediction does not fit in the
machine's memory is not run (it is reported with its prediction).

  bench/training/run_memory_bench.py [--build build] [--model out/qwen3-0.6b] [--seqs 512,1024,2048,4096,8192]
                                     [--tp 1,2] [--max-seq-tp1 1024] [--full-only-above 4096] [--torch-seqs 512,1024] [--png bench/results/training_memory.png]
                                     [--json FILE] [--from-json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import draw_lines, run_json, setup  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 2 ** 30
POLICIES = ["off", "selective", "full"]


def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def bench_point(bench, tprun, env, model, tp, seq, policy):
    # Long steps: one timed step, after a warmup only up to 2048 tokens (beyond, the one step pays its first
    # page faults too: its time is an upper bound).
    steps = "2" if seq <= 1024 else "1"
    warmup = "1" if seq <= 2048 else "0"
    cmd = [bench, "--model", model, "--seq-len", str(seq), "--batch", "1", "--steps", steps, "--warmup", warmup,
           "--dtype", "bf16", "--skip-ceilings", "--gradient-checkpointing", policy]
    if tp > 1:
        cmd = [tprun, "--nproc-per-node", str(tp)] + cmd
    return run_json(cmd, env)


def predicted(tp_binary, model, tp, seq, policy, env):
    """--estimate-memory's prediction (bytes per rank) for the point, from config.json alone."""
    cmd = [tp_binary, "train", "--model", model, "--dtype", "bf16", "--batch-size", "1",
           "--seq-len", str(seq), "--tp-size", str(tp), "--estimate-memory", "--json"]
    if policy != "off":
        cmd += ["--gradient-checkpointing", "--gradient-checkpointing-kwargs", json.dumps({"policy": policy})]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["total_bytes"]


def draw(points, torch_points, png):
    series = []
    for tp in sorted({p["tp"] for p in points}):
        for policy in POLICIES:
            rows = sorted((p["seq"], p["peak_tensor_gib"]) for p in points if p["tp"] == tp and p["policy"] == policy
                          and p.get("peak_tensor_gib"))
            if rows:
                series.append((f"tp {tp}, checkpointing {policy}", rows, "linespoints"))
    for tp in sorted({p["tp"] for p in torch_points}):
        rows = sorted((p["seq"], p["peak_rss_gib"]) for p in torch_points if p["tp"] == tp)
        series.append((f"PyTorch tp {tp} (no checkpointing, resident set)", rows, "points pt 7 ps 1.5"))
    return draw_lines(png, "tp train: peak memory per rank, Qwen3-0.6B preset, batch 1, bf16 compute, AdamW",
                      "sequence length (tokens)", "GiB per rank", series)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--max-seq-tp1", type=int, default=1024, help="tp = 1 runs up to this length (its steps are long)")
    ap.add_argument("--full-only-above", type=int, default=4096,
                    help="longer sequences run with full checkpointing only (the target's; the others take long)")
    ap.add_argument("--torch-seqs", default="512,1024", help="PyTorch's peak at these lengths (tp 2); '' skips it")
    ap.add_argument("--png", default=os.path.join(HERE, "..", "results", "training_memory.png"))
    ap.add_argument("--json", help="also write every run's numbers here")
    ap.add_argument("--from-json", help="report and draw what an earlier run wrote with --json (runs nothing)")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            saved = json.load(f)
        report(saved["points"], saved["torch"], a)
        return

    bench, tprun, env = setup(a.build, "training/bench_training", a.model)
    tp_binary = os.path.join(a.build, "src", "tp")
    seqs = [int(s) for s in a.seqs.split(",") if s]
    tps = [int(t) for t in a.tp.split(",") if t]
    points = []
    for tp in tps:
        for seq in seqs:
            if tp == 1 and seq > a.max_seq_tp1:
                continue
            for policy in POLICIES:
                if seq > a.full_only_above and policy != "full":
                    continue
                p = {"tp": tp, "seq": seq, "policy": policy}
                p["predicted_gib"] = predicted(tp_binary, a.model, tp, seq, policy, env) / GIB
                # The resident set holds the allocator's cached blocks and the libraries too.
                need = (p["predicted_gib"] * 1.1 + 0.5) * GIB * tp
                if need > available_bytes():
                    p["skipped"] = f"predicted {p['predicted_gib']:.1f} GiB per rank does not fit"
                    print(f"tp {tp} seq {seq} {policy}: {p['skipped']}", file=sys.stderr)
                    points.append(p)
                    continue
                r = bench_point(bench, tprun, env, a.model, tp, seq, policy)
                p["peak_tensor_gib"] = max(r["peak_tensor_bytes_per_rank"]) / GIB
                p["peak_rss_gib"] = max(r["peak_rss_bytes_per_rank"]) / GIB
                p["both_ranks_rss_gib"] = sum(r["peak_rss_bytes_per_rank"]) / GIB
                p["step_s"] = r["step_s_median"]
                p["losses"] = r["losses"]
                points.append(p)
                print(f"tp {tp} seq {seq} {policy}: peak {p['peak_tensor_gib']:.2f} GiB tensors, "
                      f"{p['peak_rss_gib']:.2f} GiB resident per rank (predicted {p['predicted_gib']:.2f}), "
                      f"{p['step_s']:.1f} s/step", file=sys.stderr)
    torch_points = []
    for seq in [int(s) for s in a.torch_seqs.split(",") if s]:
        cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_train_step.py"), "--model", a.model, "--seq-len",
               str(seq), "--batch", "1", "--warmup", "1", "--steps", "1", "--tp", "2", "--threads", "1"]
        r = run_json(cmd, env)
        torch_points.append({"tp": 2, "seq": seq, "peak_rss_gib": max(r["peak_rss_mb_per_rank"]) / 1024,
                             "step_s": r["median_step_s"]})
        print(f"PyTorch tp 2 seq {seq}: peak {torch_points[-1]['peak_rss_gib']:.2f} GiB resident per rank, "
              f"{r['median_step_s']:.1f} s/step", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"points": points, "torch": torch_points}, f, indent=1)
    report(points, torch_points, a)


def report(points, torch_points, a):
    """The table, the targets and the chart."""
    tps = sorted({p["tp"] for p in points})
    seqs = sorted({p["seq"] for p in points})

    def point(tp, seq, policy):
        return next((p for p in points if p["tp"] == tp and p["seq"] == seq and p["policy"] == policy), None)

    print("tp  seq   policy     tensors GiB  resident GiB  predicted GiB  (pred/meas)  s/step  (x off)")
    for p in points:
        if "skipped" in p:
            print(f"{p['tp']:<3} {p['seq']:<5} {p['policy']:<10} {p['skipped']}")
            continue
        off = point(p["tp"], p["seq"], "off")
        cost = f"{p['step_s'] / off['step_s']:.2f}" if off and "step_s" in off else "-"
        print(f"{p['tp']:<3} {p['seq']:<5} {p['policy']:<10} {p['peak_tensor_gib']:>11.2f}  {p['peak_rss_gib']:>12.2f}  "
              f"{p['predicted_gib']:>13.2f}  ({p['predicted_gib'] / p['peak_tensor_gib']:.3f})      "
              f"{p['step_s']:>6.1f}  ({cost})")
    for t in torch_points:
        ours = {pol: point(2, t["seq"], pol) for pol in POLICIES}
        ratios = ", ".join(f"{pol} {o['peak_rss_gib'] / t['peak_rss_gib']:.2f}x" for pol, o in ours.items()
                           if o and "peak_rss_gib" in o)
        print(f"seq {t['seq']}, tp 2: PyTorch's peak {t['peak_rss_gib']:.2f} GiB resident per rank; tp's resident "
              f"peak per rank over it: {ratios} (targets: off <= 0.75x, selective <= 0.5x)")
    for seq, limit in ((4096, "<= 16 GB both ranks"), (8192, "completes within 24 GiB")):
        p = point(2, seq, "full")
        if p and "both_ranks_rss_gib" in p:
            print(f"tp 2, full checkpointing, seq {seq}: both ranks {p['both_ranks_rss_gib'] * GIB / 1e9:.2f} GB "
                  f"resident at the peak (target {limit})")
    def ran(p):
        return p is not None and "step_s" in p

    costs = {pol: [point(t, s, pol)["step_s"] / point(t, s, "off")["step_s"] for t in tps for s in seqs
                   if ran(point(t, s, pol)) and ran(point(t, s, "off"))]
             for pol in ("selective", "full")}
    for pol, target in (("selective", 1.15), ("full", 1.4)):
        if costs[pol]:
            print(f"step time with {pol} checkpointing over none: median {statistics.median(costs[pol]):.2f}x "
                  f"({min(costs[pol]):.2f}-{max(costs[pol]):.2f}; target <= {target})")
    errors = [abs(p["predicted_gib"] / p["peak_tensor_gib"] - 1) for p in points if "peak_tensor_gib" in p]
    if errors:
        print(f"--estimate-memory against the measured tensor peak: worst {max(errors):.1%} (target <= 15%)")
    if draw(points, torch_points, os.path.abspath(a.png)):
        print(f"chart: {os.path.abspath(a.png)}")


if __name__ == "__main__":
    main()
