#include "tp/ops/router_loss.h"

#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/ops/detail/router_loss_kernels.h"
#include "tp/ops/moe_experts.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

void route_stats_cpu(const Tensor& l, int64_t top_k, const Tensor& p, std::vector<double>& prob_sum,
                     std::vector<double>& routed) {
  const int64_t N = l.size(0), E = l.size(1);
  const float* x = l.data<float>();
  float* pr = p.data<float>();
  std::vector<int64_t> chosen(static_cast<size_t>(top_k));
  for (int64_t n = 0; n < N; ++n) {
    // The router's own choice (ops::softmax_top_k's rows).
    softmax_row(x + n * E, E, pr + n * E);
    for (int64_t e = 0; e < E; ++e) prob_sum[e] += pr[n * E + e];
    top_k_row(pr + n * E, E, top_k, chosen.data());
    for (int64_t e : chosen) routed[e] += 1.0;
  }
}

void backward_cpu(const Tensor& p, const std::vector<float>& slope, float up, const Tensor& d) {
  const int64_t N = p.size(0), E = p.size(1);
  const float* pr = p.data<float>();
  float* dl = d.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    // softmax: d logit_e = p_e (s_e - sum_i s_i p_i)
    double inner = 0;
    for (int64_t e = 0; e < E; ++e) inner += static_cast<double>(slope[e]) * pr[n * E + e];
    for (int64_t e = 0; e < E; ++e) dl[n * E + e] = static_cast<float>(up * pr[n * E + e] * (slope[e] - inner));
  }
}

constexpr RouterLossKernels kCpuRouterLossKernels{route_stats_cpu, backward_cpu};

}  // namespace

KernelTable<RouterLossKernels>& router_loss_kernels() {
  static KernelTable<RouterLossKernels> table("router_load_balancing_loss", &kCpuRouterLossKernels);
  return table;
}

Tensor router_load_balancing_loss(const std::vector<Tensor>& logits, int64_t top_k) {
  TP_CHECK(!logits.empty(), "router_load_balancing_loss: no router logits (the model has no sparse layer)");
  const int64_t E = logits[0].size(-1);
  TP_CHECK(top_k >= 1 && top_k <= E, "router_load_balancing_loss: top_k {} must be in [1, {}] (the experts)", top_k, E);
  int64_t M = 0;
  for (const Tensor& l : logits) {
    TP_CHECK(l.dim() == 2 && l.size(1) == E && l.dtype() == DType::F32,
             "router_load_balancing_loss: every layer's logits must be f32 [tokens, {}], got {} {}", E,
             dtype_name(l.dtype()), shape_str(l.shape()));
    M += l.size(0);
  }
  TP_CHECK(M > 0, "router_load_balancing_loss: the routers saw no token");
  // Softmax probabilities of every row (kept for the backward), their column sums
  // and the top-k counts, in f64 over rows.
  std::vector<Tensor> probs;
  std::vector<double> prob_sum(static_cast<size_t>(E), 0.0), routed(static_cast<size_t>(E), 0.0);
  for (const Tensor& l : logits) {
    const int64_t N = l.size(0);
    Tensor p = Tensor::empty({N, E});
    router_loss_kernels().on(l).route_stats(l, top_k, p, prob_sum, routed);
    probs.push_back(p);
  }
  double loss = 0;
  std::vector<float> slope(static_cast<size_t>(E));  // d loss / d p[m, e] = E f[e] / M, the same for every row
  for (int64_t e = 0; e < E; ++e) {
    const double f = routed[e] / static_cast<double>(M);
    loss += f * prob_sum[e] / static_cast<double>(M);
    slope[e] = static_cast<float>(static_cast<double>(E) * f / static_cast<double>(M));
  }
  Tensor out = Tensor::full({}, static_cast<float>(static_cast<double>(E) * loss));
  if (autograd::needs_grad(logits))
    autograd::record("router_load_balancing_loss", logits, {out}, [probs, slope, E](const std::vector<Tensor>& g) {
      const float up = g[0].item();
      std::vector<Tensor> grads;
      for (const Tensor& p : probs) {
        const int64_t N = p.size(0);
        Tensor d = Tensor::empty({N, E});
        router_loss_kernels().on(p).backward(p, slope, up, d);
        grads.push_back(d);
      }
      return grads;
    });
  return out;
}

}  // namespace tp::ops
