#!/usr/bin/python3
"""PyTorch baseline for tp's inference benchmark (bench/models/bench_inference.cpp):
batch 1, prefill P tokens then greedy-decode D tokens, of a Hugging Face Llama-family
checkpoint (llama, mistral without a window, qwen3), in one process or tensor-parallel
over K processes (gloo on localhost). Standalone: the model is written here from the
published math (no transformers library); config.json and model.safetensors are read
by bench/torch_checkpoint.py, each rank reading only its slice.

Its best settings on a CPU with torch 1.13 (Debian's python3-torch):
  bf16 weights and activations (as from_pretrained(torch_dtype=bfloat16); on this build
  a bf16 F.linear runs through oneDNN, while float32 goes to the generic BLAS);
  torch.inference_mode; torch.set_num_threads(--threads), one interop thread;
  a static KV cache preallocated for P + D + 1 positions, written in place (no K/V copy
  per step, no cat); grouped-query attention without repeat_kv (the query heads of one
  KV head are folded into the rows of one matmul); logits only for the last position.
Numerics as Transformers' eager Qwen3/Llama: RMSNorm in float32 then cast back, RoPE
cos/sin in float32 cast to bf16, softmax in float32, residual stream in bf16.

Tensor-parallel layout (Transformers' base_model_tp_plan for qwen3/llama): q/k/v/gate/up
colwise (rows of the [out, in] weight split), o/down rowwise (columns split, output
all-reduced), embed_tokens vocab-sharded (embedding_rowwise: ids outside the rank's rows
look up zeros, all-reduce), lm_head colwise_gather_output (vocab-sharded, logits
all-gathered); with tie_word_embeddings both are one sharded tensor. The vocab rows split
by torch's chunk rule (ceil(V / tp) per rank) as Transformers does; the rest by
bench/torch_checkpoint.py's split_range (the same for sizes tp divides). gloo in torch 1.13
has no bfloat16 all-reduce, so the partial sums travel as float32.

The same prompt as bench_inference: token i = (i * 7919 + 13) % vocab_size. With
--force-tokens T0,T1,... (tp's greedy tokens: T0 from the prefill, Ti from decode step i)
decode feeds tp's tokens instead of its own and reports, for every step, whether its own
argmax equals tp's and by how much its logit of tp's token falls below its max: the
agreement check of bench/models/run_speedup_chart.py.

  torch_inference.py --model DIR [--tp K] [--threads N] [--prefill 512] [--decode 32] [--reps 1]
                     [--warmup-prefill 64] [--warmup-decode 4] [--force-tokens T0,T1,...]

Prints one JSON line on stdout (rank 0's times; every step starts after a barrier).
Use Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))
from torch_checkpoint import Checkpoint, read_config, split_range  # noqa: E402
from reference_forward import inv_freq  # noqa: E402

BF16 = torch.bfloat16


def prompt_ids(n, vocab):
    """bench_inference.cpp's prompt."""
    return [(i * 7919 + 13) % vocab for i in range(n)]


