#pragma once
// The kernels behind ops/shape.h, one set per device (ops/dispatch.h). Only the
// gradients that move elements need one: reshape, cat, transpose and to_dtype
// are views or Tensor methods.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct ShapeKernels {
  // narrow's backward: g (f32) written into dx's slice [start, start + g.size(dim))
  // along `dim`; the rest of dx (f32, zeroed by the caller) is left as it is.
  void (*narrow_backward)(const Tensor& g, int64_t dim, int64_t start, const Tensor& dx);
};

KernelTable<ShapeKernels>& shape_kernels();

}  // namespace tp::ops
