#pragma once
// RMSNorm as in Transformers' Llama: y = w * (x / sqrt(mean(x^2) + eps)), in f32,
// over the last dimension. x [..., H] f32, w [H] f32 or bf16.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);

}  // namespace tp::ops
