#pragma once
// The tensors a quantized Linear `L` (weight [N, K] = [out, in]) is stored as, per format (K, N, g the group
// size, G = ceil(K / g) or 1 for g = -1, pf = 32 / bits values per int32 word):
//   GPTQ:               L.qweight I32 [K/pf, N]  (packed along K: value j of a word at bits j*bits)
//                       L.qzeros  I32 [G, N/pf]  (packed along N), L.scales float [G, N], L.g_idx I32 [K]
//   AWQ GEMM:           L.qweight I32 [K, N/8]   (packed along N in AutoAWQ's order 0 2 4 6 1 3 5 7)
//                       L.qzeros  I32 [G, N/8], L.scales float [G, N]
//   compressed-tensors: L.weight_packed I32 [N, ceil(K/pf)] (packed along K, stored unsigned: q + 2^(bits-1))
//                       L.weight_scale float [N, G], L.weight_zero_point I32 [ceil(N/pf), G] (asymmetric only),
//                       L.weight_shape I64 [2] = {N, K}
// Kept apart from the reader so that config checks and the fuzz target use them without tensors.
#include <functional>
#include <string>
#include <vector>

#include "tp/io/safetensors_header.h"
#include "tp/models/quantization_config.h"

namespace tp {

struct PackedTensorSpec {
  std::string name;
  Shape shape;
  std::vector<DType> dtypes;  // any of these
  bool required = true;
};

// The tensors of `module` (a Linear of global weight shape [N, K]) under `q`; an error names the module when
// its sizes cannot be stored in the format (K or N not a multiple of the pack factor where it is packed).
std::vector<PackedTensorSpec> packed_tensor_specs(const QuantizationConfig& q, const std::string& module,
                                                  const Shape& weight_shape);

// The first tensor that says `module` is stored quantized ("L.qweight" or "L.weight_packed"), if present.
std::string packed_weight_name(const QuantizationConfig& q, const std::string& module);

// Every spec against the checkpoint's tensors (`find` returns null for an absent name): a missing required
// tensor, or one of another shape or dtype, is an error naming the file, the tensor, what it is and what
// `config_file` implies.
using TensorFinder = std::function<const io::TensorInfo*(const std::string&)>;
void check_packed_tensors(const QuantizationConfig& q, const std::string& module, const Shape& weight_shape,
                          const TensorFinder& find, const std::string& config_file, const std::string& dir);

}  // namespace tp
