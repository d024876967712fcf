#pragma once
// Cross-entropy, mean over targets != ignore_index: logits [N, V] f32, targets [N]
// i64 (or i32). When every target is ignored the loss is 0 (and so is its gradient),
// not NaN as in torch, so that an all-padding micro-batch does not poison training.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace tp::ops
