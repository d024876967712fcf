#pragma once
// f32 values rounded to bf16 (to nearest, ties to even) into a bf16 tensor, or
// into an f32 tensor as the f32 values of those bf16 numbers: the compute copies
// of bf16 training, whose bf16 arithmetic runs either on bf16 operands or as f32
// GEMMs of bf16 values (ops/gemm.h's bf16_gemm_native).
#include "tp/tensor/tensor.h"

namespace tp::ops {

// dst (bf16 or f32, src's numel) = src (f32) rounded to bf16; in blocks of 64 Ki
// elements over threads when larger (elementwise: the same bits either way).
void round_to_bf16(const Tensor& src, const Tensor& dst);

}  // namespace tp::ops
