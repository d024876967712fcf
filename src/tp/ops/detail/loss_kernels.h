#pragma once
// The kernels behind ops/loss.h, one set per device (ops/dispatch.h).
// logits [N, V] f32, targets [N] i64 or i32 (checked by the op: each is
// ignore_index or in [0, V)), lse [N] f32.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct LossKernels {
  // lse[i] = log(sum_j exp(logits[i, j])) for every row whose target is kept (0
  // for ignored ones); returns the sum over kept rows of lse[i] - logits[i, t_i].
  double (*cross_entropy)(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse);
  // dx [N, V] (zeroed by the caller) = k * (softmax(logits) - onehot(t)) on kept rows, from the forward's lse.
  void (*cross_entropy_backward)(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                                 float k, const Tensor& dx);
};

KernelTable<LossKernels>& loss_kernels();

}  // namespace tp::ops
