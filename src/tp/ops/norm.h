#pragma once
// RMSNorm as in Transformers' Llama: y = w * (x / sqrt(mean(x^2) + eps)), in f32,
// over the last dimension. x [..., H] f32, w [H] f32 or bf16.
#include "tp/tensor/tensor.h"

namespace tp::ops {

// With a weight_offset, y = (weight_offset + w) * (x / sqrt(mean(x^2) + eps)),
// the sum in f32: Gemma's norms (offset 1, their weights stored as w - 1).
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, double weight_offset = 0.0);

// Inference forms (no gradients), bitwise equal to the differentiable ones.
// The output in `out_dtype`, f32 or bf16: bf16 is the rounding a bf16 projection
// applies to its input anyway, done here instead of in another pass.
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, DType out_dtype);
// A decoder layer's residual add and the norm after it, one pass per row:
// sum = x + delta (f32), normed = rms_norm(sum) in `out_dtype`. At tp > 1 every
// rank repeats this work, so the passes it saves are what TP cannot split.
struct AddRmsNorm {
  Tensor sum, normed;
};
AddRmsNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& w, double eps, DType out_dtype);

}  // namespace tp::ops
