#include "tp/training/lora_config.h"

#include <cmath>
#include <regex>

#include "tp/core/error.h"

namespace tp::training {

using nlohmann::json;

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

std::vector<std::string> LoraConfig::targets_for(const std::vector<std::string>& architecture_default,
                                                 const std::string& model_type) const {
  if (!target_modules.empty() || target_regex) return target_modules;
  TP_CHECK(!architecture_default.empty(),
           "LoRA: no default target_modules for model_type '{}'; name them (e.g. q_proj,v_proj)", model_type);
  return architecture_default;
}

void LoraConfig::validate(const std::string& source) const {
  TP_CHECK(r >= 1 && r <= 65536, "{}: LoRA 'r' must be in 1..65536, got {}", source, r);
  TP_CHECK(std::isfinite(lora_alpha) && lora_alpha > 0, "{}: 'lora_alpha' must be positive, got {}", source, lora_alpha);
  TP_CHECK(lora_dropout >= 0 && lora_dropout < 1, "{}: 'lora_dropout' must be in [0, 1), got {}", source,
           lora_dropout);
  TP_CHECK(bias == "none", "{}: LoRA 'bias' '{}' is not supported; supported: none", source, bias);
  for (const std::string& t : target_modules)
    TP_CHECK(!t.empty(), "{}: 'target_modules' holds an empty name", source);
  if (target_regex) {
    try {
      std::regex check(*target_regex);
    } catch (const std::regex_error& e) {
      fail("{}: 'target_modules' '{}' is not a valid regex: {}", source, *target_regex, e.what());
    }
  }
}

namespace {

// j[key] as T, or `fallback` when the key is absent or null (PEFT writes nulls).
template <class T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<T>();
}

bool given(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null() && !(it->is_array() && it->empty()) && !(it->is_object() && it->empty());
}

}  // namespace

LoraConfig LoraConfig::from_json(const json& j, const std::string& source) {
  TP_CHECK(j.is_object(), "{}: an adapter config must be a JSON object", source);
  LoraConfig c;
  try {
    const std::string type = get_or<std::string>(j, "peft_type", "");
    TP_CHECK(type == "LORA", "{}: 'peft_type' is '{}'; tp loads LoRA adapters (\"peft_type\": \"LORA\")", source,
             type);
    c.r = get_or<int64_t>(j, "r", c.r);
    c.lora_alpha = get_or<double>(j, "lora_alpha", c.lora_alpha);
    c.lora_dropout = get_or<double>(j, "lora_dropout", c.lora_dropout);
    c.use_rslora = get_or<bool>(j, "use_rslora", false);
    c.bias = get_or<std::string>(j, "bias", c.bias);
    c.task_type = get_or<std::string>(j, "task_type", c.task_type);
    c.base_model_name_or_path = get_or<std::string>(j, "base_model_name_or_path", "");
    if (given(j, "target_modules")) {
      const json& t = j["target_modules"];
      if (t.is_string())
        c.target_regex = t.get<std::string>();
      else
        c.target_modules = t.get<std::vector<std::string>>();
    }
    for (const char* unsupported : {"layers_to_transform", "rank_pattern", "alpha_pattern", "modules_to_save"})
      TP_CHECK(!given(j, unsupported), "{}: '{}' is not supported by tp's LoRA", source, unsupported);
    TP_CHECK(!get_or<bool>(j, "fan_in_fan_out", false),
             "{}: 'fan_in_fan_out' true is for Conv1D models; these use Linear", source);
    TP_CHECK(!get_or<bool>(j, "use_dora", false), "{}: DoRA ('use_dora': true) is not supported", source);
  } catch (const json::exception& e) {
    fail("{}: {}", source, e.what());
  }
  c.validate(source);
  return c;
}

json LoraConfig::to_json() const {
  json j = {{"peft_type", "LORA"},
            {"task_type", task_type},
            {"r", r},
            {"lora_alpha", lora_alpha},
            {"lora_dropout", lora_dropout},
            {"bias", bias},
            {"use_rslora", use_rslora},
            {"fan_in_fan_out", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"modules_to_save", nullptr},
            {"base_model_name_or_path", base_model_name_or_path}};
  if (target_regex)
    j["target_modules"] = *target_regex;
  else
    j["target_modules"] = target_modules;
  return j;
}

}  // namespace tp::training
