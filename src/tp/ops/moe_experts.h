#pragma once
// Routed SwiGLU experts of a mixture-of-experts layer, as a grouped GEMM: the
// (token, slot) pairs are sorted by expert and each expert runs one GEMM over its
// own tokens (experts with none are skipped). Transformers v5's fused layout.
//
//   N = tokens, H = hidden, E = experts (this rank's), I = expert intermediate, K = top-k
//   x        [N, H]      f32
//   ids      [N, K]      i64 expert per slot; id == E is the expert-parallel sentinel (skipped)
//   weights  [N, K]      f32 routing weight per slot
//   gate_up  [E, 2I, H]  rows 0..I-1 gate, I..2I-1 up (Linear layout out x in)
//   down     [E, H, I]
//   out[n] = sum_k weights[n,k] * down[e] (silu(gate[e] x[n]) * up[e] x[n]),  e = ids[n,k]
// Products accumulate in f32 (bf16 weights: bf16 operands); the combine is in f32.
// Differentiable w.r.t. x, weights, gate_up and down.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                   const Tensor& down);

}  // namespace tp::ops

namespace tp::ops {

// A softmax router's choice (Mixtral, Qwen3-MoE): probabilities softmax(logits) in
// f32 over all E experts, the top k of them per token (ties: the lower id), and,
// with `renormalize`, those k divided by their sum.
//   logits [N, E] f32 -> weights [N, K] f32 (differentiable w.r.t. logits), ids [N, K] i64
struct TopK {
  Tensor weights;
  Tensor ids;
};
TopK softmax_top_k(const Tensor& logits, int64_t k, bool renormalize);

// One token's row of that choice (also for the routers' aux loss): probs[E] =
// softmax(logits[E]) (f32, the sum in f64), and the ids of the k largest,
// largest first (ties: the lower id).
void softmax_row(const float* logits, int64_t E, float* probs);
void top_k_row(const float* probs, int64_t E, int64_t k, int64_t* ids);

}  // namespace tp::ops

namespace tp::ops {

// Rows of x [N, H] in the order `rows` [P] (i64) lists them -> [P, H]
// (bwd: each row's gradient added back into its source row).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows);
// The weighted sum back into n rows: out [n, H], out[rows[p]] += weights[p] * y[p]
// for y [P, H], weights [P] f32 (differentiable w.r.t. y and weights).
Tensor combine_rows(const Tensor& y, const std::vector<int64_t>& rows, const Tensor& weights, int64_t n);

}  // namespace tp::ops
