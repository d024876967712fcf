"""Helpers of the paired-run benchmark drivers (bench/*/run_*_bench.py)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run_json(cmd, env, timeout=None):
    """Runs cmd (at most timeout seconds) and returns the JSON object on the last line of its stdout."""
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(values, fmt):
    """'median (min-max)' of values, each formatted with fmt."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def setup(build, bench, model, preset=("qwen3", "qwen3-0.6b")):
    """(bench binary, tprun, env) for a driver: writes the preset model with `tp make-model`
    when `model` has none, and the environment every run uses (1 OpenMP thread per rank,
    glibc's huge-page malloc as tprun sets it)."""
    if not os.path.exists(os.path.join(model, "config.json")):
        tp = os.path.join(build, "src", "tp")
        subprocess.run([tp, "make-model", "--arch", preset[0], "--preset", preset[1], "--out", model], check=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    return os.path.join(build, "bench", bench), os.path.join(build, "src", "tprun"), env


def inference_arguments(doc, model, pairs, decode):
    """The options every inference driver takes (--build, --model, --pairs, --prefill, --decode)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default=model)
    ap.add_argument("--pairs", type=int, default=pairs)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=decode)
    return ap


def draw_lines(png, title, xlabel, ylabel, series):
    """A PNG chart of `series` [(legend, [(x, y), ...], gnuplot style)] over a log2 x axis
    (gnuplot); False, with a line on stderr, when gnuplot is not installed."""
    if shutil.which("gnuplot") is None:
        print("no chart: gnuplot is not installed (Debian: gnuplot-nox)", file=sys.stderr)
        return False
    script = ["set terminal pngcairo size 1000,620 font ',11'", f"set output '{png}'", f"set title '{title}'",
              f"set xlabel '{xlabel}'", f"set ylabel '{ylabel}'", "set logscale x 2", "set grid", "set key top left"]
    script.append("plot " + ", ".join(f"'-' using 1:2 with {style} lw 2 title '{t}'" for t, _, style in series))
    for _, rows, _ in series:
        script += [f"{x} {y:.3f}" for x, y in rows] + ["e"]
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    return True
