#pragma once
// The kernels behind ops/norm.h, one set per device (ops/dispatch.h).
// Tensors are f32 unless named; undefined ones are absent.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct NormKernels {
  // out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), out f32 or bf16; with `delta`
  // defined, each row is first summed into `sum` (x + delta) and normalized from there.
  void (*normalize_rows)(const Tensor& x, const Tensor& delta, const Tensor& sum, const Tensor& w, double eps,
                         const Tensor& out);
  // out = offset + w.
  void (*offset_weight)(const Tensor& w, double offset, const Tensor& out);
  // The gradients of normalize_rows (without delta) by x and by w, given the
  // output's gradient g; dx / dw are written where defined (dw overwritten).
  void (*backward)(const Tensor& x, const Tensor& w, const Tensor& g, double eps, const Tensor& dx,
                   const Tensor& dw);
};

KernelTable<NormKernels>& norm_kernels();

}  // namespace tp::ops
