#pragma once
// Shard-on-read of quantized Linears (GPTQ, AWQ GEMM, compressed-tensors pack-quantized; layouts in
// quantized_shapes.h): each rank reads only the bytes of its slice of every packed tensor and unpacks them into
// one format-neutral form, from which the kernels build their packed runtime form. The tensor-parallel rules
// are vLLM's: a row split (K) must hold whole groups and whole packed words along K, a column split (N) whole
// packed words along N; act-order GPTQ keeps scales and zeros whole under a row split (g_idx can point at any
// group). Everything read is checked: shapes, dtypes, g_idx's range, finite scales, zero points that agree
// with `sym`.
#include <string>
#include <vector>

#include "tp/models/checkpoint.h"
#include "tp/nn/module.h"
#include "tp/nn/parallel_layer.h"

namespace tp {

// One quantized linear's slice for this rank, unpacked: W[n, k] = scales[n, grp(k)] * (codes[n, k] - zeros[n, grp(k)]),
// grp(k) = g_idx.defined() ? g_idx[k] : k / group_size (k local to the slice; group_size already covers the slice: for
// group_size -1 it is the slice's k).
struct QuantizedSlice {
  int bits = 4;
  int64_t group_size = 0;
  Tensor codes;   // u8 [n, k]: one unpacked code per element, 0 .. 2^bits - 1
  Tensor scales;  // f32 [n, groups]   (fp16/bf16 checkpoint scales widened exactly)
  Tensor zeros;   // u8 [n, groups]    the integer zero point z in w = s (q - z) (GPTQ v1's stored z-1 already corrected; sym: 2^(bits-1))
  Tensor g_idx;   // i32 [k] or undefined (see above); values index scales' columns
};

// `param` is "<module>.weight" of a Linear whose checkpoint holds the quantized tensors instead
// (GPTQ/AWQ: <module>.qweight/qzeros/scales[/g_idx]; compressed-tensors: <module>.weight_packed/weight_scale[/weight_zero_point/weight_shape]).
bool reads_quantized(const Checkpoint& ckpt, const std::string& param);

// This rank's slice (`shard` of the global [N, K] weight: dim 0 = colwise/out split, dim 1 = rowwise/in split, one or
// several spans, or replicated) read with sliced reads of only the needed bytes of each packed tensor.
QuantizedSlice read_quantized(const Checkpoint& ckpt, const std::string& param, const Shape& global_shape,
                              const nn::ParamShard& shard);

// Before any weight is read: every quantized parameter's shard must hold whole groups (row split: each span's offset and
// size a multiple of group_size, else — act-order GPTQ — keep scales/zeros whole and g_idx global) and whole packed words
// (column split: multiples of the pack factor 32/bits where N is packed). The error names the layer, its size, the group
// size (or pack factor) and the tp size (global / local size), in the spirit of vLLM's "The input size is not aligned
// with the quantized weight shape" message.
void check_quantized_shards(const Checkpoint& ckpt, const std::vector<nn::Parameter*>& params);

// The same rule for one parameter under `q` (what check_quantized_shards applies to each).
void check_quantized_shard(const QuantizationConfig& q, const std::string& param, const Shape& global_shape,
                           const nn::ParamShard& shard);

// The bytes ops::QuantizedLinear holds for this rank's slice `local` [n, k] of a quantized weight `global` [N, K]
// (the rules above: a row split keeps whole groups, act-order keeps every group's scales), before anything is read.
int64_t quantized_slice_bytes(const QuantizationConfig& q, const Shape& global, const Shape& local);

// The slice's weights, f32 [n, k], by the formula above (one f32 multiply per element: tests compare bitwise).
Tensor dequantize(const QuantizedSlice& slice);

}  // namespace tp
