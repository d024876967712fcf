#!/usr/bin/env python3
"""Issue 28's quality report: the perplexity of the demo's trained model (scripts/demo's out/demo-trained, a 4-layer
Llama trained on fortunes) on held-out text, with its weights as trained and as tp quantize writes them (GPTQ
round-to-nearest 8-bit and 4-bit). Reported, not asserted.

Held-out text: fortune files the demo does not train on (default science, computers, art, miscellaneous). Each
fortune is encoded with BOS, followed by EOS, the ids concatenated and cut into blocks of --seq-len; perplexity is
exp of the mean next-token negative log-likelihood over every block (Transformers' causal-LM loss, no sliding
window), computed here in float64 from the f32 logits `import tp` returns.

The demo model's intermediate size (688 = 43 x 16) takes no group of 32 or more, so the grouped variants use groups
of 16; "-1" is one scale per output row.

  PYTHONPATH=build/python /usr/bin/python3 bench/models/quant_perplexity.py [--model out/demo-trained]
      [--build build] [--blocks 64] [--seq-len 128] [--json F]
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

import tp

VARIANTS = [("int8-g16", ["--bits", "8", "--group-size", "16"]),
            ("int4-g16", ["--bits", "4", "--group-size", "16"]),
            ("int4-channel", ["--bits", "4", "--group-size", "-1"])]
FORTUNES = "/usr/share/games/fortunes"


def held_out_ids(tokenizer, files, seq_len, blocks):
    ids = []
    for name in files:
        with open(os.path.join(FORTUNES, name), encoding="utf-8", errors="replace") as f:
            for fortune in f.read().split("\n%\n"):
                fortune = fortune.strip("\n%")
                if fortune.strip():
                    ids += tokenizer.encode(fortune) + [tokenizer.eos_token_id]
    usable = min(blocks, len(ids) // seq_len)
    if usable == 0:
        sys.exit(f"quant_perplexity: {files} hold {len(ids)} tokens, fewer than one block of {seq_len}")
    return np.array(ids[:usable * seq_len], dtype=np.int64).reshape(usable, seq_len)


def mean_nll(model, blocks, batch=8):
    total, count = 0.0, 0
    for b in range(0, len(blocks), batch):
        ids = blocks[b:b + batch]
        logits = np.asarray(model(ids.tolist()).logits, dtype=np.float64)[:, :-1]
        top = logits.max(axis=-1, keepdims=True)
        log_z = (top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1)))
        target = np.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        total += float((log_z - target).sum())
        count += target.size
    return total / count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="out/demo-trained")
    ap.add_argument("--build", default="build")
    ap.add_argument("--held-out", nargs="+", default=["science", "computers", "art", "miscellaneous"])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        sys.exit(f"quant_perplexity: {a.model}/config.json not found: run scripts/demo first (it trains the model)")

    models = {"as trained": a.model}
    for name, flags in VARIANTS:
        out = f"{a.model.rstrip('/')}-{name}"
        if not os.path.exists(os.path.join(out, "config.json")):
            subprocess.run([os.path.join(a.build, "src", "tp"), "quantize", "--model", a.model, "--out", out,
                            "--format", "gptq"] + flags, check=True)
        models[name] = out
    tokenizer = tp.AutoTokenizer.from_pretrained(a.model)
    blocks = held_out_ids(tokenizer, a.held_out, a.seq_len, a.blocks)
    with open(os.path.join(a.model, "config.json")) as f:
        dtype = json.load(f).get("torch_dtype", "?")
    print(f"{a.model}: perplexity on {blocks.size} held-out tokens ({len(blocks)} blocks of {a.seq_len}) from "
          f"fortunes {', '.join(a.held_out)}")
    results = {}
    for name, path in models.items():
        model = tp.AutoModelForCausalLM.from_pretrained(path, verbose=False)
        nll = mean_nll(model, blocks)
        results[name] = {"model": path, "mean_nll": nll, "perplexity": math.exp(nll)}
        label = f"{name} ({dtype})" if name == "as trained" else name
        print(f"  {label:>20}: perplexity {math.exp(nll):8.3f}  (mean NLL {nll:.4f}, "
              f"{math.exp(nll) / results['as trained']['perplexity']:.3f}x as trained)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tokens": int(blocks.size), "held_out": a.held_out, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
