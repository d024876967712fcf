#!/usr/bin/python3
"""Checks a running `tp serve` with standard-library clients: greedy and seeded
completions equal `tp generate --json` for the same prompt, alone and batched
with other concurrent requests (streamed or not); stop strings; bad requests
get a 4xx with a message and change nothing; a client that hangs up mid-stream,
or before a whole answer, frees its slot; the API key is enforced.

  check_server.py --url http://127.0.0.1:PORT --tp build/src/tp --model DIR [--api-key K] [--slots N]
                  [--checks auth,greedy,text,chat,bad,disconnect]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

from client import Server, stream_tokens

args = None
failures = []
MODEL_FIELD = {}  # {"model": name} when --model-name is given


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def generate(extra):
    """token_ids and text of `tp generate --json` (one process, tp = 1) for one prompt;
    kept in --expect-cache, so a second server of the same model reuses them."""
    key = " ".join(extra)
    cache = {}
    if args.expect_cache and os.path.exists(args.expect_cache):
        cache = json.load(open(args.expect_cache))
    if key not in cache:
        out = subprocess.run([args.tp, "generate", "--model", args.model, "--json"] + extra,
                             check=True, capture_output=True, text=True).stdout
        j = json.loads(out.strip().splitlines()[-1])
        cache[key] = [j["token_ids"], j.get("text")]
        if args.expect_cache:
            json.dump(cache, open(args.expect_cache, "w"))
    return tuple(cache[key])


# Prompts of different lengths (token ids below the vocabulary) and budgets.
ID_CASES = [([1], 5), ([7, 300, 12], 12), ([1, 17, 42, 99, 250, 3, 511], 3),
            (list(range(100, 118)), 9), ([(i * 7919) % 5000 for i in range(40)], 6), ([5, 6], 10)]


def completion(server, body, stream):
    """(token ids, text, finish reason) of one request, streamed or not."""
    if stream:
        r = server.stream("/v1/completions", body)
        check(r["status"] == 200 and r["done"], f"stream of {body}: {r.get('error')} done={r['done']}")
        return stream_tokens(r)
    status, j = server.post("/v1/completions", body)
    check(status == 200, f"{body}: status {status} {j}")
    if status != 200:
        return None, None, None
    ch = j["choices"][0]
    check(j["object"] == "text_completion" and j["usage"]["total_tokens"] ==
          j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"], f"shape of {j}")
    return ch.get("token_ids"), ch["text"], ch["finish_reason"]


def check_greedy(server):
    want = [generate(["--input-ids", ",".join(map(str, p)), "--max-new-tokens", str(n)])[0] for p, n in ID_CASES]
    body = lambda p, n: dict(MODEL_FIELD, prompt=p, max_tokens=n, temperature=0, return_token_ids=True)
    for (p, n), w in zip(ID_CASES, want):  # one at a time
        ids, _, finish = completion(server, body(p, n), stream=False)
        check(ids == w, f"alone: prompt of {len(p)} tokens gave {ids}, tp generate {w}")
        check(finish == "length", f"finish {finish}")
    for rnd in range(2):  # all at once, half of them streamed, twice
        got = [None] * len(ID_CASES)

        def run(i):
            p, n = ID_CASES[i]
            got[i] = completion(server, body(p, n), stream=(i + rnd) % 2 == 0)[0]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ID_CASES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, w in enumerate(want):
            check(got[i] == w, f"batched round {rnd}: request {i} gave {got[i]}, tp generate {w}")
    print(f"greedy: {len(ID_CASES)} prompts equal tp generate alone and batched")


def check_text(server):
    prompt = "Hello there, my friend"
    want_ids, want_text = generate(["--prompt", prompt, "--max-new-tokens", "8"])
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    for stream in (False, True):
        ids, text, finish = completion(server, body, stream)
        check(ids == want_ids and text == want_text, f"text (stream={stream}): {text!r} {ids} vs {want_text!r} {want_ids}")
    # A stop string cuts the text before it (finish "stop"); so does one of a list.
    stop = next(want_text[k:k + 2] for k in range(1, len(want_text) - 1) if want_text[k:k + 2].strip())
    cut = want_text[:want_text.find(stop)]
    for stream in (False, True):
        for s in (stop, ["\u00a7never\u00a7", stop]):
            _, text, finish = completion(server, dict(body, stop=s), stream)
            check(text == cut and finish == "stop", f"stop {s!r} (stream={stream}): {text!r} {finish}, want {cut!r}")
    # Seeded sampling picks what tp generate --seed picks.
    want_ids, _ = generate(["--prompt", prompt, "--max-new-tokens", "10", "--temperature", "0.8", "--top-p", "0.9",
                            "--seed", "7"])
    ids, _, _ = completion(server, dict(body, max_tokens=10, temperature=0.8, top_p=0.9, seed=7), stream=False)
    check(ids == want_ids, f"seeded: {ids} vs tp generate {want_ids}")
    print(f"text, stop strings {stop!r}, seeded sampling: equal tp generate")


def tp_chat_answer(user, max_new_tokens):
    """token_ids of `tp chat --json`'s first answer (one process, tp = 1): the same template, greedy."""
    out = subprocess.run([args.tp, "chat", "--model", args.model, "--json", "--max-new-tokens", str(max_new_tokens)],
                         input=user + "\n", check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[0])["token_ids"]


