#!/usr/bin/python3
"""Independent PyTorch forward of the Llama family (Llama, Mistral, Qwen3), its
mixture-of-experts members (Mixtral, Qwen3-MoE) and DeepSeek-V2/V3 (multi-head
latent attention, MoE with shared experts), read straight from config.json and
model.safetensors (the Hub's per-expert tensors): the oracle tp = 1 must match.

Written from the architectures' published math (Transformers' modeling code):
RMSNorm in float32, rotate-half RoPE (default / linear / llama3 scaling),
grouped-query attention with 1/sqrt(head_dim), sliding windows (query i sees keys
(i - W, i]) on the layers each config gives them (attention_windows), SiLU-gated
MLP (with Llama's mlp_bias), Qwen3's per-head q_norm/k_norm before RoPE,
Qwen2's biases on q/k/v (none on o_proj) and its window rule (Qwen3's),
tied embeddings; MoE: router softmax in float32 over all experts, top-k,
renormalised (Mixtral always, Qwen3-MoE with norm_topk_prob), each expert a
SiLU-gated MLP over the tokens routed to it, weighted and summed; Qwen3-MoE's
dense layers (mlp_only_layers, decoder_sparse_step). DeepSeek: layers from
first_k_dense_replace are MoE; V2 softmax scores, greedy or group-limited (a
group's score its max, topk_group groups kept), times routed_scaling_factor, no
renormalisation; V3 sigmoid scores, e_score_correction_bias added only to choose,
a group's score the sum of its top-2, renormalised (norm_topk_prob) then scaled;
both add the shared experts' MLP unweighted. V3's RoPE de-interleaves the rope
dims then rotates halves (rope_interleave).
GPT-OSS: biases on q/k/v/o, a sink logit per head in every softmax's
denominator, alternating sliding-window / full attention (layer_types), yarn
RoPE (cos and sin times its attention factor), router logits with a bias, top-k
of the raw logits then a softmax over the k, experts in x @ W layout with gate /
up columns interleaved (0::2 / 1::2), biases, the clamped SwiGLU
(up + 1) * gate * sigmoid(1.702 gate) with gate <= limit, |up| <= limit; MXFP4
expert weights (*_blocks, *_scales) dequantised as published (mxfp4_dequantise).
Phi-3: one qkv_proj (q, then k, then v rows) and one gate_up_proj (gate rows, then
up), RoPE on the first int(head_dim * partial_rotary_factor) dims of each head,
LongRoPE: 1 / (ext * theta^(2i/R)) with ext = long_factor when the call's length
exceeds original_max_position_embeddings, else short_factor, cos and sin times
sqrt(1 + ln(max_pos / original) / ln(original)) (or the given attention_factor);
its sliding_window on every layer. With a KV cache, each call picks its own
factors: the golden's step_logits are a step whose cached keys used the others.

Gemma 3 text: see gemma3_forward.

  reference_forward.py write MODELS_DIR GOLDEN_DIR [NAME...]  # (re)write the golden logits (of NAMEs only)
  reference_forward.py check MODELS_DIR GOLDEN_DIR            # recompute; exit 1 if they differ
"""
import json
import math
import os
import struct
import sys

import torch

MODELS = ["llama", "llama-mlp-bias", "mistral", "qwen3", "qwen3-window", "qwen2", "mixtral", "qwen3_moe", "qwen3_moe-window",
          "deepseek_v2", "deepseek_v2-q-lora", "deepseek_v3", "gpt_oss", "gpt_oss-mxfp4",
          # routing branches, on unskewed routers (tests/models/make_test_models.sh)
          "qwen3_moe-route", "qwen3_moe-route-norm", "mixtral-route", "gpt_oss-route", "deepseek_v2-route",
          "deepseek_v3-route", "deepseek_v3-route-nonorm", "phi3", "phi3-long", "phi3-window", "gemma3"]
INPUT_IDS = [1, 17, 42, 99, 250, 3, 511, 7, 300, 12]
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64, "I32": torch.int32,
          "U8": torch.uint8}


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


def is_deepseek(cfg):
    return cfg["model_type"] in ("deepseek_v2", "deepseek_v3")


