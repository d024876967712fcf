#pragma once
// A GEMM whose every output has the same bits whatever the shape around it: a
// CPU kernels' helper (reached through the linear, quantized and experts tables).
//
// Inference promises that a row of a batch gets the bits it gets alone (serving,
// batched generate, MoE experts seeing more or fewer tokens) and that q|k|v fused
// into one GEMM give each part's bits as its own GEMM. That holds only if a
// product's rounding does not depend on M, N or where the output sits. oneDNN's
// AVX-512 matmul (brgemm) keeps it on the shapes we run; its AVX2 matmul (gemm:jit,
// what an AVX2-only CPU gets) does not: its blocking and edge kernels change with
// the shape, and outputs move by an ulp when M or N does.
//
// Here each output is one fixed sequence of operations over K, never blocked:
//   eight partial sums, lane l over k = l, l + 8, ... (a chain of FMAs from zero),
//   added as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)),
//   then the last K % 8 terms by FMA in order, then the bias.
// Tiles of rows × columns only choose which outputs are computed together, and a
// bf16 W read by several groups of rows is widened to f32 a column block at a
// time first (exact: the same values, the same sequence).
#include <immintrin.h>

#include <cstdint>

#include "tp/tensor/dtype.h"

namespace tp::ops::detail {

// The eight lanes of a partial sum added in the order above.
inline float ordered_lane_sum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Whether inference products (ops::PackedLinear, the MoE experts' forward) run
// ordered_gemm instead of oneDNN: when oneDNN's f32 matmul here is not its
// brgemm kernel (read once from the primitive's implementation name), or
// TP_GEMM=ordered; TP_GEMM=onednn keeps oneDNN.
bool ordered_gemm_wanted();

// C [m, n] (row stride ldc) = A [m, k] (row stride lda) · W^T (+ bias [n]), W stored
// [n, k] (row stride ldw), the Hugging Face weight layout; A and W each f32 or bf16.
// With a bf16 operand the arithmetic is bf16's, as gemm() does it: A's values are
// rounded to bf16 (a bf16 A is widened, exactly) and the products summed in f32.
// Column blocks are split over OpenMP threads (outside a parallel region).
void ordered_gemm(int64_t m, int64_t n, int64_t k, const void* a, DType a_dtype, int64_t lda, const void* w,
                  DType w_dtype, int64_t ldw, const float* bias, float* c, int64_t ldc);

}  // namespace tp::ops::detail
