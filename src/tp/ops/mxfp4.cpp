#include "tp/ops/mxfp4.h"

#include <algorithm>
#include <cmath>

#include "tp/core/parallel_for.h"
#include "tp/ops/detail/mxfp4_kernels.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

constexpr float kE2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};

void dequantise_cpu(const Tensor& blocks, const Tensor& scales, int64_t lo, const Tensor& out) {
  const int64_t E = blocks.size(0), O = blocks.size(1), G = blocks.size(2), n = out.size(1);
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  float* o = out.data<float>();
  parallel_region(E * O * G > 65536, [&] {
#pragma omp for collapse(2)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < O; ++r) {
        const int64_t row = e * O + r;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = lo + i, g = k / kMxfp4Block, j = k % kMxfp4Block;
          const uint8_t byte = b[(row * G + g) * 16 + j / 2];
          const uint8_t nib = j % 2 == 0 ? byte & 0x0F : byte >> 4;
          const float v = kE2M1[nib & 7] * std::ldexp(1.f, static_cast<int>(s[row * G + g]) - 127);
          o[(e * n + i) * O + r] = nib & 8 ? -v : v;
        }
      }
  });
}

void codes_cpu(const Tensor& packed, const Tensor& codes) {
  const int64_t bytes = packed.numel();  // tensors are contiguous (tensor.h)
  const uint8_t* src = packed.data<uint8_t>();
  uint8_t* dst = codes.data<uint8_t>();
  for (int64_t i = 0; i < bytes; ++i) {  // byte i holds elements 2i (low nibble) and 2i + 1
    dst[2 * i] = src[i] & 0x0F;
    dst[2 * i + 1] = src[i] >> 4;
  }
}

void quantise_cpu(const Tensor& w, const Tensor& blocks, const Tensor& scales) {
  const int64_t E = w.size(0), I = w.size(1), O = w.size(2), G = I / kMxfp4Block;
  const float* src = w.data<float>();
  uint8_t* b = blocks.data<uint8_t>();
  uint8_t* s = scales.data<uint8_t>();
  parallel_region(E * O * G > 65536, [&] {
#pragma omp for collapse(2)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < O; ++r)
        for (int64_t g = 0; g < G; ++g) {
          auto at = [&](int64_t j) { return src[(e * I + g * kMxfp4Block + j) * O + r]; };
          float mx = 0.f;
          for (int64_t j = 0; j < kMxfp4Block; ++j) mx = std::max(mx, std::fabs(at(j)));
          // The smallest power of two 2^x with mx / 2^x <= 6 (E2M1's largest value).
          int x = mx > 0.f ? static_cast<int>(std::ceil(std::log2(mx / 6.f))) : -127;
          x = std::clamp(x, -127, 127);
          const int64_t row = e * O + r;
          s[row * G + g] = static_cast<uint8_t>(x + 127);
          const float inv = std::ldexp(1.f, -x);
          for (int64_t j = 0; j < kMxfp4Block; ++j) {
            const float v = at(j) * inv, a = std::fabs(v);
            int best = 0;
            for (int k = 1; k < 8; ++k)
              if (std::fabs(kE2M1[k] - a) < std::fabs(kE2M1[best] - a)) best = k;
            const uint8_t nib = static_cast<uint8_t>(best | (v < 0.f && best != 0 ? 8 : 0));
            b[(row * G + g) * 16 + j / 2] |= j % 2 == 0 ? nib : static_cast<uint8_t>(nib << 4);
          }
        }
  });
}

constexpr Mxfp4Kernels kCpuMxfp4Kernels{dequantise_cpu, codes_cpu, quantise_cpu};

}  // namespace

KernelTable<Mxfp4Kernels>& mxfp4_kernels() {
  static KernelTable<Mxfp4Kernels> table("mxfp4", &kCpuMxfp4Kernels);
  return table;
}

Tensor dequantise_mxfp4(const Tensor& blocks, const Tensor& scales, int64_t lo, int64_t n) {
  TP_CHECK(blocks.dim() == 4 && blocks.dtype() == DType::U8 && blocks.size(3) == kMxfp4Block / 2 &&
               scales.dtype() == DType::U8 && scales.shape() == (Shape{blocks.size(0), blocks.size(1), blocks.size(2)}),
           "dequantise_mxfp4: blocks must be u8 [E, out, G, 16] and scales u8 [E, out, G], got {} {} and {} {}",
           dtype_name(blocks.dtype()), shape_str(blocks.shape()), dtype_name(scales.dtype()), shape_str(scales.shape()));
  const int64_t E = blocks.size(0), O = blocks.size(1), G = blocks.size(2);
  TP_CHECK(lo >= 0 && n >= 0 && lo + n <= G * kMxfp4Block, "dequantise_mxfp4: rows [{}, {}) outside the {} held", lo,
           lo + n, G * kMxfp4Block);
  Tensor out = Tensor::empty({E, n, O});
  mxfp4_kernels().on(blocks, scales).dequantise(blocks, scales, lo, out);
  return out;
}

Tensor mxfp4_codes(const Tensor& blocks) {
  TP_CHECK(blocks.dim() == 3 && blocks.dtype() == DType::U8 && blocks.size(2) == kMxfp4Block / 2,
           "mxfp4_codes: one expert's blocks must be u8 [out, G, 16], got {} {}", dtype_name(blocks.dtype()),
           shape_str(blocks.shape()));
  Tensor codes = Tensor::empty({blocks.size(0), blocks.size(1) * kMxfp4Block}, DType::U8);
  mxfp4_kernels().on(blocks).codes(blocks, codes);
  return codes;
}

Mxfp4Tensors quantise_mxfp4(const Tensor& w) {
  TP_CHECK(w.dtype() == DType::F32 && w.dim() == 3 && w.size(1) % kMxfp4Block == 0,
           "quantise_mxfp4: f32 weights [E, in, out] with in a multiple of 32 expected, got {} {}",
           dtype_name(w.dtype()), shape_str(w.shape()));
  const int64_t E = w.size(0), O = w.size(2), G = w.size(1) / kMxfp4Block;
  Mxfp4Tensors q{Tensor::zeros({E, O, G, kMxfp4Block / 2}, DType::U8), Tensor::empty({E, O, G}, DType::U8)};
  mxfp4_kernels().on(w).quantise(w, q.blocks, q.scales);
  return q;
}

}  // namespace tp::ops
