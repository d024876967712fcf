#pragma once
// MXFP4 (OCP microscaling FP4, GPT-OSS's expert weights) element work: blocks of
// 32 FP4 E2M1 values sharing one E8M0 scale 2^(s - 127); a byte holds two
// values, the low nibble the even element. E2M1 nibble: bit 3 the sign, bits
// 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}. The checkpoint's naming and slicing
// are tp/models/mxfp4.h's.
#include <cstdint>

#include "tp/tensor/tensor.h"

namespace tp::ops {

inline constexpr int64_t kMxfp4Block = 32;

// blocks [E, O, G, 16] and scales [E, O, G] (u8) -> f32 [E, n, O]: the input rows
// [lo, lo + n) of the G * 32 the blocks hold, transposed to W [E, in, out]'s layout.
Tensor dequantise_mxfp4(const Tensor& blocks, const Tensor& scales, int64_t lo, int64_t n);

// One expert's blocks [O, G, 16] u8 -> its 4-bit codes [O, G * 32] u8, one a byte
// (what QuantizedLinear::e2m1 takes).
Tensor mxfp4_codes(const Tensor& blocks);

// W [E, in, out] f32 (in a multiple of 32) -> blocks and scales: per block the
// smallest scale that fits its largest |value| into 6, each value rounded to the
// nearest E2M1 value (ties: the lower magnitude).
struct Mxfp4Tensors {
  Tensor blocks, scales;
};
Mxfp4Tensors quantise_mxfp4(const Tensor& w);

}  // namespace tp::ops
