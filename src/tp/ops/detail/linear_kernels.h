#pragma once
// The kernels behind ops/linear.h, one set per device (ops/dispatch.h): the
// dense products of linear and matmul, forward and backward, and the product
// through a packed weight (the inference path). An operand [..., K] is read as
// its rows [M, K]; outputs are f32 and preallocated by the op, which also checks
// the shapes and dtypes (ops/linear.h).
#include "tp/ops/dispatch.h"
#include "tp/ops/linear.h"

namespace tp::ops {

struct LinearKernels {
  // y [M, N] = x [M, K] · w [N, K]^T (+ bias [N] f32, or undefined); x f32, w f32
  // or bf16 (bf16 arithmetic: x's values rounded, f32 accumulation). With
  // `batch_invariant`, a row's bits do not depend on the other rows (inference).
  void (*linear)(const Tensor& x, const Tensor& w, const Tensor& bias, bool batch_invariant, const Tensor& y);
  // linear's gradients from dy [M, N] (f32, or bf16 when w is: bf16 arithmetic):
  // dx [M, K] = dy · w where dx is defined; dw [N, K] = dy^T · x (x of dy's dtype,
  // or an f32 x of bf16 values), added into dw with `accumulate`, where dw is defined.
  void (*linear_backward)(const Tensor& dy, const Tensor& w, const Tensor& x, bool accumulate, const Tensor& dx,
                          const Tensor& dw);
  // db [N] (zeroed by the caller) += the column sums of dy [M, N] f32.
  void (*bias_grad)(const Tensor& dy, const Tensor& db);
  // y [..., M, N] = a [..., M, K] · b [K, N]; a f32, b f32 or bf16.
  void (*matmul)(const Tensor& a, const Tensor& b, const Tensor& y);
  // matmul's gradients from g (y's shape): da = g · b^T and db = a^T · g, each where defined.
  void (*matmul_backward)(const Tensor& a, const Tensor& b, const Tensor& g, const Tensor& da, const Tensor& db);
  // out [M, N] = x [M, K] · w^T (+ bias [N] f32) through w's packed state (x f32,
  // or bf16 into a bf16 weight); `path` picks among the CPU's bf16 kernels.
  // Returns the kernel that ran.
  detail::Bf16Kernel (*packed_linear)(const PackedLinear& w, PackedLinear::State& state, const Tensor& x,
                                      const Tensor& bias, detail::Bf16Path path, const Tensor& out);
};

KernelTable<LinearKernels>& linear_kernels();

}  // namespace tp::ops
