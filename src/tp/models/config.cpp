#include "tp/models/config.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tp/core/error.h"

namespace tp {

namespace {

using nlohmann::json;

// Reads typed values with errors that name the file, the key and the value.
struct Reader {
  const json& j;
  const std::string& source;

  const json* get(const char* key) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int64_t required_int(const char* key) const {
    const json* v = get(key);
    TP_CHECK(v, "{}: required key '{}' is missing (a positive integer)", source, key);
    return as_int(key, *v);
  }
  int64_t optional_int(const char* key, int64_t fallback) const {
    const json* v = get(key);
    return v ? as_int(key, *v) : fallback;
  }
  int64_t as_int(const char* key, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some configs write integral floats ("rope_theta": 500000.0 style for ints).
    if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
      return static_cast<int64_t>(v.get<double>());
    fail("{}: '{}' must be an integer, got {}", source, key, v.dump());
  }
  double optional_double(const char* key, double fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    TP_CHECK(v->is_number(), "{}: '{}' must be a number, got {}", source, key, v->dump());
    return v->get<double>();
  }
  bool optional_bool(const char* key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    TP_CHECK(v->is_boolean(), "{}: '{}' must be true or false, got {}", source, key, v->dump());
    return v->get<bool>();
  }
  std::string optional_string(const char* key, const std::string& fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    TP_CHECK(v->is_string(), "{}: '{}' must be a string, got {}", source, key, v->dump());
    return v->get<std::string>();
  }
};

// Sizes are indexed with 32-bit ints in places (token ids, oneDNN dims) and no
// model comes near; bounding them also keeps the layout's products in 64 bits.
constexpr int64_t kMaxSize = 2147483647;

void check_positive(const std::string& source, const char* key, int64_t v) {
  TP_CHECK(v > 0, "{}: '{}' must be positive, got {}", source, key, v);
  TP_CHECK(v <= kMaxSize, "{}: '{}' is {}; sizes above {} are not accepted (no model has one)", source, key, v,
           kMaxSize);
}

}  // namespace

void check_head_dim(const std::string& source, const char* key, int64_t v) {
  TP_CHECK(v <= kMaxHeadDim,
           "{}: {} is {}; head sizes above {} are not accepted (no model has one; the RoPE tables follow it)", source,
           key, v, kMaxHeadDim);
}

namespace {

RopeScalingConfig parse_rope_scaling(const json& rs, const std::string& source, const char* key) {
  RopeScalingConfig r;
  TP_CHECK(rs.is_object(), "{}: '{}' must be an object or null, got {}", source, key, rs.dump());
  Reader rd{rs, source};
  // Older files call it "type"; Transformers accepts both.
  r.rope_type = rd.optional_string("rope_type", rd.optional_string("type", "default"));
  if (r.rope_type == "su") r.rope_type = "longrope";  // Phi-3's first files; Transformers renames it
  const std::string where = fmt::format("{}: {} (rope_type '{}')", source, key, r.rope_type);
  auto need = [&](const char* field) {
    TP_CHECK(rd.get(field), "{} needs '{}'", where, field);
  };
  if (r.rope_type == "default") {
    return r;
  } else if (r.rope_type == "linear") {
    need("factor");
  } else if (r.rope_type == "llama3") {
    for (const char* f : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) need(f);
  } else if (r.rope_type == "yarn") {
    need("factor");
  } else if (r.rope_type == "longrope") {
    for (const char* f : {"short_factor", "long_factor"}) {
      need(f);
      const json& list = rs.at(f);
      TP_CHECK(list.is_array() && !list.empty() &&
                   std::all_of(list.begin(), list.end(), [](const json& x) { return x.is_number(); }),
               "{}: '{}' must be a non-empty list of numbers, got {}", where, f, list.dump());
      for (const json& x : list) {
        const double v = x.get<double>();
        TP_CHECK(v > 0, "{}: '{}' must hold positive numbers (they divide the frequencies), got {}", where, f, v);
        (std::string(f) == "short_factor" ? r.short_factor : r.long_factor).push_back(v);
      }
    }
    r.factor_given = rd.get("factor") != nullptr;
  } else {
    fail("{}: {}: unsupported rope_type '{}'; supported: default, linear, llama3, yarn, longrope", source, key,
         r.rope_type);
  }
  r.factor = rd.optional_double("factor", r.factor);
  r.low_freq_factor = rd.optional_double("low_freq_factor", r.low_freq_factor);
  r.high_freq_factor = rd.optional_double("high_freq_factor", r.high_freq_factor);
  r.original_max_position_embeddings = rd.optional_int("original_max_position_embeddings", 0);
  r.beta_fast = rd.optional_double("beta_fast", r.beta_fast);
  r.beta_slow = rd.optional_double("beta_slow", r.beta_slow);
  if (rd.get("attention_factor")) r.attention_factor = rd.optional_double("attention_factor", 1.0);
  if (rd.get("mscale")) r.mscale = rd.optional_double("mscale", 1.0);
  if (rd.get("mscale_all_dim")) r.mscale_all_dim = rd.optional_double("mscale_all_dim", 1.0);
  if (rd.get("truncate")) r.truncate = rd.optional_bool("truncate", true);
  TP_CHECK(r.factor >= 1.0, "{}: 'factor' must be >= 1, got {}", where, r.factor);
  if (r.rope_type == "llama3") {
    TP_CHECK(r.original_max_position_embeddings > 0, "{}: 'original_max_position_embeddings' must be positive, got {}",
             where, r.original_max_position_embeddings);
    TP_CHECK(r.high_freq_factor > r.low_freq_factor,
             "{}: 'high_freq_factor' ({}) must be greater than 'low_freq_factor' ({})", where, r.high_freq_factor,
             r.low_freq_factor);
  }
  if (r.rope_type == "yarn")
    TP_CHECK(r.beta_fast > r.beta_slow, "{}: 'beta_fast' ({}) must be greater than 'beta_slow' ({})", where,
             r.beta_fast, r.beta_slow);
  return r;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  TP_CHECK(j.is_object(), "{}: a config must be a JSON object, got {}", source, j.type_name());
  Reader rd{j, source};
  ModelConfig c;
  c.raw = j;
  c.source = source;
  c.model_type = rd.optional_string("model_type", "");
  TP_CHECK(!c.model_type.empty(), "{}: required key 'model_type' is missing (e.g. \"llama\", \"qwen3\")", source);
  // A vision-language config (Gemma3ForConditionalGeneration) keeps its language model's keys under text_config and
  // its weights under language_model.*: Checkpoint::open reads a gemma3 model directory as its language model.
  TP_CHECK(!j.contains("text_config") || j.contains("hidden_size"),
           "{}: model_type '{}' is a multimodal config (its text model under 'text_config', its weights under "
           "'language_model.'); tp runs text models: model_type \"gemma3_text\" (Gemma3ForCausalLM), or a gemma3 "
           "model directory read as its gemma3_text language model",
           source, c.model_type);
  if (const json* a = rd.get("architectures")) {
    TP_CHECK(a->is_array(), "{}: 'architectures' must be a list of strings, got {}", source, a->dump());
    for (const json& s : *a) {
      TP_CHECK(s.is_string(), "{}: 'architectures' must be a list of strings, got {}", source, a->dump());
      c.architectures.push_back(s.get<std::string>());
    }
  }
  c.hidden_size = rd.required_int("hidden_size");
  c.intermediate_size = rd.required_int("intermediate_size");
  c.num_hidden_layers = rd.required_int("num_hidden_layers");
  c.num_attention_heads = rd.required_int("num_attention_heads");
  c.vocab_size = rd.required_int("vocab_size");
  for (auto [key, v] : {std::pair{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
                        {"vocab_size", c.vocab_size}})
    check_positive(source, key, v);
  c.num_key_value_heads = rd.optional_int("num_key_value_heads", c.num_attention_heads);
  check_positive(source, "num_key_value_heads", c.num_key_value_heads);
  TP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
           "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source,
           c.num_attention_heads, c.num_key_value_heads);
  if (rd.get("head_dim")) {
    c.head_dim = rd.required_int("head_dim");
    check_positive(source, "head_dim", c.head_dim);
  } else {
    TP_CHECK(c.hidden_size % c.num_attention_heads == 0,
             "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is given", source,
             c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  check_head_dim(source, "'head_dim'", c.head_dim);
  c.max_position_embeddings = rd.optional_int("max_position_embeddings", 2048);
  check_positive(source, "max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = rd.optional_double("rms_norm_eps", 1e-6);
  TP_CHECK(c.rms_norm_eps > 0, "{}: 'rms_norm_eps' must be positive, got {}", source, c.rms_norm_eps);
  c.initializer_range = rd.optional_double("initializer_range", 0.02);
  // Transformers' Llama-family configs untie by default; Gemma's keep PretrainedConfig's default (tied).
  c.tie_word_embeddings = rd.optional_bool("tie_word_embeddings", c.model_type == "gemma3_text");
  c.attention_bias = rd.optional_bool("attention_bias", false);
  c.hidden_act = rd.optional_string("hidden_act", "silu");
  // Transformers >= 4.56 writes "dtype"; older files "torch_dtype".
  c.torch_dtype = rd.optional_string("torch_dtype", rd.optional_string("dtype", "float32"));

  // Newer files group RoPE settings under rope_parameters (with rope_theta inside).
  c.rope_theta = rd.optional_double("rope_theta", 10000.0);
  if (const json* rp = rd.get("rope_parameters")) {
    c.rope_scaling = parse_rope_scaling(*rp, source, "rope_parameters");
    c.rope_theta = Reader{*rp, source}.optional_double("rope_theta", c.rope_theta);
  } else if (const json* rs = rd.get("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(*rs, source, "rope_scaling");
  }
  TP_CHECK(c.rope_theta > 0, "{}: 'rope_theta' must be positive, got {}", source, c.rope_theta);

  if (rd.get("bos_token_id")) c.bos_token_id = rd.required_int("bos_token_id");
  if (const json* e = rd.get("eos_token_id")) {
    if (e->is_array()) {
      for (const json& id : *e) c.eos_token_ids.push_back(rd.as_int("eos_token_id", id));
    } else {
      c.eos_token_ids.push_back(rd.as_int("eos_token_id", *e));
    }
  }
  for (const char* key : {"base_model_tp_plan", "base_model_ep_plan"}) {
    const json* plan = rd.get(key);
    if (plan == nullptr) continue;
    TP_CHECK(plan->is_object(), "{}: '{}' must be an object of pattern -> style, got {}", source, key, plan->dump());
    auto& into = std::string(key) == "base_model_tp_plan" ? c.base_model_tp_plan : c.base_model_ep_plan;
    for (auto it = plan->begin(); it != plan->end(); ++it) {
      TP_CHECK(it.value().is_string(), "{}: {}['{}'] must be a style name string, got {}", source, key, it.key(),
               it.value().dump());
      into.emplace_back(it.key(), it.value().get<std::string>());
    }
  }
  c.quantization = parse_quantization_config(j, source);
  return c;
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  nlohmann::ordered_json ordered;
  try {
    ordered = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  ModelConfig c = from_json(json::parse(text), source);
  // nlohmann::json sorts keys; take the plan's order from the ordered parse.
  for (auto [key, plan] : {std::pair{"base_model_tp_plan", &c.base_model_tp_plan},
                           std::pair{"base_model_ep_plan", &c.base_model_ep_plan}}) {
    if (plan->empty()) continue;
    plan->clear();
    for (auto& [k, v] : ordered[key].items()) plan->emplace_back(k, v.get<std::string>());
  }
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& config_json) {
  std::ifstream in(config_json, std::ios::binary);
  TP_CHECK(in, "cannot open {}: {}", config_json.string(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), config_json.string());
}

json ModelConfig::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  j["model_type"] = model_type;
  if (!architectures.empty()) j["architectures"] = architectures;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  // Gemma's files name it hidden_activation: no hidden_act key they lacked (the default, silu, would be wrong there).
  if (j.contains("hidden_act") || hidden_act != "silu") j["hidden_act"] = hidden_act;
  if (j.contains("dtype") && !j.contains("torch_dtype"))
    j["dtype"] = torch_dtype;
  else
    j["torch_dtype"] = torch_dtype;
  if (j.contains("attention_bias") || attention_bias) j["attention_bias"] = attention_bias;
  json rs = nullptr;
  if (rope_scaling.rope_type == "longrope") {
    // Older Transformers (Phi3Config) accept exactly type, short_factor and long_factor: only what the file gave.
    const char* key = raw.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
    const bool old_key = raw.contains(key) && raw[key].is_object() && raw[key].contains("type") &&
                         !raw[key].contains("rope_type");
    rs = {{old_key ? "type" : "rope_type", "longrope"},
          {"short_factor", rope_scaling.short_factor},
          {"long_factor", rope_scaling.long_factor}};
    if (rope_scaling.factor_given) rs["factor"] = rope_scaling.factor;
    if (rope_scaling.attention_factor) rs["attention_factor"] = *rope_scaling.attention_factor;
    if (rope_scaling.original_max_position_embeddings > 0)
      rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  } else if (rope_scaling.rope_type != "default") {
    rs = {{"rope_type", rope_scaling.rope_type}, {"factor", rope_scaling.factor}};
    if (rope_scaling.rope_type == "llama3") {
      rs["low_freq_factor"] = rope_scaling.low_freq_factor;
      rs["high_freq_factor"] = rope_scaling.high_freq_factor;
    }
    if (rope_scaling.original_max_position_embeddings > 0)
      rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    if (rope_scaling.rope_type == "yarn") {
      rs["beta_fast"] = rope_scaling.beta_fast;
      rs["beta_slow"] = rope_scaling.beta_slow;
      if (rope_scaling.attention_factor) rs["attention_factor"] = *rope_scaling.attention_factor;
      if (rope_scaling.mscale) rs["mscale"] = *rope_scaling.mscale;
      if (rope_scaling.mscale_all_dim) rs["mscale_all_dim"] = *rope_scaling.mscale_all_dim;
      if (rope_scaling.truncate) rs["truncate"] = *rope_scaling.truncate;
    }
  }
  if (j.contains("rope_parameters")) {
    if (rs.is_null()) rs = {{"rope_type", "default"}};
    rs["rope_theta"] = rope_theta;
    j["rope_parameters"] = rs;
  } else {
    j["rope_theta"] = rope_theta;
    j["rope_scaling"] = rs;
  }
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (eos_token_ids.size() == 1)
    j["eos_token_id"] = eos_token_ids[0];
  else
    j["eos_token_id"] = eos_token_ids;
  for (auto [key, entries] : {std::pair{"base_model_tp_plan", &base_model_tp_plan},
                              std::pair{"base_model_ep_plan", &base_model_ep_plan}}) {
    if (entries->empty()) continue;
    json plan = json::object();
    for (auto& [k, v] : *entries) plan[k] = v;
    j[key] = plan;
  }
  return j;
}

bool ModelConfig::raw_bool(const char* key, bool fallback) const {
  return Reader{raw, source}.optional_bool(key, fallback);
}

std::string ModelConfig::raw_string(const char* key, const std::string& fallback) const {
  return Reader{raw, source}.optional_string(key, fallback);
}

}  // namespace tp
