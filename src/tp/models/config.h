#pragma once
// ModelConfig: the parsed config.json of a Hugging Face causal LM. Every key of
// the file is kept in `raw` (unknown ones included) so that writing the config
// back loses nothing; the typed fields are what the engine reads.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tp/models/quantization_config.h"

namespace tp {

// rope_scaling (or rope_parameters in newer files). rope_type is one of
// "default", "linear", "llama3", "yarn", "longrope" ("su" in older Phi-3 files);
// the fields each needs are validated.
struct RopeScalingConfig {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn:
  double beta_fast = 32;
  double beta_slow = 1;
  std::optional<double> attention_factor;
  std::optional<double> mscale, mscale_all_dim;  // DeepSeek's yarn
  std::optional<bool> truncate;                  // yarn: round the correction range (default true)
  // longrope: per-frequency divisors (rotary_dim / 2 each), short_factor up to the
  // original context, long_factor past it; `factor` only when the file gives it.
  std::vector<double> short_factor, long_factor;
  bool factor_given = false;
};

// Head sizes (head_dim, DeepSeek's qk_rope_head_dim ...) above this are refused
// at parse: no model comes near (256 at most today), and a module tree's RoPE
// tables are sized by them before any weight is read.
inline constexpr int64_t kMaxHeadDim = 65536;
// Errors name `source` and `key` when v > kMaxHeadDim.
void check_head_dim(const std::string& source, const char* key, int64_t v);

struct ModelConfig {
  std::string model_type;
  std::vector<std::string> architectures;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // default: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  RopeScalingConfig rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json may hold an int or a list
  // module pattern -> style, in file order; empty if the file has none.
  std::vector<std::pair<std::string, std::string>> base_model_tp_plan;
  // The same for expert parallelism (MoE models), applied when ep_size > 1.
  std::vector<std::pair<std::string, std::string>> base_model_ep_plan;
  // quantization_config (GPTQ, AWQ, compressed-tensors, MXFP4), validated; nothing for unquantized weights.
  std::optional<QuantizationConfig> quantization;
  nlohmann::json raw;  // every key of the file
  std::string source;  // where it was read from (the file, or "preset llama/tiny"), for errors

  // Parses and validates; errors name `source_name` and the key.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source_name);
  // As from_json, but keeps base_model_tp_plan in the order the text lists it.
  static ModelConfig from_json_text(const std::string& text, const std::string& source_name);
  static ModelConfig load(const std::filesystem::path& config_json);
  // `raw` with the typed fields written over it (what save_checkpoint writes).
  nlohmann::json to_json() const;
  // A key only some models read, from `raw`: the fallback when absent or null, an
  // error naming `source` and the key when it has another type.
  bool raw_bool(const char* key, bool fallback) const;
  std::string raw_string(const char* key, const std::string& fallback) const;
};

}  // namespace tp
