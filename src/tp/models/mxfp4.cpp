#include "tp/models/mxfp4.h"

#include <cmath>
#include <cstring>

namespace tp {

namespace {

constexpr float kE2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};

std::string blocks_key(const std::string& param) { return param + "_blocks"; }
std::string scales_key(const std::string& param) { return param + "_scales"; }

void check_pair(const Checkpoint& ckpt, const std::string& param, const Shape& shape) {
  const io::TensorInfo& b = ckpt.info(blocks_key(param));
  TP_CHECK(ckpt.has(scales_key(param)), "{}: tensor '{}' has no '{}' next to it (MXFP4 needs both)",
           b.file.string(), blocks_key(param), scales_key(param));
  const io::TensorInfo& s = ckpt.info(scales_key(param));
  TP_CHECK(b.dtype == DType::U8 && b.shape == mxfp4_blocks_shape(param, shape),
           "{}: MXFP4 tensor '{}' is {} {}, but '{}' {} implies U8 {}", b.file.string(), b.name,
           io::safetensors_dtype_name(b.dtype), shape_str(b.shape), param, shape_str(shape),
           shape_str(mxfp4_blocks_shape(param, shape)));
  TP_CHECK(s.dtype == DType::U8 && s.shape == mxfp4_scales_shape(param, shape),
           "{}: MXFP4 tensor '{}' is {} {}, but '{}' {} implies U8 {}", s.file.string(), s.name,
           io::safetensors_dtype_name(s.dtype), shape_str(s.shape), param, shape_str(shape),
           shape_str(mxfp4_scales_shape(param, shape)));
}

}  // namespace

Tensor dequantise_mxfp4(const Tensor& blocks, const Tensor& scales, int64_t lo, int64_t n) {
  TP_CHECK(blocks.dim() == 4 && blocks.dtype() == DType::U8 && blocks.size(3) == kMxfp4Block / 2 &&
               scales.dtype() == DType::U8 && scales.shape() == (Shape{blocks.size(0), blocks.size(1), blocks.size(2)}),
           "dequantise_mxfp4: blocks must be u8 [E, out, G, 16] and scales u8 [E, out, G], got {} {} and {} {}",
           dtype_name(blocks.dtype()), shape_str(blocks.shape()), dtype_name(scales.dtype()), shape_str(scales.shape()));
  const int64_t E = blocks.size(0), O = blocks.size(1), G = blocks.size(2);
  TP_CHECK(lo >= 0 && n >= 0 && lo + n <= G * kMxfp4Block, "dequantise_mxfp4: rows [{}, {}) outside the {} held", lo,
           lo + n, G * kMxfp4Block);
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  Tensor out = Tensor::empty({E, n, O});
  float* o = out.data<float>();
#pragma omp parallel for collapse(2) if (E * O * G > 65536)
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
  return out;
}

bool reads_mxfp4(const Checkpoint& ckpt, const std::string& param) {
  return !ckpt.has(param) && ckpt.has(blocks_key(param));
}

Tensor read_mxfp4(const Checkpoint& ckpt, const std::string& param, const Shape& shape,
                  const nn::ParamShard& shard, DType as) {
  check_pair(ckpt, param, shape);
  const std::string bk = blocks_key(param), sk = scales_key(param);
  const int64_t d = shard.replicated() ? -1 : shard.dim;
  std::vector<Tensor> pieces;  // along the parameter's sharded dim
  if (d == 1) {
    // Rows of `in`: the whole blocks that cover each span, then the span's rows of them.
    for (const ChunkSpan& span : shard.spans) {
      const int64_t g0 = span.offset / kMxfp4Block, g1 = (span.offset + span.size + kMxfp4Block - 1) / kMxfp4Block;
      pieces.push_back(dequantise_mxfp4(ckpt.read_slice(bk, 2, {{g0, g1 - g0}}), ckpt.read_slice(sk, 2, {{g0, g1 - g0}}),
                                  span.offset - g0 * kMxfp4Block, span.size));
    }
  } else {
    // Whole experts (dim 0) or out columns (dim 2: the blocks' rows), or everything.
    const int64_t stored = d == 0 ? 0 : 1;
    Tensor b = d < 0 ? ckpt.read(bk) : ckpt.read_slice(bk, stored, shard.spans);
    Tensor s = d < 0 ? ckpt.read(sk) : ckpt.read_slice(sk, stored, shard.spans);
    pieces.push_back(dequantise_mxfp4(b, s, 0, shape[1]));
  }
  Tensor out = pieces.size() == 1 ? pieces[0] : Tensor();
  if (pieces.size() > 1) {  // several spans of `in`: concatenated along dim 1, expert by expert
    int64_t n = 0;
    for (const Tensor& p : pieces) n += p.size(1);
    const int64_t E = shape[0], O = shape[2];
    out = Tensor::empty({E, n, O});
    float* dst = out.data<float>();
    for (int64_t e = 0; e < E; ++e)
      for (const Tensor& p : pieces) {
        const size_t bytes = static_cast<size_t>(p.size(1) * O) * sizeof(float);
        std::memcpy(dst, p.data<float>() + e * p.size(1) * O, bytes);
        dst += p.size(1) * O;
      }
  }
  return as == DType::F32 ? out : out.to(as);
}

