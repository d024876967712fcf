#!/usr/bin/python3
"""Independent PyTorch oracle of LoRA adapter training (PEFT's LoRA, tp = 1 must match) on a
frozen *-train test model: the loss, accumulation, clipping, optimizer and schedule of
reference_training.py, with only the adapter tensors trainable.

LoRA math (PEFT's published formulas, dropout 0, no LoRA bias): every targeted Linear with
frozen weight W [out, in] computes  y = x W^T + scaling * (x A^T) B^T  with A = lora_A.weight
[R, in], B = lora_B.weight [out, R], scaling = LORA_ALPHA / R. The oracle feeds
reference_forward.forward_batch the effective weight  W + scaling * (B @ A)  (identical math;
autograd carries the gradients to A and B), rebuilt for every micro-batch. The base
checkpoint's tensors are plain tensors without grad.
Targets: the model's projections in every layer (targets_of: q/k/v/o_proj, gate/up/down_proj;
Phi-3's fused qkv_proj, o_proj, gate_up_proj, down_proj).

Initial adapter: one torch.Generator seeded INIT_SEED, drawn layer by layer (ascending), module
by module in targets_of's order, A then B: A ~ uniform(-1/sqrt(in), 1/sqrt(in)) (what
PEFT's kaiming_uniform_(a=sqrt(5)) draws from), B ~ normal(0, INIT_B_STD) -- not PEFT's zeros,
so that step 0 already gives A a nonzero gradient.

Inputs: reference_training.make_batches on the model's vocab (the same ids and labels).
Per optimizer step s (0-based), STEPS steps of ACCUM micro-batches of [BATCH, SEQ_LEN]:
  zero grads; N = non-ignored shifted targets over the whole step (all micro-batches);
  per micro-batch: backward of sum(token cross-entropies) / N  (logits[t] predict labels[t+1]);
  loss[s] = sum of the micro-batch partials; grad_norm[s] = pre-clip L2 total norm over the
  adapter tensors; clip_grad_norm_(MAX_GRAD_NORM) over the adapter tensors; lr[s] = the lr
  AdamW uses; optimizer.step(); scheduler.step().
AdamW (torch.optim.AdamW) with Trainer's decay groups (reference_training.decayed on the PEFT
key names: every lora_A/lora_B weight decays with WEIGHT_DECAY); warmup + cosine LambdaLR
(reference_training.lr_factor) with peak BASE_LR (larger than full training's).

Files, for each model M (GOLDEN_DIR/...):
  lora_<M>_init/adapter_config.json        PEFT LoraConfig of the initial adapter
  lora_<M>_init/adapter_model.safetensors  the initial adapter, PEFT key names, F32:
      base_model.model.model.layers.<i>.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight,
      base_model.model.model.layers.<i>.mlp.{gate,up,down}_proj.lora_{A,B}.weight
  lora_<M>.safetensors                     input_ids, labels (I64 [STEPS, ACCUM, BATCH, SEQ_LEN]),
      loss, grad_norm, lr (F32 [STEPS]), grad0.<PEFT key> (step 0's adapter gradients summed
      over its micro-batches, before clipping), final.<PEFT key> (adapter after STEPS steps);
      __metadata__ holds every hyperparameter.

  reference_lora.py write MODELS_DIR GOLDEN_DIR [MODEL...]  # (re)write the files above (of MODELs only)
  reference_lora.py check MODELS_DIR GOLDEN_DIR   # recompute; exit 1 if anything moved
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_forward import load_model  # noqa: E402
from reference_training import (  # noqa: E402
    ACCUM, BATCH, BETA1, BETA2, EPS, IGNORE_INDEX, SEQ_LEN, STEPS, WARMUP_STEPS, WEIGHT_DECAY,
    compare_tensors, decayed, read_safetensors, write_safetensors)
import reference_training  # noqa: E402

MODELS = {"llama": "llama-train", "qwen3": "qwen3-train", "qwen2": "qwen2-train", "phi3": "phi3-train",
          "gemma3": "gemma3-train"}

R, LORA_ALPHA = 4, 8
SCALING = LORA_ALPHA / R
# (module path inside a layer, PEFT target name), in the initial adapter's draw order.
LLAMA_TARGETS = [("self_attn.q_proj", "q_proj"), ("self_attn.k_proj", "k_proj"), ("self_attn.v_proj", "v_proj"),
                 ("self_attn.o_proj", "o_proj"), ("mlp.gate_proj", "gate_proj"), ("mlp.up_proj", "up_proj"),
                 ("mlp.down_proj", "down_proj")]
# Phi-3's projections are fused (q|k|v, gate|up): an adapter on each fused Linear.
PHI3_TARGETS = [("self_attn.qkv_proj", "qkv_proj"), ("self_attn.o_proj", "o_proj"),
                ("mlp.gate_up_proj", "gate_up_proj"), ("mlp.down_proj", "down_proj")]


def targets_of(cfg):
    return PHI3_TARGETS if cfg["model_type"] == "phi3" else LLAMA_TARGETS


def target_modules(cfg):
    return [t for _, t in targets_of(cfg)]
INIT_SEED = 4321
INIT_B_STD = 0.05
BASE_LR = 1e-2  # full training's 2e-3 barely moves the adapter; this one takes the loss down clearly
MAX_GRAD_NORM = 0.97  # between the pre-clip norms (>= 0.028 from each): clips 7 of 20 steps (llama), 6 (qwen3)
RTOL = reference_training.RTOL
PEFT_PREFIX = "base_model.model."


def adapter_config(model, cfg):
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": LORA_ALPHA,
        "lora_dropout": 0.0, "target_modules": sorted(target_modules(cfg)), "bias": "none",
        "use_rslora": False, "fan_in_fan_out": False, "init_lora_weights": True,
        "inference_mode": True, "base_model_name_or_path": model, "modules_to_save": None,
    }


def metadata(model, cfg):
    return {
        "model": model, "steps": str(STEPS), "accum": str(ACCUM), "batch": str(BATCH), "seq_len": str(SEQ_LEN),
        "seed": str(reference_training.SEED), "token_stride": str(reference_training.TOKEN_STRIDE),
        "token_offset": str(reference_training.TOKEN_OFFSET),
        "base_lr": repr(BASE_LR), "warmup_steps": str(WARMUP_STEPS), "lr_scheduler": "cosine",
        "max_grad_norm": repr(MAX_GRAD_NORM), "weight_decay": repr(WEIGHT_DECAY), "beta1": repr(BETA1),
        "beta2": repr(BETA2), "eps": repr(EPS), "ignore_index": str(IGNORE_INDEX),
        "no_decay": " ".join(reference_training.NO_DECAY), "loss_normalizer": "non-ignored targets per optimizer step",
        "lora_r": str(R), "lora_alpha": str(LORA_ALPHA), "lora_scaling": repr(SCALING), "lora_dropout": "0.0",
        "lora_bias": "none", "target_modules": " ".join(target_modules(cfg)), "init_seed": str(INIT_SEED),
        "init_a": "uniform(-1/sqrt(in), 1/sqrt(in))", "init_b": f"normal(0, {INIT_B_STD!r})",
        "init_order": "layers ascending, target_modules in the order above, A then B",
    }


def init_adapter(cfg, w):
    """{PEFT key: tensor} of the initial adapter, in the draw order."""
    g = torch.Generator().manual_seed(INIT_SEED)
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        for path, _ in targets_of(cfg):
            n_out, n_in = w[f"model.layers.{i}.{path}.weight"].shape
            key = f"{PEFT_PREFIX}model.layers.{i}.{path}"
            bound = 1.0 / math.sqrt(n_in)
            out[key + ".lora_A.weight"] = torch.empty(R, n_in).uniform_(-bound, bound, generator=g)
            out[key + ".lora_B.weight"] = torch.empty(n_out, R).normal_(0.0, INIT_B_STD, generator=g)
    return out


def effective_weights(cfg, w, lora):
    """The checkpoint's tensors with every targeted weight W replaced by W + scaling * B @ A."""
    eff = dict(w)
    for i in range(cfg["num_hidden_layers"]):
        for path, _ in targets_of(cfg):
            base = f"model.layers.{i}.{path}"
            a, b = lora[f"{PEFT_PREFIX}{base}.lora_A.weight"], lora[f"{PEFT_PREFIX}{base}.lora_B.weight"]
            eff[base + ".weight"] = w[base + ".weight"] + SCALING * (b @ a)
    return eff