def is_sparse_layer(cfg, i):
    if cfg["model_type"] in ("mixtral", "gpt_oss"):
        return True
    if is_deepseek(cfg):
        return (cfg.get("n_routed_experts") or 0) > 0 and i >= cfg["first_k_dense_replace"]
    if cfg["model_type"] != "qwen3_moe":
        return False
    return i not in (cfg.get("mlp_only_layers") or []) and cfg["num_experts"] > 0 and \
        (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def deepseek_route(cfg, w, block, x):
    """DeepSeek's router on x [N, H]: (weights, ids) [N, k]."""
    k, E = cfg["num_experts_per_tok"], cfg["n_routed_experts"]
    logits = x.float() @ w[block + "gate.weight"].float().T
    v3 = cfg["model_type"] == "deepseek_v3"
    scores = logits.sigmoid() if v3 else logits.softmax(dim=-1)
    choice = scores + w[block + "gate.e_score_correction_bias"] if v3 else scores
    method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    if method != "greedy":
        g = cfg["n_group"]
        grouped = choice.view(-1, g, E // g)
        group_scores = grouped.topk(2, dim=-1)[0].sum(-1) if v3 else grouped.max(dim=-1).values
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(cfg["topk_group"], dim=-1)[1], 1.0)
        keep = keep.bool()[:, :, None].expand(-1, g, E // g).reshape(-1, E)
        choice = choice.masked_fill(~keep, float("-inf"))
    ids = choice.topk(k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if v3 and cfg.get("norm_topk_prob", True):
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.get("routed_scaling_factor", 1.0), ids


def sparse_moe(cfg, w, p, h, expert_load=None, router_logits=None):
    """The MoE block of layer prefix p on h [B, T, H], from the per-expert Hub tensors
    (the router's logits [B*T, E] appended to router_logits when given)."""
    mixtral = cfg["model_type"] == "mixtral"
    block = p + ("block_sparse_moe." if mixtral else "mlp.")
    gate_name, up_name, down_name = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    n_experts = cfg["num_local_experts"] if mixtral else cfg["n_routed_experts"] if is_deepseek(cfg) else cfg["num_experts"]
    x = h.reshape(-1, h.shape[-1])
    if is_deepseek(cfg):
        top_w, top_i = deepseek_route(cfg, w, block, x)
    else:
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
    if is_deepseek(cfg) and cfg.get("n_shared_experts"):
        out = out + mlp(w, block + "shared_experts.", x)
    return out.view_as(h)


# FP4 E2M1 values of the nibbles 0..7; bit 3 is the sign.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_dequantise(blocks, scales):
    """blocks [E, out, G, 16] uint8 (two values a byte: low nibble first), scales
    [E, out, G] uint8 (e8m0: 2^(s - 127) for the block's 32 values) -> float32
    [E, in, out] with in = G * 32 (the blocks are stored out x in, then transposed)."""
    lut = torch.tensor(E2M1 + [-v for v in E2M1])
    lo, hi = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    values = torch.stack((lo, hi), dim=-1).reshape(*blocks.shape[:-1], 32)  # [E, out, G, 32]
    values = values * torch.pow(2.0, scales.float() - 127.0)[..., None]
    return values.reshape(blocks.shape[0], blocks.shape[1], -1).transpose(1, 2).contiguous()


def mlp(w, prefix, h):
    """The SiLU-gated MLP at `prefix` (gate_proj, up_proj, down_proj), with their
    biases where the checkpoint has them (Llama's mlp_bias)."""
    def linear(name, x):
        y = x @ w[prefix + name + ".weight"].T
        return y + w[prefix + name + ".bias"] if prefix + name + ".bias" in w else y
    return linear("down_proj", torch.nn.functional.silu(linear("gate_proj", h)) * linear("up_proj", h))


def attention_windows(cfg):
    """Each layer's sliding window (None: full attention), as Transformers' configs
    set it: Mistral (key default 4096) and Mixtral (default None) on every layer;
    Qwen3 and Qwen2 only under use_sliding_window (window default 4096), on the layers from
    max_window_layers (default 28) on unless layer_types lists them; Qwen3-MoE
    under use_sliding_window, on every layer (its max_window_layers is not read);
    GPT-OSS (default 128) on its "sliding_attention" layer_types."""
    mt, n = cfg["model_type"], cfg["num_hidden_layers"]
    window = None
    if mt == "mistral":
        window = cfg.get("sliding_window", 4096)
    elif mt == "mixtral":
        window = cfg.get("sliding_window")
    elif mt == "gpt_oss":
        window = cfg.get("sliding_window", 128)
    elif mt == "phi3":
        window = cfg.get("sliding_window")
    elif mt in ("qwen3", "qwen3_moe", "qwen2") and cfg.get("use_sliding_window", False):
        window = cfg.get("sliding_window", 4096)
    types = cfg.get("layer_types")
    if types is None and mt in ("qwen3", "qwen2"):
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
    if types is None:
        types = ["sliding_attention" if window else "full_attention"] * n
    return [window if t == "sliding_attention" else None for t in types]


def load_model(model_dir):
    """config.json and the checkpoint's tensors as float32, in the file's order
    (MXFP4 pairs dequantised under the parameter's name)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    raw = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    w = {}
    for k, v in raw.items():
        if k.endswith("_blocks"):
            w[k[:-len("_blocks")]] = mxfp4_dequantise(v, raw[k[:-len("_blocks")] + "_scales"])
        elif not k.endswith("_scales"):
            w[k] = v.float()
    return cfg, w


def rope_tables(cfg, D, T):
    """cos and sin [T, 1, D] for rotate-half RoPE, yarn's attention factor applied."""
    s = cfg.get("rope_scaling") or {}
    if s.get("rope_type", s.get("type")) == "yarn":
        freqs, att = yarn(cfg, D)
    else:
        freqs, att = inv_freq(cfg, D), 1.0
    ang = torch.outer(torch.arange(T).float(), freqs)
    emb = torch.cat((ang, ang), dim=-1)
    return (emb.cos() * att)[:, None, :], (emb.sin() * att)[:, None, :]


def gpt_oss_attention(cfg, w, p, h, mask):
    """GPT-OSS attention: biased projections, rotate-half yarn RoPE, GQA, and a
    per-head sink logit joining each softmax (its column dropped afterwards)."""
    B, T, _ = h.shape
    nh, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    a = p + "self_attn."

    def proj(name, x, heads):
        y = x @ w[a + name + ".weight"].T + w[a + name + ".bias"]
        return y.view(B, T, heads, D) if heads else y

    cos, sin = rope_tables(cfg, D, T)
    q, k, v = proj("q_proj", h, nh), proj("k_proj", h, nkv), proj("v_proj", h, nkv)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5 + mask
    sinks = w[a + "sinks"].view(1, nh, 1, 1).expand(B, nh, T, 1)
    combined = torch.cat((scores, sinks), dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = combined.softmax(dim=-1)[..., :-1]
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, nh * D)
    return proj("o_proj", out, 0)


def gpt_oss_moe(cfg, w, p, h, expert_load=None, router_logits=None):
    """GPT-OSS's MoE block: top-k of the biased router logits, softmax over the k,
    experts x @ W with interleaved gate/up columns and the clamped SwiGLU."""
    m = p + "mlp."
    limit, alpha = cfg.get("swiglu_limit", 7.0), 1.702
    x = h.reshape(-1, h.shape[-1])
    logits = x @ w[m + "router.weight"].T + w[m + "router.bias"]
    if router_logits is not None:
        router_logits.append(logits)
    top_v, top_i = logits.topk(cfg["num_experts_per_tok"], dim=-1)
    top_w = top_v.softmax(dim=-1)
    gate_up, gate_up_b = w[m + "experts.gate_up_proj"], w[m + "experts.gate_up_proj_bias"]
    down, down_b = w[m + "experts.down_proj"], w[m + "experts.down_proj_bias"]
    out = torch.zeros_like(x)
    for e in range(cfg["num_local_experts"]):
        token, slot = (top_i == e).nonzero(as_tuple=True)
        if expert_load is not None:
            expert_load.append(len(token))
        if len(token) == 0:
            continue
        gu = x[token] @ gate_up[e] + gate_up_b[e]
        gate, up = gu[..., 0::2].clamp(max=limit), gu[..., 1::2].clamp(min=-limit, max=limit)
        glu = gate * torch.sigmoid(gate * alpha)
        out.index_add_(0, token, (((up + 1) * glu) @ down[e] + down_b[e]) * top_w[token, slot, None])
    return out.view_as(h)


def llama_attention(cfg, w, p, h, mask):
    """Grouped-query attention with rotate-half RoPE (Llama, Mistral, Qwen3)."""
    B, T, _ = h.shape
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or H // nh
    ang = torch.outer(torch.arange(T).float(), inv_freq(cfg, D))
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    def proj(name, heads):  # with a bias where the checkpoint has one (Qwen2's q/k/v)
        y = h @ w[p + f"self_attn.{name}.weight"].T
        bias = w.get(p + f"self_attn.{name}.bias")
        return (y if bias is None else y + bias).view(B, T, heads, D)

    q, k, v = proj("q_proj", nh), proj("k_proj", nkv), proj("v_proj", nkv)
    if cfg["model_type"] in ("qwen3", "qwen3_moe"):
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg["rms_norm_eps"])
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg["rms_norm_eps"])
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return grouped_attention(q, k, v, mask) @ w[p + "self_attn.o_proj.weight"].T


def grouped_attention(q, k, v, mask):
    """Softmax attention of q [B, T, nh, D] over k, v [B, T, nkv, D] (each KV head serving
    nh / nkv query heads), scaled by 1/sqrt(D), masked: [B, T, nh * D]."""
    B, T, nh, D = q.shape
    k = k.repeat_interleave(nh // k.shape[2], dim=2)
    v = v.repeat_interleave(nh // v.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D) + mask
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, nh * D)


def longrope(cfg, R, call_len):
    """LongRoPE's frequencies [R / 2] and cos/sin factor for a call over call_len positions."""
    s, base = cfg["rope_scaling"], cfg.get("rope_theta", 10000.0)
    orig = s.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") or \
        4096  # Phi3Config's default
    factor = s.get("factor") or cfg["max_position_embeddings"] / orig
    att = s.get("attention_factor")
    if att is None:
        att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = torch.tensor(s["long_factor"] if call_len > orig else s["short_factor"], dtype=torch.float32)
    return 1.0 / (ext * base ** (torch.arange(0, R, 2, dtype=torch.int64).float() / R)), att


def phi3_attention(cfg, w, p, h, mask):
    """Phi-3: q|k|v from one projection, RoPE on the first R dims of each head (LongRoPE's
    factors per position from the length of the call that computed it: cfg["_call_lens"])."""
    B, T, H = h.shape
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    D = H // nh
    R = int(D * cfg.get("partial_rotary_factor", 1.0))
    s = cfg.get("rope_scaling") or {}
    call_lens = cfg.get("_call_lens") or [T] * T
    cos, sin = torch.zeros(T, 1, R), torch.zeros(T, 1, R)
    for t in range(T):
        if s.get("type", s.get("rope_type")) in ("longrope", "su"):
            freqs, att = longrope(cfg, R, call_lens[t])
        else:
            freqs, att = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, R, 2).float() / R)), 1.0
        emb = torch.cat((t * freqs, t * freqs))
        cos[t, 0], sin[t, 0] = emb.cos() * att, emb.sin() * att
    q, k, v = (h @ w[p + "self_attn.qkv_proj.weight"].T).split([nh * D, nkv * D, nkv * D], dim=-1)
    q, k, v = q.reshape(B, T, nh, D), k.reshape(B, T, nkv, D), v.reshape(B, T, nkv, D)

    def rope(x):
        turn, rest = x[..., :R], x[..., R:]
        return torch.cat((turn * cos + rotate_half(turn) * sin, rest), dim=-1)

    return grouped_attention(rope(q), rope(k), v, mask) @ w[p + "self_attn.o_proj.weight"].T


