#!/usr/bin/env python3
"""A config.json that contradicts its weights, or names sizes no model could
have, must make every command exit 1 with the key and both values in the
message, in well under a second and a few tens of MB (issue 18).

usage: test_config_contradictions.py TP_BINARY
Each command runs alone and is measured with wait4 (its own wall time and peak RSS).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TP = sys.argv[1]
MAX_SECONDS = 0.5
MAX_RSS_MB = 64


def run(args):
    """(exit code, stderr, seconds, peak RSS in MB) of one tp command."""
    t0 = time.monotonic()
    p = subprocess.Popen([TP] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.monotonic() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, seconds, usage.ru_maxrss / 1024


def case_dir(root, base, name, edit):
    """A model directory: `base`'s weights (linked) under its config with `edit` applied."""
    d = os.path.join(root, name)
    os.makedirs(d)
    os.symlink(os.path.join(base, "model.safetensors"), os.path.join(d, "model.safetensors"))
    cfg = json.load(open(os.path.join(base, "config.json")))
    edit(cfg)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d


def setter(**kv):
    return lambda cfg: cfg.update(kv)


def main():
    root = tempfile.mkdtemp()
    try:
        bases = {}
        for arch in ("llama", "qwen3"):
            bases[arch] = os.path.join(root, "base-" + arch)
            subprocess.run([TP, "make-model", "--arch", arch, "--preset", "tiny", "--out", bases[arch]],
                           check=True, stdout=subprocess.DEVNULL)
        data = os.path.join(root, "data.txt")
        open(data, "w").write("hello\n")
        # (arch, edit, what the message must hold)
        cases = [
            ("llama", setter(num_hidden_layers=100000000),
             ["'num_hidden_layers' is 100000000", "hold 2 layers"]),
            ("qwen3", setter(num_hidden_layers=1000000), ["'num_hidden_layers' is 1000000", "hold 2 layers"]),
            ("qwen3", setter(num_hidden_layers=1), ["'num_hidden_layers' is 1 ", "hold 2 layers"]),
            ("llama", setter(hidden_size=4096), ["'hidden_size' is 4096", "hidden size 192"]),
            ("llama", setter(intermediate_size=11008), ["'intermediate_size' is 11008", "have 384"]),
            ("qwen3", setter(vocab_size=151936), ["'vocab_size' is 151936", "516 token embeddings"]),
            ("llama", setter(num_attention_heads=12), ["'num_attention_heads' (12)", "has 192 rows"]),
            ("llama", setter(num_key_value_heads=4), ["'num_key_value_heads' (4)", "has 96 rows"]),
            ("qwen3", setter(head_dim=128), ["'head_dim' (128)", "head_dim 16"]),
            ("qwen3", setter(tie_word_embeddings=False), ["'tie_word_embeddings' is false", "no lm_head.weight"]),
        ]
        commands = {
            "forward": lambda d: ["forward", "--model", d, "--input-ids", "1,2,3", "--out", os.path.join(d, "o.st")],
            "generate": lambda d: ["generate", "--model", d, "--input-ids", "1,2,3", "--max-new-tokens", "2"],
            "inspect": lambda d: ["inspect", "--model", d],
            "plan": lambda d: ["plan", "--model", d, "--tp-size", "2"],
            "train": lambda d: ["train", "--model", d, "--data", data, "--output-dir", os.path.join(d, "out")],
        }
        failures = []
        worst_s = worst_mb = 0.0
        for i, (arch, edit, expected) in enumerate(cases):
            d = case_dir(root, bases[arch], f"case{i}", edit)
            for name, make in commands.items():
                rc, err, s, mb = run(make(d))
                worst_s, worst_mb = max(worst_s, s), max(worst_mb, mb)
                ok = rc == 1 and all(e in err for e in expected) and "config.json" in err
                if not ok or s > MAX_SECONDS or mb > MAX_RSS_MB:
                    failures.append(f"{name} case{i} ({expected[0]}): rc={rc} {s:.3f}s {mb:.0f}MB: {err.strip()}")
        # A config alone (no weights): tp plan bounds the module tree instead.
        alone = os.path.join(root, "config-only")
        os.makedirs(alone)
        cfg = json.load(open(os.path.join(bases["llama"], "config.json")))
        cfg["num_hidden_layers"] = 100000000
        json.dump(cfg, open(os.path.join(alone, "config.json"), "w"))
        rc, err, s, mb = run(commands["plan"](alone))
        if rc != 1 or "'num_hidden_layers' is 100000000: building the module tree alone" not in err \
                or s > MAX_SECONDS or mb > MAX_RSS_MB:
            failures.append(f"plan on a config alone: rc={rc} {s:.3f}s {mb:.0f}MB: {err.strip()}")
        # The unedited models still run.
        rc, err, _, _ = run(commands["forward"](bases["llama"]))
        if rc != 0:
            failures.append(f"forward on the unedited model: rc={rc}: {err}")
        print(f"{len(cases) * len(commands) + 1} refusals: slowest {worst_s:.3f} s, largest peak RSS {worst_mb:.0f} MB")
        if failures:
            print("\n".join(failures))
            return 1
        return 0
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    sys.exit(main())
