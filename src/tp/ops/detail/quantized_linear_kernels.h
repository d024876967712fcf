#pragma once
// The kernels behind ops/quantized_linear.h, one set per device (ops/dispatch.h).
// `w` is the weight's resident state (codes, scales, zeros, the act-order
// permutation); x, dy, out and dx are f32, read as rows [M, K] or [M, N]; the op
// checks the shapes and allocates.
#include "tp/ops/dispatch.h"
#include "tp/ops/quantized_linear.h"

namespace tp::ops {

struct QuantizedLinearKernels {
  // out [M, N] = x [M, K] · W^T (+ bias [N] f32, or undefined): decode's kernels
  // for a few rows, else W dequantized and a GEMM in `compute` (f32 or bf16); with
  // decode_rows (M flags), each row by its kind (ops::linear).
  void (*forward)(const QuantizedLinear::State& w, const Tensor& x, const Tensor& bias, DType compute,
                  std::span<const uint8_t> decode_rows, const Tensor& out);
  // dx [M, K] (zeroed by the caller) = dy [M, N] · W, in the forward's arithmetic.
  void (*input_grad)(const QuantizedLinear::State& w, const Tensor& dy, DType compute, const Tensor& dx);
  // out [N, K] f32 = W, in the checkpoint's input order.
  void (*dequantize)(const QuantizedLinear::State& w, const Tensor& out);
};

KernelTable<QuantizedLinearKernels>& quantized_linear_kernels();

}  // namespace tp::ops
