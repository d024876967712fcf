#!/usr/bin/python3
"""Independent PyTorch oracle of training (tp = 1 must match): causal-LM loss with
gradient accumulation, grad-norm clipping, AdamW with Hugging Face Trainer's
weight-decay groups and a warmup + cosine schedule, on the *-train test models.

Model math: reference_forward.forward_batch (the published Llama/Mistral/Qwen3/Qwen2/Phi-3/Gemma 3 math)
with every checkpoint tensor an f32 nn.Parameter. Optimizer, clipping and schedule are
torch's own (torch.optim.AdamW, clip_grad_norm_, LambdaLR), with Transformers' formulas.

Inputs: seeded ids on a sub-vocabulary (see TOKEN_STRIDE), labels = ids with a fixed sprinkle
of IGNORE_INDEX and one wholly ignored sequence; both are stored in the golden file.
Per optimizer step s (0-based), STEPS steps of ACCUM micro-batches of [BATCH, SEQ_LEN]:
  zero grads; N = non-ignored shifted targets over the whole step (all micro-batches);
  per micro-batch: backward of sum(token cross-entropies) / N  (logits[t] predict labels[t+1]);
  loss[s] = sum of the micro-batch partials; grad_norm[s] = pre-clip L2 total norm;
  clip_grad_norm_(max_grad_norm); lr[s] = the lr AdamW uses; optimizer.step(); scheduler.step().

MoE (qwen3_moe-train, output_router_logits true): each micro-batch's loss also gets
router_aux_loss_coef * load_balancing_loss_func(every sparse layer's router logits) (Transformers:
softmax over the concatenated logits, top-k one-hots; E * sum(mean one-hot * mean probability)),
not divided by ACCUM (the Trainer does not divide a loss that takes num_items_in_batch); aux_loss[s]
is the mean of the micro-batches' aux losses. The experts are trained as the per-expert Hub
tensors (an expert no token reached gets a zero gradient, so weight decay and AdamW's moments
apply to it as to its slice of v5's fused tensor); final.<fused v5 name> stacks them (gate_up_proj [E, 2I, H] = [gate; up], down_proj [E, H, I]).

Golden file (safetensors): input_ids, labels (I64 [STEPS, ACCUM, BATCH, SEQ_LEN]),
loss, grad_norm, lr (F32 [STEPS]), aux_loss (MoE), final.<tensor> (F32, weights after STEPS steps);
__metadata__ holds every hyperparameter.

  reference_training.py write MODELS_DIR GOLDEN_DIR [MODEL...]  # (re)write golden/train_<model>.safetensors
  reference_training.py check MODELS_DIR GOLDEN_DIR   # recompute; exit 1 if anything moved
"""
import json
import math
import os
import re
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_forward import forward_batch, load_model  # noqa: E402

MODELS = {"llama": "llama-train", "mistral": "mistral-train", "qwen3": "qwen3-train", "qwen3_moe": "qwen3_moe-train",
          "qwen2": "qwen2-train", "phi3": "phi3-train",
          "gemma3": "gemma3-train"}

STEPS, ACCUM, BATCH, SEQ_LEN = 20, 2, 2, 16
SEED = 1234
# Tokens: TOKEN_STRIDE * u + TOKEN_OFFSET with u uniform in [0, vocab_size / TOKEN_STRIDE): 16 of
# the 128 ids, spread over every vocab shard. Uniform ids over the whole vocab cannot be learned
# (the loss stays at ln 128); on this sub-vocabulary the loss falls from 4.9 to 3.8 in 20 steps.
TOKEN_STRIDE, TOKEN_OFFSET = 8, 5
BASE_LR = 2e-3
WARMUP_STEPS = 3
MAX_GRAD_NORM = 2.5  # between the pre-clip norms: clips 6 of 20 steps (llama), 8 (qwen3)
WEIGHT_DECAY = 0.1
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
IGNORE_INDEX = -100
# (step, accum, b) of the one sequence whose targets are all ignored: the micro-batches
# of that step hold different target counts, so a per-micro-batch mean would differ.
IGNORED_SEQUENCE = (5, 1, 0)
# Hugging Face Trainer's no-decay rule (get_parameter_names on lowercased names).
NO_DECAY = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
RTOL = 1e-6


