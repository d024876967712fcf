#pragma once
// The sum of squares of a gradient, in f64, for the global gradient norm
// (training::ModelParameters::global_grad_norm keeps the rule of which
// parameters count, and the reduction over ranks).
#include "tp/tensor/tensor.h"

namespace tp::ops {

// Adds the squares of f32 x's elements to `total`: x in blocks of 64 Ki elements
// over threads, each block's sum then added to total in block order, so the bits
// do not depend on the thread count. Calls in a fixed order give the same total
// on every rank.
void accumulate_sum_squares(const Tensor& x, double& total);

}  // namespace tp::ops
