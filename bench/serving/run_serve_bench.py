#!/usr/bin/python3
"""Load benchmark of `tp serve` on a real-size model (issue 29 item 5).

  bench/serving/run_serve_bench.py [--model DIR] [--tp 1,2] [--clients 1,4,8,16] [--requests 3]
                                   [--max-tokens 32] [--max-num-batched-tokens 512] [--json FILE] [--png FILE]
  bench/serving/run_serve_bench.py --from-json FILE     # the table and chart again

The Qwen3-0.6B preset (written with `tp make-model` when --model has none), bf16,
greedy, prompts of token ids. For each tp size a server is started (tprun,
one OpenMP thread per rank), and in that run:
  1. the prefill rate alone: one 2048-token prompt, max_tokens 1: its tokens over
     its time to first token (the baseline the aggregate throughput is held to);
  2. for each client count, every client streams completions back to back (at
     least --requests, and until the long prompt below has its first token),
     prompts drawn from a fixed mix (64, 128, 256 tokens), max_tokens
     --max-tokens; once every client has its first token, one 2048-token prompt
     (max_tokens 8) arrives.
Reported per point: aggregate throughput (prompt + completion tokens over the
wall time), aggregate decode rate (clients over the median inter-token latency:
a decode step's rate, steps that carried prompt chunks being the slow tail),
each stream's own decode rate (median), time to first token p50/p99,
and the running streams' inter-token latency p50/p99 (the gap between a stream's
consecutive chunks over the tokens it carries), steady and while the long prompt
is admitted (from its arrival to its first token). The targets are ratios to
the same run's figures: decode rate against one client's, the long prompt's
p99 against steady, throughput against the prefill rate.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "serving"))
from client import Server  # noqa: E402
from paired_runs import draw_lines, setup  # noqa: E402

MIX = [64, 128, 256]
LONG = 2048


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def prompt(n, seed, vocab):
    return [(seed * 7919 + i * 104729 + 13) % (vocab - 1) + 1 for i in range(n)]


def token_times(r):
    """(time, tokens) of each chunk of a streamed completion that carried tokens."""
    out = []
    for chunk, t in zip(r["chunks"], r["times"]):
        n = len((chunk.get("choices") or [{}])[0].get("token_ids") or [])
        if n:
            out.append((t, n))
    return out


def start_server(tprun, tp_bin, model, tp, slots, step_tokens, env, log):
    cmd = [tprun, "--nproc-per-node", str(tp), tp_bin, "serve", "--model", model, "--port", "0",
           "--max-num-seqs", str(slots), "--max-model-len", str(LONG + 64), "--disable-log-requests",
           "--max-num-batched-tokens", str(step_tokens)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(1200):
        log.flush()
        text = open(log.name).read()
        if " on http://127.0.0.1:" in text:
            port = int(text.split(" on http://127.0.0.1:")[1].split()[0])
            return proc, Server(f"http://127.0.0.1:{port}", timeout=1200)
        if proc.poll() is not None:
            sys.exit(f"tp serve exited:\n{text}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("tp serve did not start in 120 s")


def run_point(server, clients, requests, max_tokens, vocab):
    lock = threading.Lock()
    streams, first_tokens = [], threading.Semaphore(0)
    t_start = time.time()

    long_done = threading.Event()

    def client(c):
        r = 0
        while r < requests or not long_done.is_set():  # running streams while the long prompt is admitted
            n = MIX[(c + r) % len(MIX)]
            body = {"prompt": prompt(n, 1000 * c + r, vocab), "max_tokens": max_tokens, "temperature": 0,
                    "return_token_ids": True, "stream": True}
            sent = time.time()
            res = server.stream("/v1/completions", body)
            if res["status"] != 200 or not res["done"]:
                sys.exit(f"request failed: {res.get('error')}")
            times = [(sent - t_start + t, k) for t, k in token_times(res)]
            with lock:
                streams.append({"prompt": n, "sent": sent - t_start, "tokens": times})
            if r == 0:
                first_tokens.release()
            r += 1

    long_result = {}

    def long_prompt():
        for _ in range(clients):
            first_tokens.acquire()
        sent = time.time()
        res = server.stream("/v1/completions", {"prompt": prompt(LONG, 7, vocab), "max_tokens": 8,
                                                "temperature": 0, "return_token_ids": True})
        long_result.update(sent=sent - t_start, first=sent - t_start + res["ttft"])
        long_done.set()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    threads.append(threading.Thread(target=long_prompt))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t_start
    window = (long_result["sent"], long_result["first"])
    steady, during, rates, ttft = [], [], [], []
    for s in streams:
        ttft.append(s["tokens"][0][0] - s["sent"])
        decoded = sum(k for _, k in s["tokens"][1:])
        if decoded:
            rates.append(decoded / (s["tokens"][-1][0] - s["tokens"][0][0]))
        for (t0, _), (t1, k) in zip(s["tokens"], s["tokens"][1:]):
            gap = (t1 - t0) / k
            (during if window[0] < t1 <= window[1] + 1e-3 else steady).append(gap)
    completion = sum(sum(k for _, k in s["tokens"]) for s in streams) + 8
    prompt_tokens = sum(s["prompt"] for s in streams) + LONG
    return {"clients": clients, "wall_s": round(wall, 2),
            "throughput_tokens_per_s": round((prompt_tokens + completion) / wall, 1),
            "decode_tokens_per_s": round(clients / percentile(steady, 50), 2),
            "stream_decode_tokens_per_s": round(statistics.median(rates), 2),
            "ttft_p50_ms": round(1000 * percentile(ttft, 50)), "ttft_p99_ms": round(1000 * percentile(ttft, 99)),
            "itl_p50_ms": round(1000 * percentile(steady, 50), 1),
            "itl_p99_ms": round(1000 * percentile(steady, 99), 1),
            "itl_p99_during_long_prompt_ms": round(1000 * percentile(during, 99), 1) if during else None,
            "long_prompt_ttft_ms": round(1000 * (window[1] - window[0]))}


def measure(a):
    _, tprun, env = setup(a.build, "", a.model)
    tp_bin = os.path.join(a.build, "src", "tp")
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    results = []
    for tp in [int(x) for x in a.tp.split(",")]:
        counts = [int(x) for x in a.clients.split(",")]
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
            proc, server = start_server(tprun, tp_bin, a.model, tp, max(counts) + 1, a.max_num_batched_tokens, env,
                                        log)
            try:
                server.wait_healthy(seconds=600, proc=proc)
                server.post("/v1/completions", {"prompt": prompt(16, 1, vocab), "max_tokens": 4})  # warm
                t0 = time.time()
                r = server.stream("/v1/completions", {"prompt": prompt(LONG, 3, vocab), "max_tokens": 1})
                prefill = LONG / r["ttft"]
                print(f"tp {tp}: prefill alone {prefill:.0f} tokens/s ({time.time() - t0:.1f} s)", file=sys.stderr)
                for c in counts:
                    p = dict(run_point(server, c, a.requests, a.max_tokens, vocab), tp=tp,
                             prefill_tokens_per_s=round(prefill, 1))
                    print(json.dumps(p), file=sys.stderr)
                    results.append(p)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    return results


def report(results):
    print("| tp | clients | tokens/s (prompt + completion) | / prefill alone | decode tokens/s | / one client's | "
          "TTFT p50 / p99 | ITL p50 / p99 | ITL p99 while a 2048-token prompt is admitted | / steady |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in results:
        one = [q for q in results if q["tp"] == p["tp"] and q["clients"] == 1]
        scale = f"{p['decode_tokens_per_s'] / one[0]['decode_tokens_per_s']:.2f}×" if one else "—"
        during = p["itl_p99_during_long_prompt_ms"]
        cells = [p["tp"], p["clients"], p["throughput_tokens_per_s"],
                 f"{p['throughput_tokens_per_s'] / p['prefill_tokens_per_s']:.2f}", p["decode_tokens_per_s"], scale,
                 f"{p['ttft_p50_ms']} / {p['ttft_p99_ms']} ms", f"{p['itl_p50_ms']} / {p['itl_p99_ms']} ms",
                 f"{during} ms" if during else "—", f"{during / p['itl_p99_ms']:.1f}×" if during else "—"]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def draw(results, png):
    series = []
    for tp in sorted({p["tp"] for p in results}):
        rows = sorted((p["clients"], p["decode_tokens_per_s"]) for p in results if p["tp"] == tp)
        series.append((f"tp {tp}: decode tokens/s, all streams", rows, "linespoints"))
        one = dict(rows).get(1)
        if one:
            series.append((f"tp {tp}: clients x one stream alone", [(c, c * one) for c, _ in rows], "lines dt 2"))
    return draw_lines(png, "tp serve: aggregate decode rate, Qwen3-0.6B preset, bf16, greedy",
                      "concurrent streaming clients", "tokens/s", series)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="/tmp/tp-bench-qwen3-0.6b")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=3, help="completions per client, back to back")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512, help="tp serve's step budget (chunked prefill)")
    ap.add_argument("--json")
    ap.add_argument("--from-json")
    ap.add_argument("--png", default=os.path.join(HERE, "..", "results", "serving_load.png"))
    a = ap.parse_args()
    if a.from_json:
        results = json.load(open(a.from_json))
    else:
        results = measure(a)
        if a.json:
            json.dump(results, open(a.json, "w"), indent=1)
    report(results)
    if draw(results, os.path.abspath(a.png)):
        print(f"chart: {a.png}", file=sys.stderr)


if __name__ == "__main__":
    main()