def metadata(model, cfg):
    moe = {}
    if cfg.get("output_router_logits"):
        moe = {"router_aux_loss_coef": repr(cfg["router_aux_loss_coef"]), "num_experts_per_tok": str(cfg["num_experts_per_tok"])}
    return moe | {
        "model": model, "steps": str(STEPS), "accum": str(ACCUM), "batch": str(BATCH), "seq_len": str(SEQ_LEN),
        "seed": str(SEED), "token_stride": str(TOKEN_STRIDE), "token_offset": str(TOKEN_OFFSET),
        "base_lr": repr(BASE_LR), "warmup_steps": str(WARMUP_STEPS), "lr_scheduler": "cosine",
        "max_grad_norm": repr(MAX_GRAD_NORM), "weight_decay": repr(WEIGHT_DECAY), "beta1": repr(BETA1),
        "beta2": repr(BETA2), "eps": repr(EPS), "ignore_index": str(IGNORE_INDEX),
        "no_decay": " ".join(NO_DECAY), "loss_normalizer": "non-ignored targets per optimizer step",
    }


DTYPE_NAMES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, meta):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """(tensors, metadata); F32 and I64 only."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtypes[e["dtype"]]).reshape(e["shape"]).clone()
    return out, meta


def make_batches(vocab_size):
    g = torch.Generator().manual_seed(SEED)
    u = torch.randint(0, vocab_size // TOKEN_STRIDE, (STEPS, ACCUM, BATCH, SEQ_LEN), generator=g, dtype=torch.int64)
    ids = u * TOKEN_STRIDE + TOKEN_OFFSET
    labels = ids.clone()
    for s in range(STEPS):
        for a in range(ACCUM):
            for b in range(BATCH):
                for t in range(SEQ_LEN):
                    if (s * 7 + a * 3 + b * 5 + t) % 11 == 0:
                        labels[s, a, b, t] = IGNORE_INDEX
    labels[IGNORED_SEQUENCE] = IGNORE_INDEX
    return ids, labels


def lr_factor(s):
    if s < WARMUP_STEPS:
        return s / max(1, WARMUP_STEPS)
    p = (s - WARMUP_STEPS) / max(1, STEPS - WARMUP_STEPS)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * p)))


def load_balancing_loss(router_logits, num_experts, top_k):
    """Transformers' load_balancing_loss_func without an attention mask."""
    logits = torch.cat(router_logits, dim=0)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    _, chosen = torch.topk(probs, top_k, dim=-1)
    one_hot = torch.nn.functional.one_hot(chosen, num_experts)  # [M, K, E]
    tokens_per_expert = one_hot.float().mean(dim=0)            # [K, E]
    prob_per_expert = probs.mean(dim=0)                         # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts


def fused_experts(params):
    """Per-expert Hub tensors -> Transformers v5's fused names (what tp trains)."""
    out, done = {}, set()
    for k, p in params.items():
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if not m:
            out[k] = p.detach().clone()
            continue
        prefix = m.group(1)
        if prefix in done:
            continue
        done.add(prefix)
        n = 1 + max(int(re.match(re.escape(prefix) + r"\.(\d+)\.", j).group(1)) for j in params
                    if j.startswith(prefix + "."))
        e = lambda i, what: params[f"{prefix}.{i}.{what}_proj.weight"].detach()  # noqa: E731
        out[prefix + ".gate_up_proj"] = torch.stack([torch.cat([e(i, "gate"), e(i, "up")], dim=0) for i in range(n)])
        out[prefix + ".down_proj"] = torch.stack([e(i, "down") for i in range(n)])
    return out


def decayed(name):
    return not any(re.search(r, name.lower()) for r in NO_DECAY)