def train(model_dir):
    """(initial adapter, golden tensors, config)."""
    cfg, w = load_model(model_dir)
    init = init_adapter(cfg, w)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    out, grad0 = reference_training.optimize(cfg, params, lambda: effective_weights(cfg, w, params), BASE_LR,
                                             MAX_GRAD_NORM)
    for k, gr in grad0.items():
        out["grad0." + k] = gr
    return init, out, cfg


def report(model, out):
    clipped = int((out["grad_norm"] > MAX_GRAD_NORM).sum())
    nodecay = [k[len("final."):] for k in out if k.startswith("final.") and not decayed(k[len("final."):])]
    margin = (out["grad_norm"] - MAX_GRAD_NORM).abs().min().item()
    print(f"{model}: {clipped}/{STEPS} steps clipped (max_grad_norm {MAX_GRAD_NORM}, closest pre-clip norm "
          f"{margin:.3g} away); lr {BASE_LR}; no weight decay: {' '.join(nodecay) or '(none)'}")
    for s in range(STEPS):
        print(f"  step {s:2d}  lr {out['lr'][s].item():.6g}  loss {out['loss'][s].item():.6f}"
              f"  grad_norm {out['grad_norm'][s].item():.6f}")


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
        init, out, cfg = train(os.path.join(models_dir, dirname))
        path = os.path.join(golden_dir, f"lora_{model}.safetensors")
        init_dir = os.path.join(golden_dir, f"lora_{model}_init")
        init_path = os.path.join(init_dir, "adapter_model.safetensors")
        config_path = os.path.join(init_dir, "adapter_config.json")
        if mode == "write":
            report(model, out)
            os.makedirs(init_dir, exist_ok=True)
            with open(config_path, "w") as f:
                json.dump(adapter_config(dirname, cfg), f, indent=2)
                f.write("\n")
            write_safetensors(init_path, init, {"format": "pt"})
            write_safetensors(path, out, metadata(dirname, cfg))
            for p in (config_path, init_path, path):
                print(f"wrote {p} ({os.path.getsize(p)} bytes)")
            continue
        bad = []
        golden, meta = read_safetensors(path)
        want = metadata(dirname, cfg)
        if meta != want:
            bad.append(f"metadata {meta} != {want}")
        bad += compare_tensors(os.path.basename(path), golden, out)
        golden_init, init_meta = read_safetensors(init_path)
        if init_meta != {"format": "pt"}:
            bad.append(f"{init_path}: metadata {init_meta} != {{'format': 'pt'}}")
        bad += compare_tensors("adapter_model.safetensors", golden_init, init)
        config = json.load(open(config_path))
        if config != adapter_config(dirname, cfg):
            bad.append(f"adapter_config.json {config} != {adapter_config(dirname, cfg)}")
        first, last = out["loss"][0].item(), out["loss"][-1].item()
        print(f"{model}: loss {first:.4f} -> {last:.4f}, {'ok' if not bad else 'DIFFERENT'}")
        for b in bad:
            print("  " + b)
        nbad += bool(bad)
    sys.exit(1 if nbad else 0)


if __name__ == "__main__":
    main()
