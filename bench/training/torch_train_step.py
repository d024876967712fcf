#!/usr/bin/python3
"""PyTorch baseline for tp's training benchmark: the time of one optimizer step of
causal-LM training of a Hugging Face Llama-family checkpoint (llama, mistral, qwen3),
in one process or tensor-parallel over K processes (gloo on localhost).

Standalone: the model is written here from the published math (no transformers
library), and config.json + model.safetensors (or a sharded index) are read with
struct + json + torch.frombuffer, each rank reading only its slice.

One step, the same work as tp's:
  ids: B x T random tokens (fixed seed, the same on every rank); loss = mean cross-entropy
  of logits[:, t] against ids[:, t+1] (B*(T-1) tokens); forward under
  torch.autocast("cpu", bfloat16) with f32 master parameters; backward; global grad-norm
  clipping at 1.0 (torch.nn.utils.clip_grad_norm_'s rule; under TP sharded grads' squares
  are summed over ranks, replicated ones counted once); torch.optim.AdamW(lr 5e-5,
  weight_decay 0); zero_grad(set_to_none=True).

Tensor-parallel layout (Megatron): q/k/v/gate/up column-parallel (rows of the HF
[out, in] weight split; forward identity, backward all-reduce of the input grad);
o_proj/down_proj row-parallel (forward all-reduce of the output); embedding
vocab-parallel (rows split, ids outside the rank's range look up zeros, forward
all-reduce); lm_head column-parallel over vocab with vocab-parallel cross-entropy
(logits never gathered: all-reduce MAX of the row max, SUM of the masked target logit,
SUM of the sum of exp; backward local); tie_word_embeddings shares one sharded
parameter between embedding and lm_head; norms replicated; Qwen3's q_norm/k_norm see
only local heads, so their grads are all-reduced.
gloo in torch 1.13 has no bfloat16 all-reduce ("Invalid scalar type"), so the
row-parallel partial outputs (bf16 under autocast) are summed in float32.

  torch_train_step.py --model DIR [--tp K] [--threads N] [--seq-len 512] [--batch 1]
                      [--warmup 1] [--steps 3] [--foreach true|false] [--compare-foreach 3]
  torch_train_step.py --check --model TINY_DIR [--tp K]   # tp=1 vs tp=K (default 2), f32

Prints one JSON line per run on stdout (details in bench/training/README.md).
Use Debian's /usr/bin/python3 (torch 1.13 with gloo).
"""
import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

# The RoPE frequencies (and, for --check, the independent forward) come from the
# test oracle, tests/reference/reference_forward.py.
REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference")
sys.path.insert(0, REFERENCE_DIR)
import reference_forward  # noqa: E402
from reference_forward import inv_freq  # noqa: E402

# The checkpoint reader and the rank split are shared with bench/models/torch_inference.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_checkpoint import Checkpoint, read_config, split_range  # noqa: E402

LR = 5e-5
MAX_GRAD_NORM = 1.0


# ----------------------------------------------------------------------------- collectives

class _CopyToTP(torch.autograd.Function):
    """Input of a column-parallel layer: identity forward, all-reduce of the grad."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Output of a row-parallel layer / vocab-parallel embedding: all-reduce forward
    (in float32: gloo has no bf16), identity backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        y = x.float() if x.dtype != torch.float32 else x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of float32 logits sharded over vocab [N, V/t] (Megatron's
    vocab_parallel_cross_entropy): three all-reduces, the logits are never gathered."""

    @staticmethod
    def forward(ctx, logits, target, start, stop):
        m = logits.max(dim=-1)[0]
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        z = logits - m.unsqueeze(-1)
        outside = (target < start) | (target >= stop)
        local = (target - start).masked_fill(outside, 0)
        target_logit = z.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0)
        dist.all_reduce(target_logit)
        e = z.exp_()
        sum_exp = e.sum(dim=-1)
        dist.all_reduce(sum_exp)
        loss = sum_exp.log() - target_logit
        e.div_(sum_exp.unsqueeze(-1))                      # softmax, kept for backward
        ctx.save_for_backward(e, outside, local)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, outside, local = ctx.saved_tensors
        grad = softmax                                     # used once: in place
        rows = torch.arange(grad.shape[0])
        grad[rows, local] -= (~outside).to(grad.dtype)
        grad.mul_(g.unsqueeze(-1))
        return grad, None, None, None


# ----------------------------------------------------------------------------- model

