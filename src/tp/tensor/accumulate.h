#pragma once
// dst += src, elementwise over tensors of one shape, in f32 arithmetic: the one
// in-place add below ops/ (autograd sums gradients with it, and autograd sits
// under ops/). Like copy_from and fill, it is a storage-level primitive that a
// second device implements next to its allocator.
#include "tp/tensor/tensor.h"

namespace tp {

// f32 into f32 in place; any other pair of dtypes through f32 and back to dst's dtype.
void add_into(Tensor& dst, const Tensor& src);

}  // namespace tp
