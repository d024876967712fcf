#pragma once
// LoraConfig: PEFT's LoRA settings with PEFT's names and defaults, read from and
// written as adapter_config.json.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tp::training {

struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0.0;
  // Module names matched as PEFT does: a module whose name is one of them or
  // ends in "." + one of them. Empty: PEFT's default for the architecture
  // (q_proj and v_proj for llama, mistral and qwen3).
  std::vector<std::string> target_modules;
  // PEFT also takes target_modules as one string: a regex the whole module name must match.
  std::optional<std::string> target_regex;
  bool use_rslora = false;  // scaling lora_alpha / sqrt(r) instead of lora_alpha / r
  std::string bias = "none";
  std::string task_type = "CAUSAL_LM";
  std::string base_model_name_or_path;

  double scaling() const;
  // The targets after defaults: the architecture's (PEFT's default list for
  // it, CausalLM::default_lora_targets); errors name `model_type` when it has none.
  std::vector<std::string> targets_for(const std::vector<std::string>& architecture_default,
                                       const std::string& model_type) const;
  // Errors name the key and the value (and `source`, e.g. the file).
  void validate(const std::string& source) const;
  static LoraConfig from_json(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;  // adapter_config.json (inference_mode true, as PEFT saves)
};

}  // namespace tp::training
