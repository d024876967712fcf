#pragma once
// Bulk conversions between f32 and bf16/f16: AVX-512 (BF16) when the CPU has
// it, AVX2 otherwise. Results are identical on both paths (round to nearest even).
#include <cstddef>

#include "tp/tensor/dtype.h"

namespace tp {

void convert_f32_to_bf16(const float* src, bf16* dst, size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, f16* dst, size_t n);
void convert_f16_to_f32(const f16* src, float* dst, size_t n);
// dst[i] = src[i] rounded to the nearest bf16 value (ties to even), kept as f32:
// bf16 arithmetic's operands for kernels that run in f32 (dst may equal src).
void round_f32_to_bf16(const float* src, float* dst, size_t n);
// Any dtype to any dtype (integers convert by value).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

bool cpu_has_avx512_bf16();

}  // namespace tp
