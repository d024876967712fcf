#!/usr/bin/python3
"""Load test of a running `tp serve` (standard library only).

  load_test.py --url http://127.0.0.1:PORT [--clients 32] [--duration 60] [--vocab 516]

1. Solo: each prompt of a fixed pool (token ids of 1..64 tokens, max_tokens
   8..48, greedy) is streamed alone, one at a time: its reference tokens, and the
   time to first token and throughput of one client at a time.
2. Load: --clients threads stream prompts of the pool back to back for
   --duration seconds; every response must equal its solo run token for token,
   end with its finish chunk and [DONE] (none lost or cut). Meanwhile another
   client opens a long stream every --kill-every seconds and hangs up after a
   few chunks: it must not disturb the others.
Prints throughput (completion tokens/s) and p50/p99 time to first token under
load against solo; exits 1 on any mismatch, error or lost request.
"""
import argparse
import json
import random
import sys
import threading
import time

from client import Server, stream_tokens


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=60, help="seconds of load")
    p.add_argument("--vocab", type=int, default=516, help="prompt ids are drawn below this")
    p.add_argument("--prompts", type=int, default=24, help="size of the prompt pool")
    p.add_argument("--kill-every", type=float, default=2.0, help="seconds between hung-up streams (0: none)")
    p.add_argument("--api-key")
    p.add_argument("--json", help="also write the numbers to this file")
    args = p.parse_args()
    server = Server(args.url, api_key=args.api_key, timeout=300)
    server.wait_healthy()

    rng = random.Random(0)
    pool = [{"prompt": [rng.randrange(1, args.vocab) for _ in range(rng.randint(1, 64))],
             "max_tokens": rng.randint(8, 48), "temperature": 0, "return_token_ids": True}
            for _ in range(args.prompts)]

    # 1. One client at a time.
    reference, solo_ttft, solo_tokens = [], [], 0
    t0 = time.time()
    for body in pool:
        r = server.stream("/v1/completions", body)
        if r["status"] != 200 or not r["done"]:
            sys.exit(f"solo request failed: {r.get('error')}")
        ids, _, finish = stream_tokens(r)
        reference.append((ids, finish))
        solo_ttft.append(r["ttft"])
        solo_tokens += len(ids)
    solo_seconds = time.time() - t0

    # 2. Many clients at once, plus one that hangs up mid-stream.
    lock = threading.Lock()
    stats = {"requests": 0, "tokens": 0, "ttft": [], "failures": [], "hung_up": 0}
    stop_at = time.time() + args.duration
    counter = iter(range(10 ** 9))

    def client():
        while time.time() < stop_at:
            with lock:
                i = next(counter) % len(pool)
            r = server.stream("/v1/completions", pool[i])
            ids, _, finish = stream_tokens(r)
            with lock:
                if r["status"] != 200 or not r["done"] or (ids, finish) != reference[i]:
                    stats["failures"].append(f"prompt {i}: status {r['status']} done {r['done']} finish {finish} "
                                             f"{len(ids)} tokens vs {len(reference[i][0])}")
                else:
                    stats["requests"] += 1
                    stats["tokens"] += len(ids)
                    stats["ttft"].append(r["ttft"])

    def hang_up():
        long = {"prompt": [7, 8, 9], "max_tokens": 200, "temperature": 0, "return_token_ids": True}
        while args.kill_every > 0 and time.time() + args.kill_every < stop_at:
            time.sleep(args.kill_every)
            server.stream("/v1/completions", long, stop_after=3)
            with lock:
                stats["hung_up"] += 1

    threads = [threading.Thread(target=client) for _ in range(args.clients)] + [threading.Thread(target=hang_up)]
    t1 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    load_seconds = time.time() - t1

    result = {
        "clients": args.clients,
        "duration_s": round(load_seconds, 1),
        "requests": stats["requests"],
        "failures": len(stats["failures"]),
        "hung_up_streams": stats["hung_up"],
        "tokens_per_s": round(stats["tokens"] / load_seconds, 1),
        "ttft_p50_ms": round(1000 * percentile(stats["ttft"], 50), 1),
        "ttft_p99_ms": round(1000 * percentile(stats["ttft"], 99), 1),
        "solo_tokens_per_s": round(solo_tokens / solo_seconds, 1),
        "solo_ttft_p50_ms": round(1000 * percentile(solo_ttft, 50), 1),
        "solo_ttft_p99_ms": round(1000 * percentile(solo_ttft, 99), 1),
    }
    print(f"load: {args.clients} streaming clients for {load_seconds:.1f} s: {result['requests']} requests, "
          f"{result['tokens_per_s']} tokens/s, time to first token p50 {result['ttft_p50_ms']} ms / p99 "
          f"{result['ttft_p99_ms']} ms; {result['hung_up_streams']} streams hung up mid-way")
    print(f"solo: one client at a time: {result['solo_tokens_per_s']} tokens/s, time to first token p50 "
          f"{result['solo_ttft_p50_ms']} ms / p99 {result['solo_ttft_p99_ms']} ms")
    if args.json:
        json.dump(result, open(args.json, "w"), indent=1)
    for f in stats["failures"][:10]:
        print("FAIL:", f, file=sys.stderr)
    if stats["failures"] or stats["requests"] == 0:
        sys.exit(f"{len(stats['failures'])} requests differ from their solo run or were lost")
    print("every response equals its solo run")


if __name__ == "__main__":
    main()
