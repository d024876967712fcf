#!/usr/bin/env python3
"""The seeds' chart, measured here: speedup against tp = 1 of a single forward pass
(prefill) and of decode, at tp = 1, 2 and 4 (4 ranks on this 2-core machine: oversubscribed,
marked so), tp next to PyTorch doing the same work, all in one run; PNG + JSON.

Work: the qwen3-0.6b preset (`tp make-model`, random bf16 weights), batch 1, bf16; for each
prompt length P in --contexts (default 512 and 2048): prefill P tokens, then greedy-decode
--decode tokens (decode at P..P+D tokens of context). tp: bench/models/bench_inference
(1 OpenMP thread per rank). PyTorch: bench/models/torch_inference.py (Debian's torch 1.13,
Transformers' qwen3 TP layout over gloo, bf16, static KV cache, inference_mode, 1 thread
per rank), and PyTorch's best single process (1 process, 2 threads). Both engines load
the same config.json and model.safetensors.

Agreement: PyTorch decodes with tp's tp = 1 tokens fed in (--force-tokens) and must find
each of them to be its own argmax, or within --tolerance of its largest logit (a near tie
under bf16 rounding); the first PyTorch run of each P also compares the prefill's top-8
logits. Any failure: exit 1 (after writing the JSON and the PNG).

The machine is noisy (memory bandwidth swings up to 5x within minutes), so every kind of
run happens once per ROUND and the rounds alternate the order of the runs (forward, then
reversed) and the core the single-core runs are pinned to; every ratio is taken within a
round and the report gives the median (min-max) over the rounds. The bars are medians of
per-round ratios; the JSON keeps every run. A prefill of 2048 costs PyTorch minutes (its
eager attention), so the contexts after the first run in the first --long-rounds rounds only.

  bench/models/run_speedup_chart.py [--build build] [--model out/qwen3-0.6b] [--rounds 3]
      [--long-rounds 1] [--contexts 512,2048] [--decode 16] [--tp 1,2,4] [--out bench/results/speedup_chart]

writes OUT.png and OUT.json (and OUT.gnuplot, OUT.dat: the plot's script and data).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from paired_runs import run_json, setup, summary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SCRIPT = os.path.join(HERE, "torch_inference.py")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch


def median(v):
    return statistics.median(v) if v else float("nan")


def run(cmd, env, timeout):
    """The JSON line of cmd, or None (printed why) if it failed or ran past timeout."""
    try:
        return run_json(cmd, env, timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout} s: {' '.join(cmd)}", file=sys.stderr)
    except subprocess.CalledProcessError as e:
        print(f"  failed ({e.returncode}): {' '.join(cmd)}\n{(e.stderr or '')[-2000:]}", file=sys.stderr)
    return None


def agreement(tp_run, torch_run, tol):
    """(passed, details) of PyTorch's run fed tp's tokens."""
    a = torch_run.get("agreement")
    if a is None:
        return False, {"error": "no agreement in PyTorch's output"}
    scale = max(1.0, a["logit_absmax"])
    d = dict(a, tolerance=tol * scale)
    ok = a["steps"] == len(tp_run["tokens"]) and a["max_margin"] <= tol * scale
    tp_top = dict((i, v) for i, v in tp_run["prefill_top"])
    common = [(tp_top[i], v) for i, v in torch_run["prefill_top"] if i in tp_top]
    if common:
        d["prefill_top8_common"] = len(common)
        d["prefill_top8_max_abs_diff"] = max(abs(x - y) for x, y in common)
    return ok, d


def plot(path, panels, tps, meta):
    """panels: [(title, rows)], rows: [(label, tp_speedup, torch_speedup, tp_abs, torch_abs)]."""
    dat = path + ".dat"
    with open(dat, "w") as f:
        for title, rows in panels:
            f.write(f"# {title}\n")
            for label, a, b, sa, sb in rows:
                q = lambda x: "NaN" if x is None or x != x else f"{x:.4f}"  # noqa: E731
                f.write(f'"{label}" {q(a)} {q(b)} "{sa}" "{sb}"\n')
            f.write("\n\n")
    lines = [
        'set terminal pngcairo size 1500,1100 font "Sans,11" noenhanced',
        f"set output '{path}.png'",
        f'set multiplot layout 2,2 title "{meta}" font "Sans,12"',
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set grid ytics",
        "set key top left horizontal",
        "set ylabel \"speedup against tp's tp = 1 (1 core)\"",
        "set xtics nomirror",
        "set bmargin 3.5",
        "set yrange [0:*]",
        "set offsets 0, 0, graph 0.22, 0",
        "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#666666'",
    ]
    for k, (title, rows) in enumerate(panels):
        lines.append(f'set title "{title}"')
        tics = ", ".join(f'"{label}" {i}' for i, (label, *_) in enumerate(rows))
        lines.append(f"set xtics ({tics})")
        lines.append(
            f"plot '{dat}' index {k} using 2 title 'tp' lc rgb '#1f5fa8', "
            f"'' index {k} using 3 title 'PyTorch 1.13 (Transformers TP layout, gloo)' lc rgb '#e07b1a', "
            f"'' index {k} using ($0-0.17):($2):(sprintf(\"%.2fx\\n%s\", $2, strcol(4))) with labels "
            f"offset 0,1.2 font 'Sans,9' notitle, "
            f"'' index {k} using ($0+0.17):($3):(sprintf(\"%.2fx\\n%s\", $3, strcol(5))) with labels "
            f"offset 0,1.2 font 'Sans,9' notitle")
    lines.append("unset multiplot")
    with open(path + ".gnuplot", "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["gnuplot", path + ".gnuplot"], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="out/qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-rounds", type=int, default=1,
                    help="the contexts after the first are measured in the first N rounds only (-1: every round)")
    ap.add_argument("--contexts", default="512,2048", help="prompt lengths (comma-separated)")
    ap.add_argument("--decode", type=int, default=16, help="decode steps after each prefill")
    ap.add_argument("--tp", default="1,2,4", help="tp sizes for both engines (first must be 1)")
    ap.add_argument("--no-single", action="store_true", help="skip PyTorch's 1-process 2-thread runs")
    ap.add_argument("--warmup-prefill", type=int, default=64, help="prompt tokens of each run's warmup")
    ap.add_argument("--warmup-decode", type=int, default=4, help="decode steps of each run's warmup")
    ap.add_argument("--tolerance", type=float, default=0.02,
                    help="agreement: PyTorch's logit of tp's token at most this x max(1, max|logit|) below its max")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run before it counts as failed")
    ap.add_argument("--out", default="bench/results/speedup_chart", help="writes OUT.png and OUT.json")
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    tps = [int(x) for x in a.tp.split(",")]
    if tps[0] != 1:
        raise SystemExit("--tp must start with 1 (the speedups are against tp = 1)")
    ncores = len(os.sched_getaffinity(0))
    cores = sorted(os.sched_getaffinity(0))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    bench, tprun, env = setup(a.build, "models/bench_inference", a.model)
    torch_env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1", OMP_NUM_THREADS="1")
    common = ["--reps", "1", "--decode", str(a.decode), "--warmup-prefill", str(a.warmup_prefill),
              "--warmup-decode", str(a.warmup_decode)]

    # The kinds of run; ("torch", 1, 2) is PyTorch's best single process.
    kinds = [("tp", t, 1) for t in tps] + [("torch", t, 1) for t in tps]
    if not a.no_single:
        kinds.append(("torch", 1, 2))
    # interleaved: tp 1, torch 1, tp 2, torch 2, ..., torch single
    order = [k for t in tps for k in (("tp", t, 1), ("torch", t, 1))] + kinds[2 * len(tps):]
    runs = {P: {k: [] for k in kinds} for P in contexts}     # per round, None where a run failed
    tokens = {}                                              # P -> tp's tp = 1 tokens
    checks = []
    t_start = time.time()
    for r in range(a.rounds):
        core = cores[r % len(cores)]
        for P in contexts:
            if P != contexts[0] and 0 <= a.long_rounds <= r:
                continue
            seq = order if r % 2 == 0 else order[::-1]
            if P not in tokens:                              # tp = 1 first: its tokens are fed to PyTorch
                seq = [("tp", 1, 1)] + [k for k in seq if k != ("tp", 1, 1)]
            for kind in seq:
                engine, t, threads = kind
                pin = ["taskset", "-c", str(core)] if t == 1 and threads == 1 else []
                if engine == "tp":
                    cmd = pin + ([] if t == 1 else [tprun, "--nproc-per-node", str(t)]) + [bench]
                    cmd += ["--model", a.model, "--prefill", str(P), "--skip-ceilings"] + common
                    res = run(cmd, env, a.timeout)
                    if res is not None and t == 1 and P not in tokens:
                        tokens[P] = res["tokens"]
                else:
                    if P not in tokens:
                        print(f"  no tp = 1 tokens for prefill {P}: PyTorch skipped", file=sys.stderr)
                        res = None
                    else:
                        cmd = pin + [PYTHON, TORCH_SCRIPT, "--model", a.model, "--tp", str(t), "--threads",
                                     str(threads), "--prefill", str(P), "--force-tokens",
                                     ",".join(map(str, tokens[P]))] + common
                        res = run(cmd, torch_env, a.timeout)
                    if res is not None:
                        tp1 = next(x for x in runs[P][("tp", 1, 1)] if x is not None)
                        ok, d = agreement(tp1, res, a.tolerance)
                        checks.append(dict(d, prefill=P, tp=t, threads=threads, round=r, passed=ok))
                        if not ok:
                            print(f"  AGREEMENT FAILED: PyTorch tp={t} x{threads} prefill {P}: {d}",
                                  file=sys.stderr)
                if res is not None:    # the 1-minute load average: how busy the neighbours kept the machine
                    res["round"], res["core"], res["loadavg_1min_after"] = r, core if pin else None, os.getloadavg()[0]
                runs[P][kind].append(res)
                name = f"{'tp' if engine == 'tp' else 'PyTorch'} tp={t}" + (f" x{threads} threads" if threads > 1
                                                                              else "")
                got = (f"prefill {res['prefill_s_median']:.3f} s, decode {res['decode_s_median']:.3f} s"
                       if res else "FAILED")
                print(f"round {r + 1}/{a.rounds} prefill {P}: {name}: {got} [{time.time() - t_start:.0f} s]",
                      file=sys.stderr, flush=True)
    elapsed = time.time() - t_start

    # Per-round ratios, medians over rounds.
    def per_round(P, kind, metric):
        return [x[metric] if x else None for x in runs[P][kind]]

    def ratios(P, num, den, metric):
        """Per-round time(num) / time(den) where both ran."""
        out = []
        for x, y in zip(per_round(P, num, metric), per_round(P, den, metric)):
            if x and y:
                out.append(x / y)
        return out

    def abs_text(P, kind, metric, per):
        v = [x for x in per_round(P, kind, metric) if x]
        if not v:
            return "n/a"
        m = median(v)
        return f"{m / per * 1e3:.0f} ms/tok" if per > 1 else f"{m:.2f} s"

    summary_json = {}
    panels = []
    lines = []
    base = ("tp", 1, 1)
    for P in contexts:
        for phase, metric, per in (("prefill", "prefill_s_median", 1), ("decode", "decode_s_median", a.decode)):
            if phase == "decode" and a.decode == 0:
                continue
            rows, s = [], {}
            for t in tps:
                tp_sp = ratios(P, base, ("tp", t, 1), metric)
                th_sp = ratios(P, base, ("torch", t, 1), metric)
                label = f"tp={t}" + (" (*)" if t > ncores else "")
                rows.append((label, median(tp_sp) if tp_sp else None, median(th_sp) if th_sp else None,
                             abs_text(P, ("tp", t, 1), metric, per), abs_text(P, ("torch", t, 1), metric, per)))
                s[f"tp{t}"] = {"tp_s": per_round(P, ("tp", t, 1), metric),
                               "torch_s": per_round(P, ("torch", t, 1), metric),
                               "tp_speedup_vs_tp1": tp_sp, "torch_speedup_vs_tp_tp1": th_sp,
                               "torch_over_tp": ratios(P, ("torch", t, 1), ("tp", t, 1), metric)}
            if not a.no_single:
                single = ("torch", 1, 2)
                sp = ratios(P, base, single, metric)
                rows.append(("PyTorch 1 process\\nx 2 threads", None, median(sp) if sp else None,
                             "", abs_text(P, single, metric, per)))
                s["torch_single_2threads_s"] = per_round(P, single, metric)
                if 2 in tps:
                    s["torch_single_over_tp_tp2"] = ratios(P, single, ("tp", 2, 1), metric)
            what = f"prefill {P} tokens" if phase == "prefill" else f"decode {a.decode} tokens at {P} context"
            panels.append((f"{what} (bars: speedup; labels: time{'' if per == 1 else ' per token'})",
                           rows))
            summary_json[f"{phase}_{P}"] = s
            lines.append(f"{what}, median (min-max) over {len(runs[P][base])} rounds:")
            for t in tps:
                e = s[f"tp{t}"]
                tp_v = [x for x in e["tp_s"] if x]
                th_v = [x for x in e["torch_s"] if x]
                fmt = (lambda v: summary([x / per * 1e3 for x in v], "{:.1f}") + " ms/token") if per > 1 else \
                    (lambda v: summary(v, "{:.3f}") + " s")
                lines.append(f"  tp={t}{' (oversubscribed)' if t > ncores else ''}: tp "
                             f"{fmt(tp_v) if tp_v else 'n/a'}, PyTorch {fmt(th_v) if th_v else 'n/a'}"
                             + (f"; tp speedup vs tp=1 {summary(e['tp_speedup_vs_tp1'], '{:.2f}')}x"
                                if t > 1 and e["tp_speedup_vs_tp1"] else "")
                             + (f"; PyTorch / tp {summary(e['torch_over_tp'], '{:.2f}')}x"
                                if e["torch_over_tp"] else ""))
            if not a.no_single:
                v = [x for x in s["torch_single_2threads_s"] if x]
                fmt = (lambda v: summary([x / per * 1e3 for x in v], "{:.1f}") + " ms/token") if per > 1 else \
                    (lambda v: summary(v, "{:.3f}") + " s")
                lines.append(f"  PyTorch 1 process x 2 threads: {fmt(v) if v else 'n/a'}"
                             + (f"; its time / tp's tp=2 {summary(s['torch_single_over_tp_tp2'], '{:.2f}')}x"
                                if s.get("torch_single_over_tp_tp2") else ""))
    passed = bool(checks) and all(c["passed"] for c in checks)
    worst = max((c.get("max_margin", float("inf")) for c in checks), default=None)
    lines.append(f"agreement (PyTorch fed tp's tokens; its argmax equal, or within tolerance): "
                 f"{'PASS' if passed else 'FAIL'} over {len(checks)} PyTorch runs; "
                 f"{sum(c.get('equal', 0) for c in checks)}/{sum(c.get('steps', 0) for c in checks)} argmaxes equal; "
                 f"largest margin {worst}")
    loads = [x["loadavg_1min_after"] for v in runs.values() for k in v.values() for x in k if x]
    if loads:
        lines.append(f"1-minute load average after each run (this machine has {ncores} cores): "
                     f"{summary(loads, '{:.1f}')}")
    lines.append(f"wall time {elapsed:.0f} s")
    print("\n".join(lines))

    over = [t for t in tps if t > ncores]
    meta = (f"{os.path.basename(os.path.normpath(a.model))}, bf16, batch 1, 1 thread per rank: tp vs PyTorch "
            f"{runs_torch_version(runs)} doing the same work; "
            + ", ".join(f"{len(runs[P][base])} round{'s' if len(runs[P][base]) != 1 else ''} at {P}" for P in contexts)
            + "; medians of per-round ratios"
            + (f"\\nload average after the runs {summary(loads, '{:.1f}')} on {ncores} cores (the runs' own ranks included)"
               if loads else "")
            + (f"\\n(*) tp={','.join(map(str, over))}: oversubscribed, more ranks than the machine's {ncores} cores"
               if over else ""))
    plot(a.out, panels, tps, meta)
    with open(a.out + ".json", "w") as f:
        json.dump({"model": os.path.abspath(a.model), "rounds": a.rounds, "contexts": contexts, "decode": a.decode,
                   "tp_sizes": tps, "cores": ncores, "wall_s": round(elapsed, 1),
                   "agreement": "PASS" if passed else "FAIL", "tolerance": a.tolerance, "checks": checks,
                   "summary": summary_json, "report": lines,
                   "runs": {str(P): {f"{e}_tp{t}_x{th}": v for (e, t, th), v in runs[P].items()} for P in contexts}},
                  f, indent=1)
    print(f"wrote {a.out}.png and {a.out}.json", file=sys.stderr)
    sys.exit(0 if passed else 1)


def runs_torch_version(runs):
    for per_p in runs.values():
        for (engine, _, _), v in per_p.items():
            for x in v:
                if engine == "torch" and x:
                    return x.get("torch", "")
    return ""


if __name__ == "__main__":
    main()
