#include "tp/ops/loss.h"

#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/loss_kernels.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

// log(sum(exp(row))) with the max subtracted for stability.
float log_sum_exp(const float* row, int64_t v) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
  float s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
  return mx + std::log(s);
}

double cross_entropy_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse_t) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const std::vector<int64_t> t = targets.to_int_vector();
  const float* x = logits.data<float>();
  float* lse = lse_t.data<float>();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n * v > 65536)
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) continue;
    lse[i] = log_sum_exp(x + i * v, v);
    total += lse[i] - x[i * v + t[i]];
  }
  return total;
}

// d/dx_ij = k * (softmax_ij - [j == t_i]), zero rows for ignored targets.
void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                const Tensor& lse_t, float k, const Tensor& dx) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const std::vector<int64_t> t = targets.to_int_vector();
  const float* x = logits.data<float>();
  const float* lse = lse_t.data<float>();
  float* d = dx.data<float>();
  parallel_for(n, n * v > 65536, [&](int64_t i) {
    if (t[i] == ignore_index) return;
    for (int64_t j = 0; j < v; ++j) d[i * v + j] = k * std::exp(x[i * v + j] - lse[i]);
    d[i * v + t[i]] -= k;
  });
}

constexpr LossKernels kCpuLossKernels{cross_entropy_cpu, cross_entropy_backward_cpu};

}  // namespace

KernelTable<LossKernels>& loss_kernels() {
  static KernelTable<LossKernels> table("cross_entropy", &kCpuLossKernels);
  return table;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_f32(logits, "cross_entropy", "logits");
  TP_CHECK(targets.defined() && (targets.dtype() == DType::I64 || targets.dtype() == DType::I32),
           "cross_entropy: targets must be i64 or i32");
  TP_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
           "cross_entropy: logits shape {} and targets shape {} do not match (expected [N, V] and [N])",
           shape_str(logits.shape()), shape_str(targets.shape()));
  int64_t n = logits.size(0), v = logits.size(1);
  std::vector<int64_t> t = targets.to_int_vector();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) continue;
    TP_CHECK(t[i] >= 0 && t[i] < v, "cross_entropy: target {} at row {} is outside [0, {}) (ignore_index is {})",
             t[i], i, v, ignore_index);
    ++count;
  }
  Tensor lse = Tensor::zeros({n});
  const double total = loss_kernels().on(logits, targets).cross_entropy(logits, targets, ignore_index, lse);
  Tensor out = Tensor::full({}, count ? total / static_cast<double>(count) : 0.0);
  if (autograd::needs_grad({logits})) {
    autograd::record("cross_entropy", {logits, targets}, {out},
                     [logits, targets, lse, count, ignore_index](const std::vector<Tensor>& g) {
                       Tensor dx = Tensor::zeros(logits.shape());
                       if (count == 0) return std::vector<Tensor>{dx, Tensor()};
                       float k = static_cast<float>(g[0].item() / static_cast<double>(count));
                       loss_kernels().on(logits, targets, lse).cross_entropy_backward(logits, targets, ignore_index,
                                                                                      lse, k, dx);
                       return std::vector<Tensor>{dx, Tensor()};
                     });
  }
  return out;
}

}  // namespace tp::ops
