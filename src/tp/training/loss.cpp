#include "tp/training/loss.h"

#include <cmath>

#include "tp/autograd/tape.h"
#include "tp/ops/vec.h"

namespace tp::training {

namespace {

// Row r = b * T + t predicts labels[b, t + 1]; the last position of each sequence predicts nothing.
std::vector<int64_t> shifted_targets(const Tensor& labels, int64_t ignore_index) {
  const int64_t B = labels.size(0), T = labels.size(1);
  std::vector<int64_t> l = labels.to_int_vector(), out(static_cast<size_t>(B * T), ignore_index);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) out[b * T + t] = l[b * T + t + 1];
  return out;
}

void check_labels(const Tensor& labels, const char* what) {
  TP_CHECK(labels.defined() && labels.dim() == 2 && (labels.dtype() == DType::I64 || labels.dtype() == DType::I32),
           "{}: labels must be an i64 tensor [batch, tokens], got {} {}", what,
           labels.defined() ? dtype_name(labels.dtype()) : "undefined",
           labels.defined() ? shape_str(labels.shape()) : "");
}

}  // namespace

int64_t count_targets(const Tensor& labels, int64_t ignore_index) {
  check_labels(labels, "count_targets");
  int64_t n = 0;
  for (int64_t t : shifted_targets(labels, ignore_index)) n += t != ignore_index;
  return n;
}

Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, double normalizer, const VocabSlice& vocab,
                      int64_t ignore_index) {
  check_labels(labels, "causal_lm_loss");
  TP_CHECK(logits.defined() && logits.dtype() == DType::F32 && logits.dim() == 3 &&
               logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
           "causal_lm_loss: logits must be f32 [batch, tokens, vocab] matching labels {}, got {} {}",
           shape_str(labels.shape()), dtype_name(logits.dtype()), shape_str(logits.shape()));
  TP_CHECK(normalizer > 0, "causal_lm_loss: the normalizer (targets in the step) must be positive, got {}",
           normalizer);
  const int64_t rows = logits.size(0) * logits.size(1), v = logits.size(2);
  const std::vector<int64_t> target = shifted_targets(labels, ignore_index);
  for (int64_t r = 0; r < rows; ++r)
    TP_CHECK(target[r] == ignore_index || (target[r] >= 0 && target[r] < vocab.vocab_size),
             "label {} (batch row {}, position {}) is outside the vocabulary [0, {}) and is not the ignore index {}",
             target[r], r / labels.size(1), r % labels.size(1) + 1, vocab.vocab_size, ignore_index);
  const bool parallel = vocab.group != nullptr && vocab.group->size() > 1;
  const auto& vk = ops::detail::vec_kernels();
  const float* x = logits.data<float>();

  // Local row max, then the global one.
  Tensor row_max = Tensor::empty({rows});
  float* mx = row_max.data<float>();
#pragma omp parallel for schedule(static) if (rows * v > 65536)
  for (int64_t r = 0; r < rows; ++r) mx[r] = vk.max(x + r * v, v);
  if (parallel) vocab.group->all_reduce(row_max, dist::ReduceOp::Max);

  // [sum of e^(x - max) | target logit] per row, summed over the slices in one all-reduce.
  Tensor sums = Tensor::zeros({2, rows});
  float* sum_exp = sums.data<float>();
  float* target_logit = sum_exp + rows;
#pragma omp parallel for schedule(static) if (rows * v > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    sum_exp[r] = vk.exp_sum(x + r * v, v, mx[r]);
    const int64_t local = target[r] - vocab.start;
    if (target[r] != ignore_index && local >= 0 && local < v) target_logit[r] = x[r * v + local];
  }
  if (parallel) vocab.group->all_reduce(sums, dist::ReduceOp::Sum);

  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (target[r] != ignore_index) total += std::log(static_cast<double>(sum_exp[r])) + mx[r] - target_logit[r];
  Tensor loss = Tensor::full({}, total / normalizer);

  if (autograd::needs_grad({logits})) {
    const int64_t start = vocab.start;
    autograd::record("causal_lm_loss", {logits, labels}, {loss},
                     [logits, target, row_max, sums, normalizer, start, ignore_index](const std::vector<Tensor>& g) {
                       // d loss / d x[r, j] = k * (softmax[r, j] - [j == target[r]]), k = grad / normalizer.
                       const int64_t rows = logits.size(0) * logits.size(1), v = logits.size(2);
                       const float k = static_cast<float>(g[0].item() / normalizer);
                       const float* x = logits.data<float>();
                       const float* mx = row_max.data<float>();
                       const float* sum_exp = sums.data<float>();
                       const auto& vk = ops::detail::vec_kernels();
                       Tensor dx = Tensor::empty(logits.shape());
                       float* d = dx.data<float>();
#pragma omp parallel for schedule(static) if (rows * v > 65536)
                       for (int64_t r = 0; r < rows; ++r) {
                         float* dr = d + r * v;
                         if (target[r] == ignore_index) {
                           std::fill(dr, dr + v, 0.f);
                           continue;
                         }
                         vk.exp_scale(x + r * v, v, mx[r], k / sum_exp[r], dr);
                         const int64_t local = target[r] - start;
                         if (local >= 0 && local < v) dr[local] -= k;
                       }
                       return std::vector<Tensor>{dx, Tensor()};
                     });
  }
  return loss;
}

}  // namespace tp::training
