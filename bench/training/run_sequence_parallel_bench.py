#!/usr/bin/env python3
"""Sequence parallelism's activation memory: one training step at seq 2048 (batch 1,
bf16 compute with f32 master weights, AdamW, vocab-parallel loss) of the qwen3-0.6b
preset cut to a few layers, at tp = 2 (1 thread per rank), with --sequence-parallel
off and on. Reports, per rank, from the process: the high-water mark of the tensor
bytes live during the step over those live when it began (activations, the
backward's temporaries and gradients in flight), and the peak resident set.

  bench/training/run_sequence_parallel_bench.py [--build build] [--layers 4] [--seq-len 2048] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import run_json, setup  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--model", help="default: out/qwen3-0.6b-L<layers>, written with tp make-model when absent")
    ap.add_argument("--json", help="also write both runs' numbers here")
    a = ap.parse_args()

    model = a.model or f"out/qwen3-0.6b-L{a.layers}"
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(a.build, "src", "tp"), "make-model", "--arch", "qwen3", "--preset", "qwen3-0.6b",
                        "--layers", str(a.layers), "--out", model], check=True)
    bench, tprun, env = setup(a.build, "training/bench_training", model)
    cmd = [tprun, "--nproc-per-node", "2", bench, "--model", model, "--seq-len", str(a.seq_len), "--batch", "1",
           "--warmup", "0", "--steps", "1", "--dtype", "bf16", "--skip-ceilings"]
    runs = {}
    for sp in (False, True):
        runs[sp] = run_json(cmd + (["--sequence-parallel"] if sp else []), env)
        print(f"sequence parallel {'on' if sp else 'off'}: {runs[sp]['step_s_median']:.1f} s/step", file=sys.stderr)

    mib = 1 << 20
    print(f"qwen3-0.6b preset, {a.layers} layers, seq {a.seq_len}, batch 1, bf16 compute, tp = 2, one step:")
    for sp in (False, True):
        r = runs[sp]
        act = max(r["step_peak_tensor_bytes_per_rank"])
        rss = max(r["peak_rss_bytes_per_rank"])
        print(f"  sequence parallel {'on ' if sp else 'off'}: step peak tensor memory over its start "
              f"{act / mib:.0f} MiB per rank (ranks: {', '.join(str(b // mib) for b in r['step_peak_tensor_bytes_per_rank'])}); "
              f"peak RSS {rss / mib:.0f} MiB; loss {r['losses'][0]:.6f}; {r['step_s_median']:.1f} s")
    off = max(runs[False]["step_peak_tensor_bytes_per_rank"])
    on = max(runs[True]["step_peak_tensor_bytes_per_rank"])
    print(f"  on / off: {on / off:.3f} ({(off - on) / mib:.0f} MiB less per rank)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"off": runs[False], "on": runs[True]}, f, indent=1)


if __name__ == "__main__":
    main()