def check_chat(server):
    # The model has Qwen3's chat template: the reply is `tp chat`'s for the same turn.
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
            "return_token_ids": True}
    status, j = server.post("/v1/chat/completions", body)
    check(status == 200, f"chat: status {status} {j}")
    if status != 200:
        return
    check(j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant", f"chat {j}")
    want = tp_chat_answer("Hi", 4)
    check(j["choices"][0].get("token_ids") == want, f"chat: {j['choices'][0].get('token_ids')} vs tp chat {want}")
    r = server.stream("/v1/chat/completions", body)
    check(r["done"] and r["chunks"][0]["object"] == "chat.completion.chunk" and
          r["chunks"][0]["choices"][0]["delta"].get("role") == "assistant", f"chat stream {r['chunks'][:1]}")
    check(stream_tokens(r)[1] == j["choices"][0]["message"]["content"], "chat: stream text != whole text")
    print("chat: whole and streamed, equal tp chat")


def check_bad_requests(server):
    cases = [
        ("invalid JSON", {"raw": "{\"prompt\": "}, 400, "not valid JSON"),
        ("body not an object", {"raw": "[1]"}, 400, "JSON object"),
        ("missing prompt", {"body": {"max_tokens": 3}}, 400, "'prompt' is required"),
        ("prompt of the wrong type", {"body": {"prompt": {"a": 1}}}, 400, "string or a list"),
        ("max_tokens a string", {"body": {"prompt": "x", "max_tokens": "3"}}, 400, "integer"),
        ("temperature a string", {"body": {"prompt": "x", "temperature": "hot"}}, 400, "number"),
        ("huge max_tokens", {"body": {"prompt": "x", "max_tokens": 10 ** 9}}, 400, "maximum context length"),
        ("token id past the vocabulary", {"body": {"prompt": [1, 10 ** 9]}}, 400, "outside the vocabulary"),
        ("n = 2", {"body": {"prompt": "x", "n": 2}}, 400, "n must be 1"),
        ("unknown model", {"body": {"prompt": "x", "model": "no-such-model"}}, 404, "does not exist"),
        ("empty messages", {"body": {"messages": []}, "path": "/v1/chat/completions"}, 400, "must not be empty"),
        ("messages not a list", {"body": {"messages": "hi"}, "path": "/v1/chat/completions"}, 400, "must be a list"),
        ("unknown endpoint", {"body": {}, "path": "/v1/nothing"}, 404, "no such endpoint"),
    ]
    for name, req, want_status, says in cases:
        status, j = server.request("POST", req.get("path", "/v1/completions"), req.get("body"), raw=req.get("raw"))
        ok = status == want_status and isinstance(j, dict) and says in j["error"]["message"] and \
            {"message", "type", "param", "code"} <= set(j["error"])
        check(ok, f"{name}: {status} {j}")
    # A streamed bad request is refused the same way, before any event.
    r = server.stream("/v1/completions", {"prompt": "x", "max_tokens": 10 ** 9})
    check(r["status"] == 400, f"streamed huge max_tokens: {r['status']}")
    ids, _, _ = completion(server, {"prompt": [1], "max_tokens": 5, "temperature": 0, "return_token_ids": True}, False)
    check(ids is not None and len(ids) == 5, "a good request after the bad ones")
    print(f"bad requests: {len(cases) + 1} refused with 4xx; served a good one after them")


def check_disconnect(server):
    # Fill every slot with long completions and hang up on each: their slots must
    # be freed, or the next request waits for theirs to finish. Measured against
    # the same run's time of one such completion alone, which must be long enough
    # (the model's whole context) to tell the two apart.
    context = json.load(open(os.path.join(args.model, "config.json")))["max_position_embeddings"]
    long = {"prompt": [3, 4, 5], "max_tokens": context - 3, "temperature": 0, "return_token_ids": True}
    t0 = time.time()
    ids, _, _ = completion(server, long, stream=False)
    alone = time.time() - t0
    check(ids is not None and len(ids) == context - 3, f"a whole-context completion: {ids}")
    want = generate(["--input-ids", "9,8,7", "--max-new-tokens", "4"])[0]
    short = {"prompt": [9, 8, 7], "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    # Streams hang up after two chunks; whole requests, which write nothing
    # until they end, 0.2 s after they were sent.
    for kind, hang_up in (("streams", lambda: server.stream("/v1/completions", long, 2)),
                          ("whole requests", lambda: server.post_and_hang_up("/v1/completions", long, 0.2))):
        threads = [threading.Thread(target=hang_up) for _ in range(args.slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t0 = time.time()
        ids, _, _ = completion(server, short, stream=kind == "streams")
        waited = time.time() - t0
        check(ids == want, f"after {kind} hung up: {ids} vs {want}")
        check(waited < 0.5 * alone, f"after {args.slots} {kind} hung up the next request took {waited:.2f} s, "
                                    f"one of them alone {alone:.2f} s: their slots were not freed")
        print(f"disconnect: {args.slots} {kind} hung up, slots freed ({waited:.2f} s after, {alone:.2f} s alone)")


def check_auth(server):
    if not args.api_key:
        return
    for key in (None, "wrong"):
        s = Server(args.url, api_key=key)
        status, j = s.post("/v1/completions", {"prompt": [1], "max_tokens": 1})
        check(status == 401 and "API key" in j["error"]["message"], f"key {key}: {status} {j}")
        status, _ = s.request("GET", "/v1/models")
        check(status == 401, f"models with key {key}: {status}")
    print("api key: missing or wrong -> 401")


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--tp", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--model-name", help="the served model name: requests name it, /v1/models lists it")
    p.add_argument("--checks", default="auth,greedy,text,chat,bad,disconnect", help="which checks, in order")
    p.add_argument("--expect-cache", help="JSON file keeping tp generate's answers between runs")
    args = p.parse_args()
    server = Server(args.url, api_key=args.api_key)
    server.wait_healthy()
    status, models = server.request("GET", "/v1/models")
    check(status == 200 and models["data"][0]["object"] == "model", f"/v1/models: {status} {models}")
    if args.model_name:
        check(models["data"][0]["id"] == args.model_name, f"/v1/models lists {models['data'][0]['id']}")
        global MODEL_FIELD
        MODEL_FIELD = {"model": args.model_name}
    checks = {"auth": check_auth, "greedy": check_greedy, "text": check_text, "chat": check_chat,
              "bad": check_bad_requests, "disconnect": check_disconnect}
    for name in args.checks.split(","):
        checks[name](server)
    if failures:
        print(f"{len(failures)} failures", file=sys.stderr)
        sys.exit(1)
    print("all server checks passed")


if __name__ == "__main__":
    main()
