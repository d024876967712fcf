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
// Differentiable w.r.t. x, weights, gate_up and down (and the biases).
//
// GPT-OSS stores its experts otherwise (ExpertOptions::gpt_oss()):
//   gate_up  [E, H, 2I]  x @ W (in x out), gate = columns 0::2, up = columns 1::2
//   down     [E, I, H]
//   biases   gate_up_bias [E, 2I], down_bias [E, H]
//   act      gate = min(gate, limit), up = clamp(up, -limit, limit),
//            (up + 1) * gate * sigmoid(alpha * gate)
#include <span>
#include <vector>

#include "tp/ops/quantized_linear.h"
#include "tp/tensor/tensor.h"

namespace tp::ops {

struct ExpertOptions {
  bool in_by_out = false;    // gate_up [E, H, 2I] and down [E, I, H] (x @ W), not Linear's out x in
  bool interleaved = false;  // gate and up alternate in gate_up's 2I (gate even, up odd), not halves
  float swiglu_limit = 0;    // > 0: GPT-OSS's clamped SwiGLU with swiglu_alpha and (up + 1); 0: silu(gate) * up
  float swiglu_alpha = 1.702f;
  Tensor gate_up_bias;       // undefined, or [E, 2I] (in gate_up's column order)
  Tensor down_bias;          // undefined, or [E, H]
  // The down bias is added (false: left out, e.g. by ranks whose partial sums
  // are added up first; routed_bias adds it then).
  bool add_down_bias = true;
  // Packed experts (inference only: GPT-OSS's MXFP4, a quantized checkpoint's experts, kept as they are read):
  // each local expert's gate_up and down as a QuantizedLinear in Linear's layout, gate_up [2I, H] (its rows
  // gate_up's 2I columns, in their order) and down [H, I]; the gate_up and down tensors are then undefined. With
  // packed_up, packed_gate_up holds the gate rows [I, H] alone and packed_up the up rows (each its own
  // quantization, e.g. its own act-order).
  const std::vector<QuantizedLinear>* packed_gate_up = nullptr;
  const std::vector<QuantizedLinear>* packed_up = nullptr;
  const std::vector<QuantizedLinear>* packed_down = nullptr;
  // Packed experts: which tokens (one flag per row of x, or empty) are decode steps; their pairs take decode's
  // kernels however many an expert gets (ops::linear's decode_rows), so their bits do not depend on the tokens
  // beside them. Empty: every expert's pair count picks.
  std::span<const uint8_t> decode_tokens;
  // Packed experts: the arithmetic of the GEMM an expert's prompt rows take when they are many (more than
  // QuantizedLinear::decode_rows_limit; fewer take decode's kernels): the model's, bf16 for a bf16 model, as a
  // quantized Linear's prefill.
  DType packed_compute = DType::F32;
  static ExpertOptions gpt_oss(float limit, float alpha);
};

Tensor moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_up,
                   const Tensor& down, const ExpertOptions& options = {});

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
  bool top_k_then_softmax = false;  // GPT-OSS: the top k of the raw logits, then a softmax over them (top_k_softmax)
};
struct TopK {
  Tensor weights;  // [N, K] f32 (differentiable w.r.t. logits)
  Tensor ids;      // [N, K] i64
};
// logits [N, E] f32; bias undefined or [E] f32.
TopK route_top_k(const Tensor& logits, const RouterScoring& scoring, const Tensor& bias = {});
// The softmax router's choice (Mixtral, Qwen3-MoE).
TopK softmax_top_k(const Tensor& logits, int64_t k, bool renormalize);

// GPT-OSS's router: the top k of the raw logits per token (ties: the lower id),
// then a softmax over those k values (in f32).
//   logits [N, E] f32 -> weights [N, K] f32 (differentiable w.r.t. logits), ids [N, K] i64
TopK top_k_softmax(const Tensor& logits, int64_t k);

// The CPU kernels' helpers, on host memory (here and in router_loss.cpp).
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

// The experts' output biases as routed: out[n] = sum_k weights[n,k] * bias[ids[n,k]]
// for bias [E, H] (slots with the sentinel id E skipped) -> [N, H] f32.
// Differentiable w.r.t. weights and bias (gather_rows, then combine_rows).
Tensor routed_bias(const Tensor& ids, const Tensor& weights, const Tensor& bias);

}  // namespace tp::ops