def optimize(cfg, params, weights, base_lr, max_grad_norm):
    """STEPS optimizer steps on `params` (name -> nn.Parameter); weights() gives the
    tensors the forward uses, anew for each micro-batch. (golden tensors, step 0's grads)."""
    ids, labels = make_batches(cfg["vocab_size"])
    groups = [
        {"params": [p for k, p in params.items() if decayed(k)], "weight_decay": WEIGHT_DECAY},
        {"params": [p for k, p in params.items() if not decayed(k)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=base_lr, betas=(BETA1, BETA2), eps=EPS, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    plist = list(params.values())
    aux_coef = cfg["router_aux_loss_coef"] if cfg.get("output_router_logits") else None
    n_experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    losses, norms, lrs, auxes, grad0 = [], [], [], [], {}
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        n = int((labels[s, :, :, 1:] != IGNORE_INDEX).sum())
        loss = torch.zeros((), dtype=torch.float32)
        aux_sum = 0.0
        for a in range(ACCUM):
            router_logits = []
            logits = forward_batch(cfg, weights(), ids[s, a], router_logits=router_logits)
            part = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[s, a, :, 1:].reshape(-1),
                ignore_index=IGNORE_INDEX, reduction="sum") / n
            if aux_coef is not None:
                aux = load_balancing_loss(router_logits, n_experts, cfg["num_experts_per_tok"])
                aux_sum += float(aux)
                part = part + aux_coef * aux
            part.backward()
            loss = loss + part.detach()
        for p in plist:  # an expert no token reached: a zero gradient, as its slice of v5's fused tensor has
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if s == 0:
            grad0 = {k: p.grad.detach().clone() for k, p in params.items()}
        norms.append(float(torch.nn.utils.clip_grad_norm_(plist, max_grad_norm)))
        lrs.append(opt.param_groups[0]["lr"])
        losses.append(float(loss))
        auxes.append(aux_sum / ACCUM)
        opt.step()
        sched.step()
    out = {"input_ids": ids, "labels": labels,
           "loss": torch.tensor(losses, dtype=torch.float32),
           "grad_norm": torch.tensor(norms, dtype=torch.float32),
           "lr": torch.tensor(lrs, dtype=torch.float32)}
    if aux_coef is not None:
        out["aux_loss"] = torch.tensor(auxes, dtype=torch.float32)
    for k, p in fused_experts(params).items():
        out["final." + k] = p
    return out, grad0


def train(model_dir):
    cfg, w = load_model(model_dir)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in w.items()}
    out, _ = optimize(cfg, params, lambda: params, BASE_LR, MAX_GRAD_NORM)
    return out, cfg


def report(model, out):
    clipped = int((out["grad_norm"] > MAX_GRAD_NORM).sum())
    nodecay = [k[len("final."):] for k in out if k.startswith("final.") and not decayed(k[len("final."):])]
    print(f"{model}: {clipped}/{STEPS} steps clipped (max_grad_norm {MAX_GRAD_NORM}); "
          f"no weight decay: {' '.join(nodecay)}")
    for s in range(STEPS):
        print(f"  step {s:2d}  lr {out['lr'][s].item():.6g}  loss {out['loss'][s].item():.6f}"
              f"  grad_norm {out['grad_norm'][s].item():.6f}")


def compare_tensors(what, golden, out):
    bad = []
    if set(golden) != set(out):
        bad.append(f"{what}: tensor names differ: only golden {sorted(set(golden) - set(out))},"
                   f" only recomputed {sorted(set(out) - set(golden))}")
    for k in out:
        if k not in golden:
            continue
        g, o = golden[k], out[k]
        if g.dtype != o.dtype or g.shape != o.shape:
            bad.append(f"{what} {k}: {g.dtype} {list(g.shape)} vs recomputed {o.dtype} {list(o.shape)}")
        elif g.dtype == torch.int64:
            if not torch.equal(g, o):
                bad.append(f"{what} {k}: differs")
        else:
            diff = (g - o).abs().max().item()
            scale = g.abs().max().item()
            if not diff <= RTOL * scale:
                bad.append(f"{what} {k}: max |diff| {diff:.3g} > {RTOL:g} * max |golden| {scale:.3g}")
    return bad


def compare(model, golden, meta, out, cfg):
    bad = []
    want = metadata(model, cfg)
    if meta != want:
        bad.append(f"metadata {meta} != {want}")
    return bad + compare_tensors(model, golden, out)


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("write", "check") or (sys.argv[1] == "check" and len(sys.argv) > 4):
        raise SystemExit(__doc__)
    mode, models_dir, golden_dir = sys.argv[1:4]
    names = sys.argv[4:] or list(MODELS)
    if any(n not in MODELS for n in names):
        raise SystemExit(f"unknown model(s) in {names}; known: {list(MODELS)}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    nbad = 0
    for model, dirname in ((n, MODELS[n]) for n in names):
        out, cfg = train(os.path.join(models_dir, dirname))
        path = os.path.join(golden_dir, f"train_{model}.safetensors")
        if mode == "write":
            report(model, out)
            write_safetensors(path, out, metadata(dirname, cfg))
            print(f"wrote {path} ({os.path.getsize(path)} bytes)")
            continue
        golden, meta = read_safetensors(path)
        bad = compare(dirname, golden, meta, out, cfg)
        first, last = out["loss"][0].item(), out["loss"][-1].item()
        print(f"{model}: loss {first:.4f} -> {last:.4f}, {'ok' if not bad else 'DIFFERENT'}")
        for b in bad:
            print("  " + b)
        nbad += bool(bad)
    sys.exit(1 if nbad else 0)


if __name__ == "__main__":
    main()
