#pragma once
// The kernels behind ops/vocab_parallel_loss.h, one set per device (ops/dispatch.h).
// Arguments as the ops name them; an undefined tensor is absent.
#include "tp/ops/dispatch.h"
#include "tp/ops/vocab_parallel_loss.h"

namespace tp::ops {

struct VocabParallelLossKernels {
  void (*row_max)(const Tensor& logits, const Tensor& row_max);
  void (*exp_sums)(const Tensor& logits, const Tensor& row_max, const Tensor& target, int64_t start,
                   int64_t ignore_index, const Tensor& sums);
  void (*online_stats)(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                       const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit);
  void (*rescale_to_max)(const Tensor& global_max, const Tensor& row_max, const Tensor& sum_exp);
  double (*total)(const Tensor& target, int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                  const Tensor& target_logit);
  void (*softmax_grad)(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                       const Tensor& row_max, const Tensor& sum_exp, float k);
  // out = hidden rounded to bf16 (same shape).
  void (*to_bf16)(const Tensor& hidden, const Tensor& out);
  // logits [n, nb] (a view of the scratch buffer) of saved_rows by w_rows.
  void (*chunk_logits)(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                       const Tensor& widened, const Tensor& logits);
  void (*chunk_backward)(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                         const Tensor& target, int64_t start, int64_t ignore_index, const Tensor& row_max,
                         const Tensor& sum_exp, float k, const Tensor& logits, const Tensor& widened,
                         const Tensor& d_bf16, const Tensor& dh_rows, bool accumulate_dh, const Tensor& dw);
};

KernelTable<VocabParallelLossKernels>& vocab_parallel_loss_kernels();

}  // namespace tp::ops