bool mxfp4_packs(const nn::ParamShard& shard) {
  if (shard.replicated() || shard.dim != 1) return true;
  return shard.spans.size() == 1 && shard.spans[0].offset % kMxfp4Block == 0 && shard.spans[0].size % kMxfp4Block == 0;
}

int64_t mxfp4_packed_bytes(const Shape& local) {
  return local[0] * static_cast<int64_t>(ops::QuantizedLinear::e2m1_resident_bytes(local[2], local[1]));
}

std::vector<ops::QuantizedLinear> read_mxfp4_packed(const Checkpoint& ckpt, const std::string& param,
                                                    const Shape& shape, const nn::ParamShard& shard) {
  check_pair(ckpt, param, shape);
  const std::string bk = blocks_key(param), sk = scales_key(param);
  const int64_t d = shard.replicated() ? -1 : shard.dim;
  Tensor b, s;
  if (!mxfp4_packs(shard)) return {};
  if (d == 1) {  // rows of `in`: whole blocks of one span
    const ChunkSpan blocks{shard.spans[0].offset / kMxfp4Block, shard.spans[0].size / kMxfp4Block};
    b = ckpt.read_slice(bk, 2, {blocks});
    s = ckpt.read_slice(sk, 2, {blocks});
  } else {  // whole experts (dim 0) or out columns (dim 2: the blocks' rows), or everything
    const int64_t stored = d == 0 ? 0 : 1;
    b = d < 0 ? ckpt.read(bk) : ckpt.read_slice(bk, stored, shard.spans);
    s = d < 0 ? ckpt.read(sk) : ckpt.read_slice(sk, stored, shard.spans);
  }
  const int64_t E = b.size(0), O = b.size(1), G = b.size(2), in = G * kMxfp4Block;
  std::vector<ops::QuantizedLinear> experts;
  experts.reserve(static_cast<size_t>(E));
  Tensor codes = Tensor::empty({O, in}, DType::U8);
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* src = b.data<uint8_t>() + e * O * G * 16;
    uint8_t* dst = codes.data<uint8_t>();
    for (int64_t i = 0; i < O * G * 16; ++i) {  // byte i holds elements 2i (low nibble) and 2i + 1
      dst[2 * i] = src[i] & 0x0F;
      dst[2 * i + 1] = src[i] >> 4;
    }
    experts.push_back(ops::QuantizedLinear::e2m1(codes, s.narrow(0, e, 1).reshape({O, G})));
  }
  return experts;
}

Mxfp4Tensors quantise_mxfp4(const Tensor& w) {
  TP_CHECK(w.dtype() == DType::F32, "quantise_mxfp4: f32 weights expected, got {}", dtype_name(w.dtype()));
  const Shape bs = mxfp4_blocks_shape("quantise_mxfp4", w.shape());
  const int64_t E = w.size(0), I = w.size(1), O = w.size(2), G = bs[2];
  Mxfp4Tensors q{Tensor::zeros(bs, DType::U8), Tensor::empty(mxfp4_scales_shape("quantise_mxfp4", w.shape()), DType::U8)};
  const float* src = w.data<float>();
  uint8_t* b = q.blocks.data<uint8_t>();
  uint8_t* s = q.scales.data<uint8_t>();
#pragma omp parallel for collapse(2) if (E * O * G > 65536)
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
  return q;
}

}  // namespace tp
