#pragma once
// The kernels behind ops/moe_experts.h, one set per device (ops/dispatch.h):
// the routed experts with their row gathers and combines, and the routers.
// Shapes and names are the header's (N tokens, H hidden, E experts, I the
// experts' intermediate size, K slots a token); the ops check them and allocate.
#include <vector>

#include "tp/ops/dispatch.h"
#include "tp/ops/moe_experts.h"

namespace tp::ops {

struct ExpertDims {
  int64_t N, H, K, E, I;
};

struct MoeExpertsKernels {
  // out [N, H] (zeroed by the caller) += each (token, slot)'s weighted expert
  // output; `options` holds f32 biases (or none). Ids are checked against E here,
  // where they are read (E itself: the skipped sentinel).
  void (*forward)(const ExpertDims& d, const Tensor& x, const Tensor& ids, const Tensor& weights,
                  const Tensor& gate_up, const Tensor& down, const ExpertOptions& options, const Tensor& out);
  // forward's gradients from dout [N, H], the expert weights f32, every gradient
  // zeroed by the caller: dx [N, H], dweights [N, K], dgate_up / ddown (the
  // weights' shapes), dgate_up_bias [E, 2I], ddown_bias [E, H].
  void (*backward)(const ExpertDims& d, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const Tensor& gate_up, const Tensor& down, const ExpertOptions& options, const Tensor& dout,
                   const Tensor& dx, const Tensor& dweights, const Tensor& dgate_up, const Tensor& ddown,
                   const Tensor& dgate_up_bias, const Tensor& ddown_bias);
  // out [P, H] = x's rows in `rows`' order; dx [N, H] (zeroed) += g's rows back at their sources.
  void (*gather_rows)(const Tensor& x, const std::vector<int64_t>& rows, const Tensor& out);
  void (*gather_rows_backward)(const Tensor& g, const std::vector<int64_t>& rows, const Tensor& dx);
  // out [n, H] (zeroed) += weights[p] * y[p] at row rows[p]; the backward: dy [P, H], dweights [P].
  void (*combine_rows)(const Tensor& y, const std::vector<int64_t>& rows, const Tensor& weights, const Tensor& out);
  void (*combine_rows_backward)(const Tensor& g, const Tensor& y, const std::vector<int64_t>& rows,
                                const Tensor& weights, const Tensor& dy, const Tensor& dweights);
};

KernelTable<MoeExpertsKernels>& moe_experts_kernels();

struct RoutingKernels {
  // route_top_k's choice from logits [N, E] (bias [E] or undefined): probs [N, E]
  // the scores, weights [N, K], ids [N, K] i64, sums [N] the chosen scores' sums.
  void (*route_top_k)(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring, const Tensor& probs,
                      const Tensor& weights, const Tensor& ids, const Tensor& sums);
  // dlogits [N, E] (zeroed by the caller) from dweights [N, K] and the forward's outputs.
  void (*route_top_k_backward)(const Tensor& logits, const Tensor& probs, const Tensor& weights, const Tensor& ids,
                               const Tensor& sums, const RouterScoring& scoring, const Tensor& dweights,
                               const Tensor& dlogits);
  // top_k_softmax: weights [N, K] and ids [N, K] from logits [N, E].
  void (*top_k_softmax)(const Tensor& logits, const Tensor& weights, const Tensor& ids);
  // dlogits [N, E] (zeroed by the caller) from dweights [N, K].
  void (*top_k_softmax_backward)(const Tensor& weights, const Tensor& ids, const Tensor& dweights,
                                 const Tensor& dlogits);
};

KernelTable<RoutingKernels>& routing_kernels();

}  // namespace tp::ops