def phi3_mlp(w, prefix, h):
    gate, up = (h @ w[prefix + "gate_up_proj.weight"].T).chunk(2, dim=-1)
    return (up * torch.nn.functional.silu(gate)) @ w[prefix + "down_proj.weight"].T


def yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn(cfg, dim):
    """Yarn's frequencies and attention factor (Transformers' rope utils, as published)."""
    s, base = cfg["rope_scaling"], cfg.get("rope_theta", 10000.0)
    orig = s.get("original_max_position_embeddings")
    # With original_max_position_embeddings given, the factor is max_position_embeddings / it.
    factor = cfg["max_position_embeddings"] / orig if orig else s["factor"]
    orig = orig or cfg["max_position_embeddings"]
    att = s.get("attention_factor")
    if att is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            att = yarn_mscale(factor, s["mscale"]) / yarn_mscale(factor, s["mscale_all_dim"])
        else:
            att = yarn_mscale(factor)

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    keep = 1 - ((torch.arange(dim // 2).float() - low) / (high - low)).clamp(0, 1)
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep, att


def mla_attention(cfg, w, p, h, mask):
    """DeepSeek-V2 multi-head latent attention: queries (optionally through the q
    LoRA), the compressed latent + shared k_pe, kv_b_proj expansion, RoPE on the
    rope dims only as complex pairs (x[2i], x[2i+1]), yarn's mscale on the softmax."""
    B, T, _ = h.shape
    nh, C, N, R, V = (cfg[k] for k in ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                        "v_head_dim"))
    a = p + "self_attn."
    if cfg.get("q_lora_rank"):
        q = rms_norm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6) @ w[a + "q_b_proj.weight"].T
    else:
        q = h @ w[a + "q_proj.weight"].T
    q_nope, q_pe = q.view(B, T, nh, N + R).split([N, R], dim=-1)
    latent, k_pe = (h @ w[a + "kv_a_proj_with_mqa.weight"].T).split([C, R], dim=-1)
    latent = rms_norm(latent, w[a + "kv_a_layernorm.weight"], 1e-6)

    scale = (N + R) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs:
        freqs, att = yarn(cfg, R)
        if rs.get("mscale_all_dim"):
            scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    else:
        freqs, att = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, R, 2).float() / R)), 1.0
    ang = torch.outer(torch.arange(T).float(), freqs)
    cis = (torch.polar(torch.ones_like(ang), ang) * att)[None, :, None, :]

    def rope(x):
        return torch.view_as_real(torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * cis).flatten(3)

    if cfg["model_type"] == "deepseek_v3":
        # V3: the rope dims de-interleaved (evens, then odds), then rotate-half with yarn's factor on cos and sin.
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = (emb.cos() * att)[None, :, None, :], (emb.sin() * att)[None, :, None, :]

        def rope(x):  # noqa: F811
            if cfg.get("rope_interleave", True):
                x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
            return x * cos + rotate_half(x) * sin

    q_pe, k_pe = rope(q_pe), rope(k_pe.reshape(B, T, 1, R))
    k_nope, v = (latent @ w[a + "kv_b_proj.weight"].T).view(B, T, nh, N + V).split([N, V], dim=-1)
    key = torch.cat((k_nope, k_pe.expand(B, T, nh, R)), dim=-1)
    query = torch.cat((q_nope, q_pe), dim=-1)
    scores = torch.einsum("bqhd,bkhd->bhqk", query, key) * scale + mask
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, nh * V)
    return out @ w[a + "o_proj.weight"].T


