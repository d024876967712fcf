#pragma once
// Plain GEMM through oneDNN, for the ops that are not the packed inference path
// (linear with an unpacked weight, matmul, the backward passes). CPU kernels'
// machinery on host pointers: an op reaches it through its family's kernel table
// (ops/dispatch.h), never directly.
//
//   C [M, N] = op(A) [M, K] · op(B) [K, N] (+ bias [N])
//   trans_a: A is stored [K, M];  trans_b: B is stored [N, K] (HF weight layout).
//
// A and B are f32 or bf16 (both the same: oneDNN wants matching source and weight
// types, so an f32 A with a bf16 B is converted to bf16 first); C is f32;
// accumulation is f32. Primitives are cached by (shape, layout, dtype), so a repeated
// call creates nothing.
#include <cstdint>

#include "tp/tensor/dtype.h"

namespace tp::ops::detail {

struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  DType a_dtype = DType::F32, b_dtype = DType::F32;
  // Row strides in elements of A, B and C as stored; 0 means dense (the stored row length).
  int64_t lda = 0, ldb = 0, ldc = 0;
  // C += op(A)·op(B) instead of C = ... (gradients accumulating into their buffer).
  bool accumulate = false;
};

void gemm(const GemmSpec& spec, const void* a, const void* b, const float* bias, float* c);

// How bf16 arithmetic (bf16 operands, f32 accumulation) runs fastest on this
// machine: native bf16 GEMMs, or f32 GEMMs on operands rounded to bf16 values,
// which give the same products (a product of two bf16 values is exact in f32).
// On a Xeon without AMX, oneDNN's bf16 GEMM (AVX512-BF16) ran at 84 GFLOP/s per
// core and its f32 GEMM at 152: there the rounded-f32 form wins. Measured once
// per process (a few milliseconds) unless TP_BF16_GEMM=native|f32 says. It is a
// fact about the machine, not a mode: each weight decides from it (a trainer's
// bf16 compute copies, from rank 0's answer so that ranks agree; a PackedLinear
// when packed, for its paired-f32 form, which gives native bf16's bits exactly:
// bf16_pairs.h).
// TP_BF16_GEMM=widen: every bf16 product as an f32 GEMM of the widened operands,
// what a CPU whose oneDNN has no bf16 matmul gets (this build's needs AVX-512).
bool bf16_gemm_native();
// TP_BF16_GEMM=native: oneDNN's bf16 kernels everywhere (no paired or one-row forms).
bool bf16_gemm_forced_native();
// Whether oneDNN has a bf16 matmul for this CPU (probed once; false under
// TP_BF16_GEMM=widen). Without one, gemm() widens bf16 operands to f32 and a
// bf16 PackedLinear packs its weight widened (twice the bytes it reads).
bool bf16_matmul_available();

// The row stride (in elements) at which an operand with rows of `cols` values of `esize` bytes multiplies fastest
// here: cols, or cols + 64 bytes where a row's bytes are a multiple of 2 KiB but no power of two (such rows
// conflict in the caches' sets: oneDNN's brgemm ran at under half speed over them). gemm() copies a large
// row-major B into such rows; code that writes an operand itself can lay it out so.
int64_t unconflicted_row_stride(int64_t cols, size_t esize);

// Primitives created so far (a repeated call must not add one).
size_t gemm_primitives_created();

// f32 -> bf16 split over OpenMP threads when large (activations before a bf16 GEMM).
void to_bf16_parallel(const float* src, bf16* dst, size_t n);
// f32 -> f32 holding the nearest bf16 values, split over OpenMP threads when large
// (the rounded-f32 form of bf16 arithmetic).
void round_to_bf16_parallel(const float* src, float* dst, size_t n);
// bf16 values widened to f32 (exact), over OpenMP threads for large n.
void to_f32_parallel(const bf16* src, float* dst, size_t n);

// An operand of `rows` stored rows of `cols` values (`ld` apart; 0: dense) as
// bf16 values in f32, with the same layout, in this thread's scratch buffer
// `slot` (0 or 1): a bf16 one widened (exact), an f32 one rounded to bf16.
const float* bf16_valued_f32(const void* src, DType dtype, int64_t rows, int64_t cols, int64_t ld, int slot);

// A per-thread scratch buffer for converting activations to bf16 (grows, never shrinks).
bf16* bf16_scratch(size_t n);

}  // namespace tp::ops::detail
