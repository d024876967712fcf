#pragma once
// The kernels behind ops/elementwise.h, one set per device (ops/dispatch.h).
// Tensors are f32 and contiguous. A broadcast operand `small` repeats along
// `big` every small.numel() elements (its shape is a suffix of big's).
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct ElementwiseKernels {
  // out = big + small / big * small, out shaped as big.
  void (*add)(const Tensor& big, const Tensor& small, const Tensor& out);
  void (*mul)(const Tensor& big, const Tensor& small, const Tensor& out);
  // The gradients of big * small given the output's gradient g: d_big = g * small,
  // d_small = g * big summed over the repeats down to small's numel.
  void (*mul_backward)(const Tensor& g, const Tensor& big, const Tensor& small, const Tensor& d_big,
                       const Tensor& d_small);
  // out [P] = the sum of g's rows [..., P] (the gradient of a broadcast operand).
  void (*sum_rows)(const Tensor& g, const Tensor& out);
  // out = x * s.
  void (*scale)(const Tensor& x, float s, const Tensor& out);
  // out (shape {}) = the sum of every element of x, accumulated in f64.
  void (*sum)(const Tensor& x, const Tensor& out);
  // a += small, in place (small repeating along a).
  void (*add_into)(const Tensor& a, const Tensor& small);
};

KernelTable<ElementwiseKernels>& elementwise_kernels();

}  // namespace tp::ops
