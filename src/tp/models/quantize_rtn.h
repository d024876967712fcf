#pragma once
// Round-to-nearest quantization of Linear weights into the Hugging Face checkpoint formats tp reads
// (quantized_shapes.h has the layouts; `tp quantize` writes whole checkpoints with it). Per group of `group_size`
// input features of each output row: asymmetric takes the group's range [min(w, 0), max(w, 0)] onto codes
// 0 .. 2^bits - 1 (GPTQ's convention: zero is exact), symmetric its absmax onto -(2^(bits-1) - 1) ..
// 2^(bits-1) - 1 around the zero point 2^(bits-1). A scale is rounded up to its stored dtype, so that no code
// leaves its range and every weight is within half a (stored) scale of its dequantized value.
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp {

struct QuantizeOptions {
  std::string format = "gptq";  // "gptq", "awq", "compressed-tensors"
  int bits = 4;
  int64_t group_size = 128;  // -1: one group per output row (compressed-tensors: strategy "channel")
  bool sym = false;
  bool desc_act = false;                 // GPTQ act-order: groups over a seeded permutation of the input features
  std::string checkpoint_format = "gptq";  // GPTQ: "gptq" (v1) or "gptq_v2"
  uint64_t seed = 0;                     // act-order's permutation
  bool lm_head = false;  // lm_head too (GPTQ's lm_head: true; compressed-tensors: not in ignore; not AWQ)
};

// The option combinations the formats can hold; an error names the flag otherwise.
void check_quantize_options(const QuantizeOptions& o);

// config.json's quantization_config as each format's own tooling writes it (GPTQModel, AutoAWQ,
// llm-compressor), with `not_converted` as modules_to_not_convert / ignore.
nlohmann::json quantization_config_json(const QuantizeOptions& o, const std::vector<std::string>& not_converted);

// The parameters `tp quantize` converts: 2-D weights of a decoder layer's attention projections (q/k/v/o, Phi-3's
// fused qkv, MLA's q_a/q_b/kv_a/kv_b), dense MLP, shared and per-expert MoE projections under the Hub's names
// (routers, norms, embeddings, lm_head and GPT-OSS's fused 3-D experts stay as they are).
bool quantizable_linear(const std::string& param);

// The checkpoint tensors of `module` ("model.layers.0.mlp.up_proj") for its f32 weight `w` [N, K], in the
// format's names, dtypes and layout; `scale_dtype` is compressed-tensors' (the model's dtype; GPTQ and AWQ store
// fp16). Errors name the module when its sizes do not fit the format (K not a multiple of the group size, N or
// K not of the pack factor where packed) or a scale overflows its dtype.
std::vector<std::pair<std::string, Tensor>> quantize_linear(const QuantizeOptions& o, const std::string& module,
                                                            const Tensor& w, DType scale_dtype);

}  // namespace tp
