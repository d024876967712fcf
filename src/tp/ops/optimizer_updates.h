#pragma once
// The optimizers' element updates over a span of f32 masters, their gradients
// and their state; every operation as torch's for-loop AdamW / SGD does it, in
// that order, so each vector form gives its scalar form's bits (and torch's).
//
// A span is updated a block of 4096 elements at a time, blocks over threads;
// with `compute` defined (bf16, or f32 holding bf16 values: the span's part of
// a bf16 compute copy), each block's new masters are rounded into it while the
// block is still in cache.
#include <cstdint>

#include "tp/tensor/tensor.h"

namespace tp::ops {

// AdamW's per-step constants (lr and the bias corrections folded in by the caller).
struct AdamWScalars {
  float keep;  // 1 - lr * weight_decay (decoupled decay)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float step_size;   // lr / (1 - beta1^t)
  float grad_scale;  // clipping's factor, applied to each gradient first
};
// Masters w, gradients g, exp_avg m, exp_avg_sq v: f32, the same numel; w, m, v updated in place.
void adamw_update(const AdamWScalars& c, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v,
                  const Tensor& compute = Tensor());

struct SgdScalars {
  float rate, momentum, weight_decay, grad_scale;
  bool first;  // the first step: the momentum buffer takes the gradient as it is
};
// Masters w, gradients g and the momentum buffer b (undefined without momentum):
// f32, the same numel; w and b updated in place.
void sgd_update(const SgdScalars& c, const Tensor& w, const Tensor& g, const Tensor& b,
                const Tensor& compute = Tensor());

}  // namespace tp::ops
