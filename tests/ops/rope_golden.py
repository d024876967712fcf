#!/usr/bin/python3
"""Writes data/rope_golden.txt: RoPE reference values computed with PyTorch, the
way Transformers computes them (default inv_freq, _compute_llama3_parameters,
rotate-half apply_rotary_pos_emb). Run: /usr/bin/python3 tests/ops/rope_golden.py

File format (whitespace separated): blocks of "name count v0 v1 ...".
"""
import math
import os

import torch


def inv_freq_default(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def inv_freq_llama3(dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = inv_freq_default(dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, positions, inv_freq):
    # x [B, T, H, D]; positions [B, T]
    freqs = (inv_freq[None, :, None].float() @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
    return x * cos + rotate_half(x) * sin


def main():
    out = []

    def put(name, t):
        v = t.flatten().tolist()
        out.append(f"{name} {len(v)} " + " ".join(repr(float(a)) for a in v))

    put("default_128_500000", inv_freq_default(128, 500000.0))
    llama3 = inv_freq_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    put("llama3_128_500000", llama3)
    small = inv_freq_llama3(8, 500000.0, 8.0, 1.0, 4.0, 8192)
    put("llama3_8_500000", small)
    # x [2, 3, 2, 8] = sin(0.37 * i), positions chosen to hit large angles too.
    x = torch.sin(0.37 * torch.arange(2 * 3 * 2 * 8, dtype=torch.float32)).reshape(2, 3, 2, 8)
    positions = torch.tensor([[0, 5, 1000], [7, 8191, 20000]], dtype=torch.int64)
    put("x", x)
    put("positions", positions)
    put("rope_llama3_8", apply_rope(x, positions, small))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rope_golden.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