class Model:
    """The rank's part of the model, bf16, with its static KV cache."""

    def __init__(self, model_dir, tp, rank, max_len):
        cfg = read_config(model_dir)
        mt = cfg["model_type"]
        if (mt == "mistral" and cfg.get("sliding_window")) or cfg.get("use_sliding_window"):
            raise SystemExit("sliding windows not supported")
        self.tp, self.rank, self.qwen3 = tp, rank, mt == "qwen3"
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        D = cfg.get("head_dim") or H // nh
        V, I = cfg["vocab_size"], cfg["intermediate_size"]
        if nh % tp or nkv % tp:
            raise SystemExit(f"tp {tp} must divide the {nh} attention and {nkv} key/value heads")
        self.V, self.D, self.nh_l, self.nkv_l = V, D, nh // tp, nkv // tp
        self.rep = nh // nkv
        self.eps = cfg["rms_norm_eps"]
        # vocab rows as Transformers shards them (torch's chunk rule: ceil(V / tp) per rank)
        self.vchunk = -(-V // tp)
        self.vstart, self.vstop = min(V, rank * self.vchunk), min(V, (rank + 1) * self.vchunk)
        istart, istop = split_range(I, tp, rank)
        qs = (rank * self.nh_l * D, (rank + 1) * self.nh_l * D)
        ks = (rank * self.nkv_l * D, (rank + 1) * self.nkv_l * D)
        ck = Checkpoint(model_dir)

        def get(name, dim=None, rng=(0, None)):
            return ck.get(name, dim, *rng, dtype=BF16) if dim is not None else ck.get(name, dtype=BF16)

        self.embed = get("model.embed_tokens.weight", 0, (self.vstart, self.vstop))
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            lw = {"ln1": get(p + "input_layernorm.weight"), "ln2": get(p + "post_attention_layernorm.weight"),
                  "q": get(p + "self_attn.q_proj.weight", 0, qs), "k": get(p + "self_attn.k_proj.weight", 0, ks),
                  "v": get(p + "self_attn.v_proj.weight", 0, ks),
                  "o": get(p + "self_attn.o_proj.weight", 1, qs).contiguous(),
                  "gate": get(p + "mlp.gate_proj.weight", 0, (istart, istop)),
                  "up": get(p + "mlp.up_proj.weight", 0, (istart, istop)),
                  "down": get(p + "mlp.down_proj.weight", 1, (istart, istop)).contiguous(),
                  # the static cache: [kv heads, positions, head_dim]
                  "kc": torch.zeros(self.nkv_l, max_len, D, dtype=BF16),
                  "vc": torch.zeros(self.nkv_l, max_len, D, dtype=BF16)}
            if self.qwen3:
                lw["qn"] = get(p + "self_attn.q_norm.weight")
                lw["kn"] = get(p + "self_attn.k_norm.weight")
            self.layers.append(lw)
        self.norm = get("model.norm.weight")
        tied = bool(cfg.get("tie_word_embeddings")) or "lm_head.weight" not in ck
        self.head = self.embed if tied else get("lm_head.weight", 0, (self.vstart, self.vstop))
        ang = torch.outer(torch.arange(max_len).float(), inv_freq(cfg, D))
        emb = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = emb.cos().to(BF16), emb.sin().to(BF16)      # [max_len, D]
        # the all-gather's buffers, made outside inference_mode (gloo writes them from its own thread)
        self.parts = [torch.empty(self.vchunk) for _ in range(tp)]

    def rms_norm(self, x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(BF16)

    def all_reduce(self, x):
        if self.tp == 1:
            return x
        y = x.float()
        dist.all_reduce(y)
        return y.to(BF16)

    def embed_lookup(self, ids):
        if self.tp == 1:
            return F.embedding(ids, self.embed)
        outside = (ids < self.vstart) | (ids >= self.vstop)
        local = (ids - self.vstart).masked_fill(outside, 0)
        return self.all_reduce(F.embedding(local, self.embed).masked_fill(outside.unsqueeze(-1), 0.0))

    def forward(self, ids, pos):
        """float32 logits [V] of the last of `ids` (1-D), placed at positions pos, pos + 1, ..."""
        T, D, nh_l, nkv_l, rep = ids.shape[0], self.D, self.nh_l, self.nkv_l, self.rep
        end = pos + T
        cos, sin = self.cos[pos:end], self.sin[pos:end]
        mask = None
        if T > 1:
            i = torch.arange(T).unsqueeze(1) + pos
            j = torch.arange(end).unsqueeze(0)
            mask = torch.zeros(T, end, dtype=BF16).masked_fill(j > i, float("-inf"))
        scale = D ** -0.5

        def rope(x):                                             # [heads, T, D]
            a, b = x.chunk(2, dim=-1)
            return x * cos + torch.cat((-b, a), dim=-1) * sin

        x = self.embed_lookup(ids)                               # [T, H] bf16
        for lw in self.layers:
            h = self.rms_norm(x, lw["ln1"])
            q = F.linear(h, lw["q"]).view(T, nh_l, D)
            k = F.linear(h, lw["k"]).view(T, nkv_l, D)
            v = F.linear(h, lw["v"]).view(T, nkv_l, D)
            if self.qwen3:
                q, k = self.rms_norm(q, lw["qn"]), self.rms_norm(k, lw["kn"])
            q, k = rope(q.transpose(0, 1)), rope(k.transpose(0, 1))
            lw["kc"][:, pos:end] = k                             # in place: only the new positions
            lw["vc"][:, pos:end] = v.transpose(0, 1)
            kc, vc = lw["kc"][:, :end], lw["vc"][:, :end]        # views
            # query head g * rep + r uses KV head g (repeat_kv): fold r into the rows
            qg = q.reshape(nkv_l, rep * T, D)
            s = torch.matmul(qg, kc.transpose(1, 2)) * scale      # [nkv_l, rep * T, end]
            if mask is not None:
                s = (s.view(nkv_l, rep, T, end) + mask).view(nkv_l, rep * T, end)
            p = s.softmax(dim=-1, dtype=torch.float32).to(BF16)
            att = torch.matmul(p, vc).view(nh_l, T, D).transpose(0, 1).reshape(T, nh_l * D)
            x = x + self.all_reduce(F.linear(att, lw["o"]))
            h = self.rms_norm(x, lw["ln2"])
            x = x + self.all_reduce(F.linear(F.silu(F.linear(h, lw["gate"])) * F.linear(h, lw["up"]), lw["down"]))
        h = self.rms_norm(x[-1:], self.norm)
        logits = F.linear(h, self.head).float().reshape(-1)     # this rank's vocab rows
        if self.tp == 1:
            return logits
        mine = torch.zeros(self.vchunk)
        mine[:logits.shape[0]] = logits
        dist.all_gather(self.parts, mine)
        return torch.cat(self.parts)[:self.V]


def run_rank(rank, world, a, init_file):
    torch.set_num_threads(a.threads)
    if world > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)

    def barrier():
        if world > 1:
            dist.barrier()

    t0 = time.perf_counter()
    model = Model(a.model, world, rank, a.prefill + a.decode + 1)
    load_s = time.perf_counter() - t0
    forced = [int(t) for t in a.force_tokens.split(",")] if a.force_tokens else None
    if forced is not None and len(forced) < a.decode + 1:
        raise SystemExit(f"--force-tokens has {len(forced)} tokens; --decode {a.decode} needs {a.decode + 1}")
    prefill_s, decode_s = [], []
    agree = None
    with torch.inference_mode():
        for r in range(a.reps + 1):                             # rep 0 warms up
            P = a.prefill if r > 0 or a.warmup_prefill <= 0 else min(a.warmup_prefill, a.prefill)
            Dn = a.decode if r > 0 or a.warmup_decode < 0 else min(a.warmup_decode, a.decode)
            ids = torch.tensor(prompt_ids(P, model.V))
            barrier()
            t = time.perf_counter()
            logits = model.forward(ids, 0)
            nxt = int(logits.argmax())
            tp_ = time.perf_counter() - t
            top = torch.topk(logits, 8)
            prefill_top = [[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)]
            own, margins = [nxt], []
            if forced is not None:
                margins.append(float(logits.max() - logits[forced[0]]))
                nxt = forced[0]
            barrier()
            t = time.perf_counter()
            for s in range(Dn):
                logits = model.forward(torch.tensor([nxt]), P + s)
                nxt = int(logits.argmax())
                own.append(nxt)
                if forced is not None:
                    margins.append(float(logits.max() - logits[forced[s + 1]]))
                    nxt = forced[s + 1]
            td = time.perf_counter() - t
            if r > 0:
                prefill_s.append(tp_)
                decode_s.append(td)
                if forced is not None:
                    eq = sum(o == f for o, f in zip(own, forced))
                    agree = {"steps": len(own), "equal": eq, "max_margin": max(margins),
                             "logit_absmax": float(logits.abs().max())}
    if rank == 0:
        pf, dc = statistics.median(prefill_s), statistics.median(decode_s)
        out = {"engine": "pytorch", "tp_size": world, "threads_per_rank": a.threads, "load_s": round(load_s, 3),
               "prefill_tokens": a.prefill, "prefill_s_median": pf, "prefill_tokens_per_s": a.prefill / pf,
               "decode_tokens": a.decode, "decode_s_median": dc,
               "decode_tokens_per_s": a.decode / dc if dc > 0 else None,
               "prefill_s": prefill_s, "decode_s": decode_s, "tokens": own, "prefill_top": prefill_top,
               "torch": torch.__version__, "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
        if agree is not None:
            out["agreement"] = agree
        print(json.dumps(out), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model dir: config.json + model.safetensors[.index.json]")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (gloo)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=32, help="greedy decode steps after the prefill")
    ap.add_argument("--reps", type=int, default=1, help="timed repetitions (after one warmup)")
    ap.add_argument("--warmup-prefill", type=int, default=64,
                    help="prompt tokens of the warmup repetition (0: --prefill)")
    ap.add_argument("--warmup-decode", type=int, default=4, help="decode steps of the warmup (-1: --decode)")
    ap.add_argument("--force-tokens", help="comma-separated tokens to feed (tp's), checking agreement")
    a = ap.parse_args()
    if a.prefill < 1 or a.decode < 0 or a.reps < 1:
        raise SystemExit("--prefill >= 1, --decode >= 0 and --reps >= 1 are required")
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    torch.set_num_interop_threads(1)
    if a.tp == 1:
        run_rank(0, 1, a, None)
        return
    tmp = tempfile.mkdtemp(prefix="torch_inference.")
    try:
        mp.spawn(run_rank, args=(a.tp, a, os.path.join(tmp, "pg_init")), nprocs=a.tp, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
