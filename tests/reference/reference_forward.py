#!/usr/bin/python3
"""Independent PyTorch forward of the Llama family (Llama, Mistral, Qwen3) and its
mixture-of-experts members (Mixtral, Qwen3-MoE), read straight from config.json
and model.safetensors (the Hub's per-expert tensors): the oracle tp = 1 must match.

Written from the architectures' published math (Transformers' modeling code):
RMSNorm in float32, rotate-half RoPE (default / linear / llama3 scaling),
grouped-query attention with 1/sqrt(head_dim), SiLU-gated MLP, Qwen3's per-head
q_norm/k_norm before RoPE, tied embeddings; MoE: router softmax in float32 over
all experts, top-k, renormalised (Mixtral always, Qwen3-MoE with norm_topk_prob),
each expert a SiLU-gated MLP over the tokens routed to it, weighted and summed;
Qwen3-MoE's dense layers (mlp_only_layers, decoder_sparse_step).

  reference_forward.py write MODELS_DIR GOLDEN_DIR   # (re)write the golden logits
  reference_forward.py check MODELS_DIR GOLDEN_DIR   # recompute; exit 1 if they differ
"""
import json
import math
import os
import struct
import sys

import torch

MODELS = ["llama", "mistral", "qwen3", "mixtral", "qwen3_moe"]
INPUT_IDS = [1, 17, 42, 99, 250, 3, 511, 7, 300, 12]
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]).reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def inv_freq(cfg, head_dim):
    base = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    s = cfg.get("rope_scaling") or {}
    kind = s.get("rope_type", s.get("type", "default"))
    if kind == "linear":
        f = f / s["factor"]
    elif kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        scaled = torch.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = ~(wl < hi_wl) & ~(wl > lo_wl)
        f = torch.where(is_mid, mid, scaled)
    elif kind != "default":
        raise SystemExit(f"rope type {kind} not implemented in the reference")
    return f


def rms_norm(x, w, eps):
    x32 = x.float()
    return w.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def is_sparse_layer(cfg, i):
    if cfg["model_type"] == "mixtral":
        return True
    if cfg["model_type"] != "qwen3_moe":
        return False
    return i not in (cfg.get("mlp_only_layers") or []) and cfg["num_experts"] > 0 and \
        (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def sparse_moe(cfg, w, p, h, expert_load=None, router_logits=None):
    """The MoE block of layer prefix p on h [B, T, H], from the per-expert Hub tensors
    (the router's logits [B*T, E] appended to router_logits when given)."""
    mixtral = cfg["model_type"] == "mixtral"
    block = p + ("block_sparse_moe." if mixtral else "mlp.")
    gate_name, up_name, down_name = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    n_experts = cfg["num_local_experts"] if mixtral else cfg["num_experts"]
    x = h.reshape(-1, h.shape[-1])
    logits = x @ w[block + "gate.weight"].T
    if router_logits is not None:
        router_logits.append(logits)
    probs = logits.float().softmax(dim=-1)
    top_w, top_i = probs.topk(cfg["num_experts_per_tok"], dim=-1)
    if mixtral or cfg.get("norm_topk_prob", False):
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(n_experts):
        token, slot = (top_i == e).nonzero(as_tuple=True)
        if expert_load is not None:
            expert_load.append(len(token))
        if len(token) == 0:
            continue
        ex = f"{block}experts.{e}."
        xe = x[token]
        act = torch.nn.functional.silu(xe @ w[ex + gate_name + ".weight"].T) * (xe @ w[ex + up_name + ".weight"].T)
        out.index_add_(0, token, (act @ w[ex + down_name + ".weight"].T) * top_w[token, slot, None])
    return out.view_as(h)


def load_model(model_dir):
    """config.json and the checkpoint's tensors as float32, in the file's order."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = {k: v.float() for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    return cfg, w


def forward_batch(cfg, w, ids, expert_loads=None, router_logits=None):
    """Logits [B, T, V] of int64 ids [B, T] (causal, positions 0..T-1 in every row). The
    tensors in w may be autograd leaves (the training oracle passes nn.Parameters);
    router_logits, when given, collects every sparse layer's router logits."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    B, T = ids.shape
    pos = torch.arange(T).float()
    ang = torch.outer(pos, inv_freq(cfg, D))
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    mask = torch.full((T, T), float("-inf")).triu(1)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, nh, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, nkv, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, nkv, D)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=2)
        v = v.repeat_interleave(nh // nkv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D) + mask
        att = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, nh * D)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if is_sparse_layer(cfg, i):
            load = [] if expert_loads is not None else None
            x = x + sparse_moe(cfg, w, p, h, load, router_logits)
            if expert_loads is not None:
                expert_loads.append(load)
            continue
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def forward(model_dir, ids):
    cfg, w = load_model(model_dir)
    loads = []
    logits = forward_batch(cfg, w, torch.tensor([ids]), loads)[0]
    if loads:  # the test models route layer 0 unevenly (tests/models/skew_router.py): say so, and check it
        print(f"{os.path.basename(model_dir)}: tokens per expert per MoE layer {loads}")
        for load in loads:
            assert max(load) == len(ids) and min(load) == 0, "each MoE layer should route unevenly"
    return logits


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("write", "check"):
        raise SystemExit(__doc__)
    mode, models_dir, golden_dir = sys.argv[1:]
    torch.set_num_threads(1)
    bad = 0
    for name in MODELS:
        with torch.no_grad():
            logits = forward(os.path.join(models_dir, name), INPUT_IDS)
        path = os.path.join(golden_dir, f"{name}.safetensors")
        if mode == "write":
            write_safetensors(path, {"input_ids": torch.tensor(INPUT_IDS, dtype=torch.float32), "logits": logits})
            print(f"wrote {path}: logits {list(logits.shape)}")
            continue
        golden = read_safetensors(path)["logits"]
        diff = (golden - logits).abs().max().item()
        scale = golden.abs().max().item()
        ok = diff <= 1e-5 * scale
        print(f"{name}: max |reference - committed golden| = {diff:.3g} (max |logit| {scale:.3g}) {'ok' if ok else 'DIFFERENT'}")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
