#pragma once
// The kernels behind ops/rope.h's apply_rope, one set per device (ops/dispatch.h).
// The frequencies are the host-side table rope_inv_freq / rope_yarn computed once per model.
#include <vector>

#include "tp/ops/dispatch.h"
#include "tp/ops/rope.h"

namespace tp::ops {

struct RopeKernels {
  // y = x [B, T, H, D] rotated by the angles positions [B, T] (i64) * inv_freq,
  // each sin scaled by `sign`: +1 the forward, -1 its backward (the transposed rotation).
  void (*rotate)(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, float sign,
                 const RopeOptions& options, const Tensor& y);
};

KernelTable<RopeKernels>& rope_kernels();

}  // namespace tp::ops
