#pragma once
// The kernels behind ops/dropout.h, one set per device (ops/dispatch.h).
#include "tp/ops/dispatch.h"
#include "tp/ops/dropout.h"

namespace tp::ops {

struct DropoutKernels {
  // out (f32, its last dim the window's columns) = the mask of `window` (ops/dropout.h).
  void (*mask)(double p, uint64_t stream, const DropoutWindow& window, const Tensor& out);
};

KernelTable<DropoutKernels>& dropout_kernels();

}  // namespace tp::ops
