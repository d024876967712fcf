#include "tp/models/mxfp4.h"

#include "tp/ops/shape.h"

namespace tp {

namespace {

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
  // Several spans of `in`: concatenated along dim 1.
  const Tensor out = pieces.size() == 1 ? pieces[0] : ops::cat(pieces, 1);
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
  const int64_t E = b.size(0), O = b.size(1), G = b.size(2);
  std::vector<ops::QuantizedLinear> experts;
  experts.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    experts.push_back(ops::QuantizedLinear::e2m1(ops::mxfp4_codes(b.select(0, e)), s.narrow(0, e, 1).reshape({O, G})));
  return experts;
}

}  // namespace tp
