#pragma once
// Elementwise arithmetic on f32 tensors. add/mul take equal shapes, or one operand
// whose shape is a trailing part of the other's (bias [N] over [..., N]); the
// result has the larger shape. Other float dtypes are converted to f32 first.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double s);
Tensor sum(const Tensor& x);  // all elements → shape {}
// In place, records nothing (inference residuals): a += b (b may broadcast as above).
void add_(Tensor& a, const Tensor& b);

}  // namespace tp::ops
