#pragma once
// The kernels behind ops/sum_squares.h, one set per device (ops/dispatch.h).
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct SumSquaresKernels {
  // total += the sums of squares of x's 64 Ki-element blocks, in block order.
  void (*accumulate)(const Tensor& x, double& total);
};

KernelTable<SumSquaresKernels>& sum_squares_kernels();

}  // namespace tp::ops
