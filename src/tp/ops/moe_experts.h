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

// How a router turns its logits [N, E] into k (weight, expert) pairs per token:
//   scores  = softmax(logits) in f32 (Mixtral, Qwen3-MoE, DeepSeek-V2) or sigmoid (DeepSeek-V3)
//   choice  = scores + bias (DeepSeek-V3's e_score_correction_bias; it picks, it never weighs)
//   groups  = with n_group > 1, the E experts in n_group contiguous groups, each scored by
//             its largest choice (DeepSeek-V2 group_limited_greedy) or the sum of its two
//             largest (DeepSeek-V3 noaux_tc); only the topk_group best groups stay eligible
//   ids     = the k largest eligible choices (ties: the lower id)
//   weights = scores[ids], divided by their sum with `renormalize`, times `scaling`
//             (routed_scaling_factor)
struct RouterScoring {
  int64_t top_k = 2;
  bool renormalize = true;  // Mixtral always; Qwen3-MoE and DeepSeek-V3: norm_topk_prob; DeepSeek-V2 never
  bool sigmoid = false;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool group_sum_top2 = false;  // else the group's max
  double scaling = 1.0;
};
struct TopK {
  Tensor weights;  // [N, K] f32 (differentiable w.r.t. logits)
  Tensor ids;      // [N, K] i64
};
// logits [N, E] f32; bias undefined or [E] f32.
TopK route_top_k(const Tensor& logits, const RouterScoring& scoring, const Tensor& bias = {});
// The softmax router's choice (Mixtral, Qwen3-MoE).
TopK softmax_top_k(const Tensor& logits, int64_t k, bool renormalize);

}  // namespace tp::ops

namespace tp::ops {

// Rows of x [N, H] in the order `rows` [P] (i64) lists them -> [P, H]
// (bwd: each row's gradient added back into its source row).
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows);
// The weighted sum back into n rows: out [n, H], out[rows[p]] += weights[p] * y[p]
// for y [P, H], weights [P] f32 (differentiable w.r.t. y and weights).
Tensor combine_rows(const Tensor& y, const std::vector<int64_t>& rows, const Tensor& weights, int64_t n);

}  // namespace tp::ops
