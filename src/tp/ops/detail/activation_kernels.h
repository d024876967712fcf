#pragma once
// The kernels behind ops/activation.h, one set per device (ops/dispatch.h).
// Tensors are f32 and contiguous; outputs are allocated by the op.
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct ActivationKernels {
  // out = silu(x); dx = g * silu'(x).
  void (*silu)(const Tensor& x, const Tensor& out);
  void (*silu_backward)(const Tensor& x, const Tensor& g, const Tensor& dx);
  // out = gelu(x), erf or tanh form; dx = g * gelu'(x).
  void (*gelu)(const Tensor& x, bool tanh_approximation, const Tensor& out);
  void (*gelu_backward)(const Tensor& x, const Tensor& g, bool tanh_approximation, const Tensor& dx);
  // out = silu(a) * b; da / db are written where defined.
  void (*swiglu)(const Tensor& a, const Tensor& b, const Tensor& out);
  void (*swiglu_backward)(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& da, const Tensor& db);
  // out = cap * tanh(x / cap); dx from the output y: g * (1 - (y / cap)^2).
  void (*softcap)(const Tensor& x, float cap, const Tensor& out);
  void (*softcap_backward)(const Tensor& y, const Tensor& g, float cap, const Tensor& dx);
  // out = softmax of x along dimension `dim` (normalized); dx from the output y.
  void (*softmax)(const Tensor& x, int64_t dim, const Tensor& out);
  void (*softmax_backward)(const Tensor& y, const Tensor& g, int64_t dim, const Tensor& dx);
};

KernelTable<ActivationKernels>& activation_kernels();

}  // namespace tp::ops
