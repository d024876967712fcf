#pragma once
// MXFP4 expert weights (GPT-OSS checkpoints; Transformers' integrations/mxfp4.py):
// a parameter W [E, in, out] is stored as
//   W_blocks [E, out, in / 32, 16] u8   two FP4 E2M1 values a byte: low nibble the
//                                       even element, high nibble the odd one
//   W_scales [E, out, in / 32]     u8   E8M0: each block of 32 values times 2^(s - 127)
// i.e. out x in with blocks along `in`, transposed back at load. E2M1 nibble:
// bit 3 the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// Loading dequantises only this rank's slice: whole experts (dim 0), out columns
// (the blocks' rows), or the blocks covering its `in` rows.
#include <string>
#include <vector>

#include "tp/models/checkpoint.h"
#include "tp/ops/mxfp4.h"
#include "tp/ops/quantized_linear.h"
#include "tp/nn/parallel_layer.h"

namespace tp {

using ops::kMxfp4Block;
using ops::dequantise_mxfp4;  // the element work (tp/ops/mxfp4.h)
using ops::Mxfp4Tensors;
using ops::quantise_mxfp4;

// W_blocks' and W_scales' shapes for a parameter of shape [E, in, out]; an error
// names `name` unless in is a multiple of 32.
Shape mxfp4_blocks_shape(const std::string& name, const Shape& param);
Shape mxfp4_scales_shape(const std::string& name, const Shape& param);

// `param` is not in `ckpt` under its own name but as param_blocks + param_scales.
bool reads_mxfp4(const Checkpoint& ckpt, const std::string& param);

// This rank's slice (`shard` of `global_shape` [E, in, out]) of `param`, dequantised
// to `as`. Errors name the tensor and the shapes expected.
Tensor read_mxfp4(const Checkpoint& ckpt, const std::string& param, const Shape& global_shape,
                  const nn::ParamShard& shard, DType as);

// Whether a slice of an MXFP4 parameter is kept packed at inference: whole experts, out columns, or one span of
// `in` rows in whole blocks of 32.
bool mxfp4_packs(const nn::ParamShard& shard);
// The bytes a packed slice `local` [E, in, out] holds (ops::QuantizedLinear::e2m1 a local expert).
int64_t mxfp4_packed_bytes(const Shape& local);

// This rank's slice of `param` kept packed (inference): one ops::QuantizedLinear::e2m1 a local expert, in
// Linear's layout [out slice, in slice]. Empty when the slice cuts a block of 32 inputs (a shard of `in` that is
// not whole blocks, or in several spans): the caller then reads it dequantised (read_mxfp4).
std::vector<ops::QuantizedLinear> read_mxfp4_packed(const Checkpoint& ckpt, const std::string& param,
                                                    const Shape& global_shape, const nn::ParamShard& shard);

}  // namespace tp