def gemma3_layer_types(cfg):
    """Gemma3TextConfig: layer_types, else layer i global when (i + 1) % sliding_window_pattern == 0 (default 6)."""
    if cfg.get("layer_types") is not None:
        return cfg["layer_types"]
    pattern = cfg.get("sliding_window_pattern") or 6
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(cfg["num_hidden_layers"])]


def gemma3_forward(cfg, w, ids):
    """Gemma 3 text: embeddings times sqrt(hidden), (1 + w) RMSNorms, sandwich norms around attention and MLP,
    q/k RMSNorm per head before RoPE, scores times query_pre_attn_scalar^-0.5, local layers windowed with RoPE
    base rope_local_base_freq (no scaling), global layers rope_theta with rope_scaling, GeGLU (tanh gelu) MLP,
    logits soft-capped by final_logit_softcapping (attn_logit_softcapping unused, as in Transformers' Gemma 3)."""
    eps = cfg["rms_norm_eps"]
    B, T = ids.shape
    nh, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def norm(x, weight):
        return rms_norm(x, 1.0 + weight.float(), eps)

    def rope(theta, scaling):
        c = dict(cfg, rope_theta=theta, rope_scaling=scaling)
        ang = torch.outer(torch.arange(T).float(), inv_freq(c, D))
        emb = torch.cat((ang, ang), dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    tables = {"full_attention": rope(cfg.get("rope_theta", 1e6), cfg.get("rope_scaling")),
              "sliding_attention": rope(cfg.get("rope_local_base_freq", 10000.0), None)}
    causal = torch.full((T, T), float("-inf")).triu(1)
    window = cfg.get("sliding_window", 4096)
    masks = {"full_attention": causal,
             "sliding_attention": causal.masked_fill(torch.ones(T, T, dtype=torch.bool).tril(-window), float("-inf"))}
    gelu = "tanh" if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu" else "none"

    x = w["model.embed_tokens.weight"][ids] * math.sqrt(cfg["hidden_size"])
    for i, kind in enumerate(gemma3_layer_types(cfg)):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = norm((h @ w[a + "q_proj.weight"].T).view(B, T, nh, D), w[a + "q_norm.weight"])
        k = norm((h @ w[a + "k_proj.weight"].T).view(B, T, nkv, D), w[a + "k_norm.weight"])
        v = (h @ w[a + "v_proj.weight"].T).view(B, T, nkv, D)
        cos, sin = tables[kind]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=2)
        v = v.repeat_interleave(nh // nkv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * cfg.get("query_pre_attn_scalar", 256) ** -0.5 + masks[kind]
        att = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, nh * D)
        x = x + norm(att @ w[a + "o_proj.weight"].T, w[p + "post_attention_layernorm.weight"])
        h = norm(x, w[p + "pre_feedforward_layernorm.weight"])
        m = p + "mlp."
        act = torch.nn.functional.gelu(h @ w[m + "gate_proj.weight"].T, approximate=gelu) * (h @ w[m + "up_proj.weight"].T)
        x = x + norm(act @ w[m + "down_proj.weight"].T, w[p + "post_feedforward_layernorm.weight"])
    x = norm(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping")
    return cap * torch.tanh(logits / cap) if cap else logits


def forward_batch(cfg, w, ids, expert_loads=None, router_logits=None):
    """Logits [B, T, V] of int64 ids [B, T] (causal, positions 0..T-1 in every row). The
    tensors in w may be autograd leaves (the training oracle passes nn.Parameters);
    router_logits, when given, collects every sparse layer's router logits."""
    if cfg["model_type"] == "gemma3_text":
        return gemma3_forward(cfg, w, ids)
    eps = cfg["rms_norm_eps"]
    B, T = ids.shape
    causal = torch.full((T, T), float("-inf")).triu(1)
    # Sliding window W: query i sees keys j in (i - W, i] (Transformers' sliding-window causal mask).
    windows = attention_windows(cfg)

    def mask_of(window):
        return causal.masked_fill(torch.ones(T, T, dtype=torch.bool).tril(-window), float("-inf")) if window else causal
    attention = mla_attention if is_deepseek(cfg) else gpt_oss_attention if cfg["model_type"] == "gpt_oss" else \
        phi3_attention if cfg["model_type"] == "phi3" else llama_attention
    moe = gpt_oss_moe if cfg["model_type"] == "gpt_oss" else sparse_moe

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        mask = mask_of(windows[i])
        x = x + attention(cfg, w, p, rms_norm(x, w[p + "input_layernorm.weight"], eps), mask)
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if is_sparse_layer(cfg, i):
            load = [] if expert_loads is not None else None
            x = x + moe(cfg, w, p, h, load, router_logits)
            if expert_loads is not None:
                expert_loads.append(load)
            continue
        x = x + (phi3_mlp if cfg["model_type"] == "phi3" else mlp)(w, p + "mlp.", h)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def without_feature(name, cfg, w):
    """The config and weights of a model named for one feature (a window, MLP biases, a
    routing branch) with that feature off or flipped: its logits must differ, or the
    golden could not tell a tp that ignores the key."""
    if "window" in name:  # Phi-3's window applies whenever it is set
        off = {"sliding_window": None} if cfg["model_type"] == "phi3" else {"use_sliding_window": False}
        return dict(cfg, **off), w
    if name == "qwen2":
        return cfg, {k: v for k, v in w.items() if not k.endswith("_proj.bias")}
    if "mlp-bias" in name:
        return cfg, {k: v for k, v in w.items() if not (".mlp." in k and k.endswith(".bias"))}
    if name in ("qwen3_moe-route", "qwen3_moe-route-norm", "deepseek_v3-route", "deepseek_v3-route-nonorm"):
        return dict(cfg, norm_topk_prob=not cfg.get("norm_topk_prob")), w
    if name == "deepseek_v2-route":
        return dict(cfg, topk_method="greedy"), w
    if name == "phi3-long":  # long_factor at these ids; short_factor within the original context
        return dict(cfg, original_max_position_embeddings=cfg["max_position_embeddings"]), w
    return None


PHI3_PREFILL = 2  # phi3-long's step_logits: a call over ids[:2] (short_factor), then one over ids[2] (long_factor)


def step_logits(model_dir, ids):
    """The logits of a cached step over ids[PHI3_PREFILL] after a prefill of the ones before it: the
    prefill's keys keep its factors (Transformers recomputes only the new positions' RoPE)."""
    cfg, w = load_model(model_dir)
    n = PHI3_PREFILL + 1
    cached = dict(cfg, _call_lens=[PHI3_PREFILL] * PHI3_PREFILL + [n])
    out = forward_batch(cached, w, torch.tensor([ids[:n]]))[0, -1]
    for lens in ([n] * n, [PHI3_PREFILL] * n):  # all long, all short: both must differ from it
        diff = (forward_batch(dict(cfg, _call_lens=lens), w, torch.tensor([ids[:n]]))[0, -1] - out).abs().max().item()
        assert diff > 1e-2 * out.abs().max().item(), f"the cached step must differ from call lengths {lens}"
    return out


def gemma3_features(cfg):
    """Gemma 3's config keys that change the math, each turned off: every one must move the logits."""
    return {"the window": dict(cfg, sliding_window=1 << 30),
            "the local rope base": dict(cfg, rope_local_base_freq=cfg.get("rope_theta")),
            "rope_scaling": dict(cfg, rope_scaling=None),
            "final_logit_softcapping": dict(cfg, final_logit_softcapping=None),
            "query_pre_attn_scalar": dict(cfg, query_pre_attn_scalar=cfg["head_dim"])}


def forward(model_dir, ids):
    cfg, w = load_model(model_dir)
    loads = []
    logits = forward_batch(cfg, w, torch.tensor([ids]), loads)[0]
    if cfg["model_type"] == "gemma3_text":
        for feature, other in gemma3_features(cfg).items():
            diff = (forward_batch(other, w, torch.tensor([ids]))[0] - logits).abs().max().item()
            print(f"{os.path.basename(model_dir)}: max |logits - logits without {feature}| = {diff:.3g}")
            assert diff > 1e-2 * logits.abs().max().item(), f"{feature} must change the logits at these ids"
    off = without_feature(os.path.basename(model_dir), cfg, w)
    if off is not None:
        diff = (forward_batch(*off, torch.tensor([ids]))[0] - logits).abs().max().item()
        print(f"{os.path.basename(model_dir)}: max |logits - logits without the feature| = {diff:.3g}")
        assert diff > 1e-2 * logits.abs().max().item(), "the feature must change the logits at these ids"
    if loads and "-route" not in model_dir:  # skewed routers (tests/models/skew_router.py): say so, and check it
        print(f"{os.path.basename(model_dir)}: tokens per expert per MoE layer {loads}")
        for load in loads:
            assert max(load) == len(ids) and min(load) == 0, "each MoE layer should route unevenly"
    return logits


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("write", "check") or (sys.argv[1] == "check" and len(sys.argv) > 4):
        raise SystemExit(__doc__)
    mode, models_dir, golden_dir = sys.argv[1:4]
    names = sys.argv[4:] or MODELS
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {MODELS}")
    torch.set_num_threads(1)
    bad = 0
    for name in names:
        with torch.no_grad():
            logits = forward(os.path.join(models_dir, name), INPUT_IDS)
        path = os.path.join(golden_dir, f"{name}.safetensors")
        extra = {}
        if name == "phi3-long":
            with torch.no_grad():
                extra["step_logits"] = step_logits(os.path.join(models_dir, name), INPUT_IDS)
        if mode == "write":
            write_safetensors(path, {"input_ids": torch.tensor(INPUT_IDS, dtype=torch.float32), "logits": logits,
                                     **extra})
            print(f"wrote {path}: logits {list(logits.shape)}")
            continue
        stored = read_safetensors(path)
        golden = stored["logits"]
        diff = (golden - logits).abs().max().item()
        for key, value in extra.items():
            diff = max(diff, (stored[key] - value).abs().max().item())
        scale = golden.abs().max().item()
        ok = diff <= 1e-5 * scale
        print(f"{name}: max |reference - committed golden| = {diff:.3g} (max |logit| {scale:.3g}) {'ok' if ok else 'DIFFERENT'}")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