class Model:
    """The rank's part of the model: parameters (f32, requires_grad) plus, for each, how
    it is split (None = replicated) and whether its grad is all-reduced (q/k_norm)."""

    def __init__(self, model_dir, tp, rank):
        cfg = read_config(model_dir)
        mt = cfg["model_type"]
        self.cfg, self.tp, self.rank, self.qwen3 = cfg, tp, rank, mt == "qwen3"
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        D = cfg.get("head_dim") or H // nh
        V, I, L = cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        if nh % tp or nkv % tp:
            raise SystemExit(f"tp {tp} must divide the {nh} attention and {nkv} key/value heads")
        self.H, self.nh, self.nkv, self.D, self.V, self.I, self.L = H, nh, nkv, D, V, I, L
        self.nh_l, self.nkv_l = nh // tp, nkv // tp
        self.eps = cfg["rms_norm_eps"]
        self.tied = bool(cfg.get("tie_word_embeddings"))
        sw = cfg.get("sliding_window")
        self.window = sw if (sw and mt == "mistral") or (sw and cfg.get("use_sliding_window")) else None
        if mt == "qwen3" and cfg.get("use_sliding_window"):
            raise SystemExit("qwen3 use_sliding_window not supported")
        self.vstart, self.vstop = split_range(V, tp, rank)
        istart, istop = split_range(I, tp, rank)
        qs = (rank * self.nh_l * D, (rank + 1) * self.nh_l * D)
        ks = (rank * self.nkv_l * D, (rank + 1) * self.nkv_l * D)

        ck = Checkpoint(model_dir)
        self.params = {}        # name -> Parameter
        self.split = {}         # name -> (dim, start, stop) or None
        self.allreduce_grad = set()

        def add(name, dim=None, rng=None, allreduce=False):
            t = ck.get(name, dim, *rng) if dim is not None else ck.get(name)
            self.params[name] = torch.nn.Parameter(t)
            self.split[name] = (dim, rng[0], rng[1]) if dim is not None else None
            if allreduce:
                self.allreduce_grad.add(name)
            return self.params[name]

        self.embed = add("model.embed_tokens.weight", 0, (self.vstart, self.vstop))
        self.layers = []
        for i in range(L):
            p = f"model.layers.{i}."
            lw = {
                "ln1": add(p + "input_layernorm.weight"),
                "q": add(p + "self_attn.q_proj.weight", 0, qs),
                "k": add(p + "self_attn.k_proj.weight", 0, ks),
                "v": add(p + "self_attn.v_proj.weight", 0, ks),
                "o": add(p + "self_attn.o_proj.weight", 1, qs),
                "ln2": add(p + "post_attention_layernorm.weight"),
                "gate": add(p + "mlp.gate_proj.weight", 0, (istart, istop)),
                "up": add(p + "mlp.up_proj.weight", 0, (istart, istop)),
                "down": add(p + "mlp.down_proj.weight", 1, (istart, istop)),
            }
            if self.qwen3:
                lw["qn"] = add(p + "self_attn.q_norm.weight", allreduce=tp > 1)
                lw["kn"] = add(p + "self_attn.k_norm.weight", allreduce=tp > 1)
            self.layers.append(lw)
        self.norm = add("model.norm.weight")
        if self.tied:
            self.head = self.embed
        else:
            self.head = add("lm_head.weight", 0, (self.vstart, self.vstop))
        self.inv_freq = inv_freq(cfg, D)

    def parameters(self):
        return list(self.params.values())

    # -- pieces
    def rms_norm(self, x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))

    def copy_to_tp(self, x):
        return _CopyToTP.apply(x) if self.tp > 1 else x

    def reduce_from_tp(self, x):
        return _ReduceFromTP.apply(x) if self.tp > 1 else x

    def embed_lookup(self, ids):
        if self.tp == 1:
            return F.embedding(ids, self.embed)
        outside = (ids < self.vstart) | (ids >= self.vstop)
        local = (ids - self.vstart).masked_fill(outside, 0)
        x = F.embedding(local, self.embed).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.reduce_from_tp(x)

    def loss(self, ids):
        """Mean cross-entropy of logits[:, t] against ids[:, t+1]."""
        B, T = ids.shape
        D = self.D
        pos = torch.arange(T).float()
        ang = torch.outer(pos, self.inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos(), emb.sin()                          # [T, D]
        i = torch.arange(T)
        banned = i[None, :] > i[:, None]
        if self.window:
            banned |= i[None, :] <= i[:, None] - self.window
        mask = torch.zeros(T, T).masked_fill(banned, float("-inf"))
        scale = 1.0 / math.sqrt(D)
        rep = self.nh // self.nkv

        def rope(x):                                             # [B, h, T, D]
            a, b = x.chunk(2, dim=-1)
            return x * cos + torch.cat((-b, a), dim=-1) * sin

        x = self.embed_lookup(ids)                               # [B, T, H] f32
        for lw in self.layers:
            h = self.copy_to_tp(self.rms_norm(x, lw["ln1"]))
            q = F.linear(h, lw["q"]).view(B, T, self.nh_l, D)
            k = F.linear(h, lw["k"]).view(B, T, self.nkv_l, D)
            v = F.linear(h, lw["v"]).view(B, T, self.nkv_l, D)
            if self.qwen3:
                q = self.rms_norm(q, lw["qn"])
                k = self.rms_norm(k, lw["kn"])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = rope(q), rope(k)
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
            probs = (scores.float() + mask).softmax(dim=-1)      # softmax in f32 (as HF eager)
            att = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, self.nh_l * D)
            x = x + self.reduce_from_tp(F.linear(att, lw["o"]))
            h = self.copy_to_tp(self.rms_norm(x, lw["ln2"]))
            act = F.silu(F.linear(h, lw["gate"])) * F.linear(h, lw["up"])
            x = x + self.reduce_from_tp(F.linear(act, lw["down"]))
        h = self.copy_to_tp(self.rms_norm(x, self.norm))
        logits = F.linear(h, self.head)                          # [B, T, V/tp]
        logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
        target = ids[:, 1:].reshape(-1)
        if self.tp == 1:
            return F.cross_entropy(logits, target)
        return _VocabParallelCE.apply(logits, target, self.vstart, self.vstop).mean()

    # -- after backward
    def reduce_replicated_grads(self):
        """q_norm/k_norm saw only local heads: sum their grads over ranks (one buffer)."""
        gs = [self.params[n].grad for n in sorted(self.allreduce_grad) if self.params[n].grad is not None]
        if not gs:
            return
        flat = torch.cat([g.reshape(-1) for g in gs])
        dist.all_reduce(flat)
        off = 0
        for g in gs:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def clip_grad_norm(self):
        """torch.nn.utils.clip_grad_norm_(params, 1.0) over the whole (unsharded) model."""
        if self.tp == 1:
            return float(torch.nn.utils.clip_grad_norm_(self.parameters(), MAX_GRAD_NORM))
        sharded = [p.grad for n, p in self.params.items() if p.grad is not None and self.split[n] is not None]
        repl = [p.grad for n, p in self.params.items() if p.grad is not None and self.split[n] is None]
        sq = torch.stack([torch.norm(g.detach(), 2.0) for g in sharded]).double().pow(2).sum()
        if self.rank == 0 and repl:      # replicated grads are equal on every rank: count once
            sq = sq + torch.stack([torch.norm(g.detach(), 2.0) for g in repl]).double().pow(2).sum()
        sq = sq.reshape(1)
        dist.all_reduce(sq)
        total = sq.sqrt().float()
        coef = torch.clamp(MAX_GRAD_NORM / (total + 1e-6), max=1.0)
        for g in sharded + repl:
            g.detach().mul_(coef)
        return float(total)


