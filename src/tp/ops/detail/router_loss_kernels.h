#pragma once
// The kernels behind ops/router_loss.h, one set per device (ops/dispatch.h).
// The per-expert sums are E host doubles: the loss is formed from them on the host.
#include <vector>

#include "tp/ops/dispatch.h"

namespace tp::ops {

struct RouterLossKernels {
  // For one layer's logits [N, E] (f32): probs [N, E] = the rows' softmax, and
  // added to prob_sum[e] / routed[e] (row by row) each row's p[e] / whether e is among its top_k.
  void (*route_stats)(const Tensor& logits, int64_t top_k, const Tensor& probs, std::vector<double>& prob_sum,
                      std::vector<double>& routed);
  // d [N, E] = up * the softmax backward of probs [N, E] against the per-expert slope d loss / d p[., e].
  void (*backward)(const Tensor& probs, const std::vector<float>& slope, float up, const Tensor& d);
};

KernelTable<RouterLossKernels>& router_loss_kernels();

}  // namespace tp::ops
