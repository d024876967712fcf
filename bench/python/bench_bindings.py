"""What the Python bindings cost on a forward pass: model(input_ids) from Python
(ids converted in, the logits handed out as a numpy array) against the same
forward called from C++ with no conversion, in the same process, alternating.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/python/bench_bindings.py
    build/src/tprun --nproc-per-node 2 /usr/bin/python3 bench/python/bench_bindings.py   # tp = 2

Writes the qwen3-0.6b preset (bf16) to --model when it is not there.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import tp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 and not os.path.exists(os.path.join(a.model, "config.json")):
        subprocess.run([os.path.join(a.build, "src", "tp"), "make-model", "--arch", "qwen3", "--preset", "qwen3-0.6b",
                        "--dtype", "bf16", "--out", a.model], check=True)
    while not os.path.exists(os.path.join(a.model, "config.json")):  # the other ranks wait for rank 0's model
        time.sleep(1)
    model = tp.AutoModelForCausalLM.from_pretrained(a.model, dtype="bfloat16", verbose=False)
    ids = np.random.default_rng(0).integers(0, model.config["vocab_size"], size=(1, a.seq), dtype=np.int64)
    model(ids)  # warm up: packed weights touched, buffers allocated

    python_s, cpp_s = [], []
    for i in range(a.pairs):
        for side in ("python", "cpp") if i % 2 == 0 else ("cpp", "python"):
            if side == "python":
                t0 = time.perf_counter()
                logits = model(ids).logits
                python_s.append(time.perf_counter() - t0)
                del logits
            else:
                cpp_s.append(model._model._time_forward(ids, 1)[0])
    if rank == 0:
        p, c = statistics.median(python_s), statistics.median(cpp_s)
        print(f"{a.model} prefill {a.seq}, bf16, tp_size {model.tp_size}, {a.pairs} pairs, median (min-max):")
        print(f"  model(input_ids) from Python: {p:.3f} s ({min(python_s):.3f}-{max(python_s):.3f})")
        print(f"  the C++ forward alone:        {c:.3f} s ({min(cpp_s):.3f}-{max(cpp_s):.3f})")
        print(f"  Python / C++: {p / c:.4f} (pairwise median {statistics.median(x / y for x, y in zip(python_s, cpp_s)):.4f})")


if __name__ == "__main__":
    sys.exit(main())