# ----------------------------------------------------------------------------- one rank

def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # KiB on Linux


def run_rank(rank, world, a, init_file, out_dir):
    torch.set_num_threads(a.threads)
    if world > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    t0 = time.perf_counter()
    model = Model(a.model, world, rank)
    load_s = time.perf_counter() - t0
    params = model.parameters()
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, foreach=a.foreach)
    gen = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, model.V, (a.batch, a.seq_len), generator=gen)
    use_autocast = not a.f32

    def barrier():
        if world > 1:
            dist.barrier()

    losses, norms, rows, grads_per_step = [], [], [], []
    for step in range(a.warmup + a.steps):
        barrier()
        t = [time.perf_counter()]
        if use_autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model.loss(ids)
        else:
            loss = model.loss(ids)
        t.append(time.perf_counter())
        loss.backward()
        if world > 1:
            model.reduce_replicated_grads()
        t.append(time.perf_counter())
        if out_dir:                                  # --check: grads before clipping
            grads_per_step.append({n: p.grad.detach().clone() for n, p in model.params.items()})
        norms.append(model.clip_grad_norm())
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        t.append(time.perf_counter())
        losses.append(float(loss))
        rows.append([t[j + 1] - t[j] for j in range(5)] + [t[5] - t[0]])
        if a.verbose and rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f} grad_norm {norms[-1]:.4f} {rows[-1][-1]:.3f} s",
                  file=sys.stderr, flush=True)

    rss = torch.tensor([peak_rss_mb()], dtype=torch.float64)    # the training steps' peak

    # --compare-foreach: extra optimizer steps (random grads), alternating the two code paths
    opt_cmp = None
    if a.compare_foreach:
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt_cmp = {"foreach": [], "for_loop": []}
        for _ in range(a.compare_foreach):
            for flag, key in ((True, "foreach"), (False, "for_loop")):
                opt.param_groups[0]["foreach"] = flag
                barrier()
                s = time.perf_counter()
                opt.step()
                d = torch.tensor([time.perf_counter() - s], dtype=torch.float64)
                if world > 1:
                    dist.all_reduce(d, op=dist.ReduceOp.MAX)
                opt_cmp[key].append(round(float(d), 4))
        opt.param_groups[0]["foreach"] = a.foreach

    if out_dir:
        torch.save({"losses": losses, "norms": norms, "grads": grads_per_step,
                    "params": {n: p.detach().clone() for n, p in model.params.items()},
                    "split": model.split}, os.path.join(out_dir, f"rank{rank}.pt"))
    # the step of the job is its slowest rank's
    timed = torch.tensor(rows[a.warmup:], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(timed, op=dist.ReduceOp.MAX)
        all_rss = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(all_rss, rss)
        rss_list = [round(float(r), 1) for r in all_rss]
    else:
        rss_list = [round(float(rss), 1)]
    if rank == 0 and not out_dir:
        step_s = [round(float(r[-1]), 4) for r in timed]
        med = statistics.median(step_s)
        phases = ["forward", "backward", "clip", "optimizer", "zero_grad"]
        out = {"tp": world, "threads": a.threads, "seq_len": a.seq_len, "batch": a.batch,
               "step_s": step_s, "median_step_s": med, "tokens_per_s": round(a.batch * a.seq_len / med, 2),
               "foreach": a.foreach, "torch": torch.__version__, "peak_rss_mb_per_rank": rss_list,
               "phase_median_s": {ph: round(statistics.median(float(r[j]) for r in timed), 4)
                                  for j, ph in enumerate(phases)},
               "losses": [round(x, 6) for x in losses], "grad_norms": [round(x, 6) for x in norms],
               "autocast": "bf16" if use_autocast else "off (f32)", "warmup": a.warmup,
               "load_s": round(load_s, 3), "model": os.path.abspath(a.model),
               "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
        if opt_cmp:
            out["optimizer_step_s"] = opt_cmp
        print(json.dumps(out), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def launch(a, world, out_dir=None):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    if world == 1:
        run_rank(0, 1, a, None, out_dir)
        return
    tmp = tempfile.mkdtemp(prefix="torch_train_step.")
    try:
        mp.spawn(run_rank, args=(world, a, os.path.join(tmp, "pg_init"), out_dir), nprocs=world, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- --check

def gather(shards, split_of_rank):
    """Full tensor from the ranks' pieces (replicated: rank 0's, after checking all agree)."""
    if split_of_rank[0] is None:
        for s in shards[1:]:
            if not torch.equal(s, shards[0]) and (s - shards[0]).abs().max() > 1e-6 * shards[0].abs().max():
                return None
        return shards[0]
    dim = split_of_rank[0][0]
    return torch.cat(shards, dim=dim)


def rel(a, b):
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


def reference_loss(model_dir, ids):
    """Loss from tests/reference/reference_forward.py's independent forward, if present."""
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return None
    try:
        per_row = []
        with torch.no_grad():
            for row in ids.tolist():
                logits = reference_forward.forward(model_dir, row)
                per_row.append(F.cross_entropy(logits[:-1], torch.tensor(row[1:])))
        return float(torch.stack(per_row).mean())
    except Exception as e:          # an optional extra; the tp=1 vs tp=K comparison stands alone
        print(f"note: reference_forward.py not usable ({type(e).__name__}: {e}); skipped", file=sys.stderr)
        return None


def check(a):
    tol = 1e-4
    k = a.tp if a.tp > 1 else 2
    a.f32, a.warmup, a.steps, a.compare_foreach = True, 0, 3, 0
    a.seq_len = a.seq_len if a.seq_len_given else 32
    a.batch = a.batch if a.batch_given else 2
    results = {}
    tmp = tempfile.mkdtemp(prefix="torch_train_step_check.")
    try:
        for world in (1, k):
            d = os.path.join(tmp, f"tp{world}")
            os.makedirs(d)
            launch(a, world, d)
            results[world] = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    one, many = results[1][0], results[k]
    bad = []
    worst = {"loss": 0.0, "grad_norm": 0.0, "grad": 0.0, "param": 0.0}
    for s in range(a.steps):
        for key, l1, lk in (("loss", one["losses"][s], many[0]["losses"][s]),
                            ("grad_norm", one["norms"][s], many[0]["norms"][s])):
            e = abs(l1 - lk) / max(abs(l1), 1e-30)
            worst[key] = max(worst[key], e)
            if e > tol:
                bad.append(f"step {s} {key}: tp=1 {l1:.8g} tp={k} {lk:.8g} (rel {e:.2e})")
        for r in range(1, k):
            if many[r]["losses"][s] != many[0]["losses"][s]:
                bad.append(f"step {s}: rank {r} loss {many[r]['losses'][s]} != rank 0 {many[0]['losses'][s]}")
    splits = [m["split"] for m in many]
    for what, ref, parts_of in (
            [("grad", one["grads"][s], [m["grads"][s] for m in many]) for s in range(a.steps)]
            + [("param", one["params"], [m["params"] for m in many])]):
        for name, full in ref.items():
            got = gather([p[name] for p in parts_of], [sp[name] for sp in splits])
            if got is None:
                bad.append(f"{what} {name}: replicated copies differ across ranks")
                continue
            if got.shape != full.shape:
                bad.append(f"{what} {name}: gathered shape {list(got.shape)} != {list(full.shape)}")
                continue
            e = rel(full, got)
            worst[what] = max(worst[what], e)
            if e > tol:
                bad.append(f"{what} {name}: max|diff|/max|tp=1| = {e:.2e}")
    gen = torch.Generator().manual_seed(a.seed)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    ids = torch.randint(0, cfg["vocab_size"], (a.batch, a.seq_len), generator=gen)
    ref = reference_loss(a.model, ids)
    if ref is not None:
        e = abs(ref - one["losses"][0]) / abs(ref)
        worst["loss_vs_reference_forward"] = e
        if e > tol:
            bad.append(f"step 0 loss {one['losses'][0]:.8g} vs tests/reference/reference_forward.py {ref:.8g}")
    for b in bad[:40]:
        print("  " + b, file=sys.stderr)
    ok = not bad
    print(json.dumps({"check": "PASS" if ok else "FAIL", "model": os.path.abspath(a.model),
                      "model_type": cfg["model_type"], "tp": [1, k], "steps": a.steps,
                      "batch": a.batch, "seq_len": a.seq_len, "tolerance_rel": tol,
                      "losses_tp1": one["losses"], f"losses_tp{k}": many[0]["losses"],
                      "grad_norms_tp1": one["norms"], "worst_rel": {x: float(f"{v:.3g}") for x, v in worst.items()},
                      "torch": torch.__version__}))
    print("PASS" if ok else "FAIL")
    return ok


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model dir: config.json + model.safetensors[.index.json]")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (gloo)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (512; --check: 32)")
    ap.add_argument("--batch", type=int, default=None, help="sequences (1; --check: 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    ap.add_argument("--foreach", choices=["true", "false"], default="false",
                    help="torch.optim.AdamW(foreach=...); false measured faster (README)")
    ap.add_argument("--compare-foreach", type=int, default=0, metavar="N",
                    help="after the run, time N extra optimizer steps each with foreach=True and False")
    ap.add_argument("--f32", action="store_true", help="no autocast: the whole step in float32")
    ap.add_argument("--check", action="store_true", help="tp=1 vs tp=K (default 2) on a tiny model, f32, 3 steps")
    ap.add_argument("--verbose", action="store_true", help="per-step loss and time on stderr")
    a = ap.parse_args()
    a.foreach = a.foreach == "true"
    a.seq_len_given, a.batch_given = a.seq_len is not None, a.batch is not None
    a.seq_len = a.seq_len if a.seq_len is not None else 512
    a.batch = a.batch if a.batch is not None else 1
    if a.seq_len < 2:
        raise SystemExit("--seq-len must be at least 2")
    if a.check:
        sys.exit(0 if check(a) else 1)
    launch(a, a.tp)


if __name__ == "__main__":
    main()
