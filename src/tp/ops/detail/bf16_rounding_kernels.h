#pragma once
// The kernels behind ops/bf16_rounding.h, one set per device (ops/dispatch.h).
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct Bf16RoundingKernels {
  // dst (bf16, or f32 holding bf16 values) = src (f32) rounded to bf16.
  void (*round)(const Tensor& src, const Tensor& dst);
};

KernelTable<Bf16RoundingKernels>& bf16_rounding_kernels();

}  // namespace tp::ops
