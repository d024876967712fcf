#pragma once
// config.json's `quantization_config`: which Hugging Face quantized-checkpoint format the weights are in
// (GPTQ, AWQ GEMM, compressed-tensors pack-quantized; GPT-OSS's MXFP4 experts), parsed into one
// format-neutral description. What the tensors of each format look like is in quantized_shapes.h; reading
// them in quantized_checkpoint.h. Anything tp cannot read exactly (other bit widths, FP8, activation
// quantization, kernels' private layouts) is an error naming the key and its value, never a guess.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tp {

struct QuantizationConfig {
  std::string method;             // "gptq", "awq", "compressed-tensors", "mxfp4"
  int bits = 4;                   // 4 or 8
  int64_t group_size = 128;       // -1: one group spanning all of in_features
  bool sym = true;                // symmetric (fixed zero point 2^(bits-1))
  bool desc_act = false;          // GPTQ act-order (g_idx a permutation of groups)
  std::string checkpoint_format;  // GPTQ: "gptq" (v1: stored zero - 1) or "gptq_v2"
  std::vector<std::string> not_converted;  // modules_to_not_convert / compressed-tensors `ignore` (names or patterns)
  // GPTQ's `lm_head` (GPTQModel): lm_head is quantized too. AWQ never quantizes it (AutoAWQ quantizes decoder
  // layers only); compressed-tensors does unless `ignore` names it.
  bool lm_head = false;

  // Whether the Linear `linear_module_name` ("model.layers.0.self_attn.q_proj") is quantized: not named by
  // not_converted, matched the way the format's own loader matches it (GPTQ, MXFP4: Transformers' rule, a
  // regex matching from the start up to a '.' or the end, or a suffix; AWQ: a substring, as AutoAWQ and
  // Transformers' AWQ integration test it; compressed-tensors: the exact name, or "re:" + a regex matching from
  // the start). lm_head: as `lm_head` says (GPTQ, AWQ) or as any Linear (compressed-tensors).
  bool quantizes(const std::string& linear_module_name) const;
  // Linear weights stored packed in int32 words (GPTQ, AWQ, compressed-tensors; not MXFP4's experts).
  bool packs_linears() const { return method == "gptq" || method == "awq" || method == "compressed-tensors"; }
  int pack_factor() const { return 32 / bits; }
  // GPTQ format v1 (zero points stored minus one).
  bool zeros_minus_one() const { return method == "gptq" && checkpoint_format == "gptq"; }
};

// `config`'s quantization_config (nothing when absent or null), validated; errors name `source`, the key
// and the value, and say what is accepted.
std::optional<QuantizationConfig> parse_quantization_config(const nlohmann::json& config, const std::string& source);

}  // namespace tp
