#pragma once
// Differentiable versions of the raw Tensor shape methods.
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor reshape(const Tensor& x, const Shape& shape);                          // one dim may be -1
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor to_dtype(const Tensor& x, DType dtype);  // the gradient is converted back to x's dtype

}  // namespace tp::ops
