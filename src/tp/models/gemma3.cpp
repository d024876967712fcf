#include "tp/models/gemma3.h"

#include <cmath>

#include "tp/models/decoder_args.h"
#include "tp/models/llama.h"
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/rope.h"
#include "tp/ops/shape.h"

namespace tp {

// ---------------------------------------------------------------- config

namespace {

constexpr double kNormOffset = 1.0;  // Gemma's RMSNorm: (1 + w)

// Which layers attend through the window: layer_types when given, else Gemma3TextConfig's
// rule from sliding_window_pattern (default 6): layer i is global when (i + 1) % pattern == 0.
std::vector<bool> sliding_layers(const ModelConfig& c) {
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers));
  auto types = c.raw.find("layer_types");
  if (types != c.raw.end() && !types->is_null()) {
    TP_CHECK(types->is_array() && static_cast<int64_t>(types->size()) == c.num_hidden_layers,
             "{}: 'layer_types' must list one type per layer ({} layers), got {}", c.source, c.num_hidden_layers,
             types->dump());
    for (size_t i = 0; i < sliding.size(); ++i) {
      const nlohmann::json& t = (*types)[i];
      TP_CHECK(t == "sliding_attention" || t == "full_attention",
               "{}: layer_types[{}] is {}; supported: \"sliding_attention\", \"full_attention\"", c.source, i, t.dump());
      sliding[i] = t == "sliding_attention";
    }
    return sliding;
  }
  int64_t pattern = 6;
  auto p = c.raw.find("sliding_window_pattern");
  if (p != c.raw.end() && !p->is_null()) {
    TP_CHECK(p->is_number_integer() && p->get<int64_t>() >= 1,
             "{}: 'sliding_window_pattern' must be a positive integer (every Nth layer global), got {}", c.source,
             p->dump());
    pattern = p->get<int64_t>();
  }
  for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = (static_cast<int64_t>(i) + 1) % pattern != 0;
  return sliding;
}

// One RoPE of the two: {rope_type, factor} from `scaling` (null: default) over base `theta`.
std::vector<float> gemma3_inv_freq(const ModelConfig& c, double theta, const nlohmann::json& scaling,
                                   const char* where) {
  TP_CHECK(theta > 0, "{}: {}: the RoPE base must be positive, got {}", c.source, where, theta);
  std::vector<float> f = ops::rope_inv_freq(c.head_dim, theta);
  if (scaling.is_null()) return f;
  TP_CHECK(scaling.is_object(), "{}: {} must be an object or null, got {}", c.source, where, scaling.dump());
  auto type_key = scaling.find("rope_type");
  if (type_key == scaling.end()) type_key = scaling.find("type");
  TP_CHECK(type_key == scaling.end() || type_key->is_string(), "{}: {}: 'rope_type' must be a string, got {}",
           c.source, where, type_key == scaling.end() ? "none" : type_key->dump());
  const std::string type = type_key == scaling.end() ? "default" : type_key->get<std::string>();
  if (type == "default") return f;
  TP_CHECK(type == "linear", "{}: {}: rope_type '{}' is not supported for gemma3_text; supported: default, linear",
           c.source, where, type);
  auto factor = scaling.find("factor");
  TP_CHECK(factor != scaling.end() && factor->is_number() && factor->get<double>() >= 1.0,
           "{}: {}: linear RoPE needs a 'factor' >= 1, got {}", c.source, where,
           factor == scaling.end() ? "none" : factor->dump());
  for (float& x : f) x = static_cast<float>(x / factor->get<double>());  // positions / factor
  return f;
}

double raw_number(const ModelConfig& c, const char* key, double fallback) {
  auto it = c.raw.find(key);
  if (it == c.raw.end() || it->is_null()) return fallback;
  TP_CHECK(it->is_number(), "{}: '{}' must be a number, got {}", c.source, key, it->dump());
  return it->get<double>();
}

}  // namespace

bool is_gemma3_multimodal(const nlohmann::json& raw) {
  return raw.is_object() && raw.value("model_type", nlohmann::json()) == "gemma3" && raw.contains("text_config");
}

nlohmann::json gemma3_text_config_of(const nlohmann::json& raw) {
  const nlohmann::json& text = raw.at("text_config");
  TP_CHECK(text.is_object(), "config.json: 'text_config' must be an object, got {}", text.dump());
  TP_CHECK(!text.contains("model_type") || text["model_type"] == "gemma3_text",
           "config.json: text_config's model_type is {}; a gemma3 config's text model is \"gemma3_text\"",
           text["model_type"].dump());
  // Gemma3TextConfig's defaults for the keys the arithmetic needs.
  nlohmann::json j = {{"vocab_size", 262208},       {"hidden_size", 2304},       {"intermediate_size", 9216},
                      {"num_hidden_layers", 26},     {"num_attention_heads", 8},  {"num_key_value_heads", 4},
                      {"head_dim", 256},             {"rope_theta", 1000000.0},   {"rms_norm_eps", 1e-6},
                      {"max_position_embeddings", 131072}};
  for (const char* key : {"torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id"})
    if (raw.contains(key)) j[key] = raw[key];
  for (auto it = text.begin(); it != text.end(); ++it) j[it.key()] = it.value();
  j["model_type"] = "gemma3_text";
  j["architectures"] = {"Gemma3ForCausalLM"};
  return j;
}

Gemma3Layers gemma3_layers(const ModelConfig& c) {
  Gemma3Layers g;
  TP_CHECK(!c.raw_bool("use_bidirectional_attention", false),
           "{}: 'use_bidirectional_attention' true (an encoder) is not supported; tp runs Gemma 3 as a causal LM",
           c.source);
  // Gemma 2's cap on the attention scores: Gemma 3 ships it null, and Transformers
  // applies it inside attention when set, which tp's attention kernels do not.
  const auto cap = c.raw.find("attn_logit_softcapping");
  TP_CHECK(cap == c.raw.end() || cap->is_null(),
           "{}: 'attn_logit_softcapping' {} is not supported (Gemma 3 configs set it null): tp's attention applies "
           "no cap to its scores", c.source, cap == c.raw.end() ? "" : cap->dump());
  const std::string act = c.raw_string("hidden_activation", "gelu_pytorch_tanh");
  TP_CHECK(act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu",
           "{}: hidden_activation '{}' is not supported; supported: gelu_pytorch_tanh, gelu_new, gelu", c.source, act);
  g.geglu_tanh = act != "gelu";
  const double scalar = raw_number(c, "query_pre_attn_scalar", 256);
  TP_CHECK(scalar > 0, "{}: 'query_pre_attn_scalar' must be positive, got {}", c.source, scalar);
  g.scale = 1.0 / std::sqrt(scalar);

  const std::vector<bool> sliding = sliding_layers(c);
  int64_t window = 4096;  // Gemma3TextConfig's default
  if (auto w = c.raw.find("sliding_window"); w != c.raw.end() && !w->is_null()) {
    TP_CHECK(w->is_number_integer() && w->get<int64_t>() >= 1, "{}: 'sliding_window' must be a positive integer, got {}",
             c.source, w->dump());
    window = w->get<int64_t>();
  }
  for (bool s : sliding) g.window.push_back(s ? window : 0);

  // Newer files: rope_parameters per layer type; older: rope_theta + rope_scaling (global),
  // rope_local_base_freq (local, no scaling).
  auto params = c.raw.find("rope_parameters");
  if (params != c.raw.end() && params->is_object() && params->contains("full_attention")) {
    for (auto [key, out] : {std::pair{"full_attention", &g.global_inv_freq}, {"sliding_attention", &g.local_inv_freq}}) {
      auto p = params->find(key);
      TP_CHECK(p != params->end() && p->is_object() && p->contains("rope_theta") && (*p)["rope_theta"].is_number(),
               "{}: rope_parameters.{} must be an object with a numeric 'rope_theta', got {}", c.source, key,
               p == params->end() ? "none" : p->dump());
      *out = gemma3_inv_freq(c, (*p)["rope_theta"].get<double>(), *p,
                             key == std::string("full_attention") ? "rope_parameters.full_attention"
                                                                  : "rope_parameters.sliding_attention");
    }
    return g;
  }
  // Gemma3TextConfig's rope_theta default is 1e6 (ModelConfig's, Llama's, 1e4).
  auto scaling = c.raw.find("rope_scaling");
  g.global_inv_freq = gemma3_inv_freq(c, raw_number(c, "rope_theta", 1e6),
                                      scaling == c.raw.end() ? nlohmann::json() : *scaling, "rope_scaling");
  g.local_inv_freq = gemma3_inv_freq(c, raw_number(c, "rope_local_base_freq", 10000.0), nullptr,
                                     "rope_local_base_freq");
  return g;
}

// ---------------------------------------------------------------- attention

Gemma3Attention::Gemma3Attention(const std::string& name, int64_t index, const ModelConfig& c, const Gemma3Layers& g)
    : nn::Module(name),
      q_proj(add_module(std::make_unique<nn::Linear>(child_name("q_proj"), c.hidden_size,
                                                     c.num_attention_heads * c.head_dim, c.attention_bias))),
      k_proj(add_module(std::make_unique<nn::Linear>(child_name("k_proj"), c.hidden_size,
                                                     c.num_key_value_heads * c.head_dim, c.attention_bias))),
      v_proj(add_module(std::make_unique<nn::Linear>(child_name("v_proj"), c.hidden_size,
                                                     c.num_key_value_heads * c.head_dim, c.attention_bias))),
      o_proj(add_module(std::make_unique<nn::Linear>(child_name("o_proj"), c.num_attention_heads * c.head_dim,
                                                     c.hidden_size, c.attention_bias))),
      q_norm(add_module(std::make_unique<nn::RMSNorm>(child_name("q_norm"), c.head_dim, c.rms_norm_eps, kNormOffset))),
      k_norm(add_module(std::make_unique<nn::RMSNorm>(child_name("k_norm"), c.head_dim, c.rms_norm_eps, kNormOffset))),
      layer_index(index),
      sliding_window(g.window.at(static_cast<size_t>(index))),
      head_dim_(c.head_dim),
      scale_(g.scale),
      inv_freq_(sliding_window > 0 ? &g.local_inv_freq : &g.global_inv_freq) {}

Tensor Gemma3Attention::forward(const std::vector<Tensor>& inputs) {
  fail("{}: attention runs inside its decoder layer, which hands it the positions (DecoderArgs)", name());
}

Tensor Gemma3Attention::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const DecoderArgs& context = decoder_args(args, *this);
  const Tensor& x = inputs.at(0);  // [B, T, H]
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  // This rank's heads, normalized per head, then rotated: [B, T, Hq, D] and [B, T, Hkv, D].
  Tensor q = q_norm(ops::reshape(q_proj(x), {B, T, -1, D}));
  Tensor k = k_norm(ops::reshape(k_proj(x), {B, T, -1, D}));
  Tensor v = ops::reshape(v_proj(x), {B, T, -1, D});
  q = ops::apply_rope(q, context.positions, *inv_freq_);
  k = ops::apply_rope(k, context.positions, *inv_freq_);
  Tensor out = decoder_attention(context, layer_index, q, k, v, {.scale = scale_, .sliding_window = sliding_window});
  return o_proj(ops::reshape(out, {B, T, -1}));
}

// ---------------------------------------------------------------- MLP

Gemma3MLP::Gemma3MLP(const std::string& name, const ModelConfig& c, bool gelu_tanh)
    : nn::Module(name),
      gate_proj(add_module(std::make_unique<nn::Linear>(child_name("gate_proj"), c.hidden_size, c.intermediate_size,
                                                        false))),
      up_proj(add_module(std::make_unique<nn::Linear>(child_name("up_proj"), c.hidden_size, c.intermediate_size,
                                                      false))),
      down_proj(add_module(std::make_unique<nn::Linear>(child_name("down_proj"), c.intermediate_size, c.hidden_size,
                                                        false))),
      gelu_tanh_(gelu_tanh) {}

Tensor Gemma3MLP::forward(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  return down_proj(ops::mul(ops::gelu(gate_proj(x), gelu_tanh_), up_proj(x)));
}

// ---------------------------------------------------------------- decoder layer

namespace {

std::unique_ptr<nn::RMSNorm> gemma_norm(const std::string& name, const ModelConfig& c) {
  return std::make_unique<nn::RMSNorm>(name, c.hidden_size, c.rms_norm_eps, kNormOffset);
}

}  // namespace

Gemma3DecoderLayer::Gemma3DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c,
                                       const Gemma3Layers& g)
    : nn::Module(name),
      input_layernorm(add_module(gemma_norm(child_name("input_layernorm"), c))),
      self_attn(add_module(std::make_unique<Gemma3Attention>(child_name("self_attn"), index, c, g))),
      post_attention_layernorm(add_module(gemma_norm(child_name("post_attention_layernorm"), c))),
      pre_feedforward_layernorm(add_module(gemma_norm(child_name("pre_feedforward_layernorm"), c))),
      mlp(add_module(std::make_unique<Gemma3MLP>(child_name("mlp"), c, g.geglu_tanh))),
      post_feedforward_layernorm(add_module(gemma_norm(child_name("post_feedforward_layernorm"), c))) {}

Tensor Gemma3DecoderLayer::forward(const std::vector<Tensor>& inputs) {
  fail("{}: a decoder layer needs its model's DecoderArgs (positions, cache)", name());
}

Tensor Gemma3DecoderLayer::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const Tensor& x = inputs.at(0);
  Tensor h = ops::add(x, post_attention_layernorm(self_attn(input_layernorm(x), &args)));  // self attention
  return ops::add(h, post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))));    // fully connected
}

// ---------------------------------------------------------------- causal LM

Gemma3ForCausalLM::Gemma3ForCausalLM(const ModelConfig& config)
    : CausalLM(config),
      layers_(gemma3_layers(config)),
      model(add_module(std::make_unique<Gemma3TextModel>(
          "model", config, layers_,
          DecoderBodyOptions{.embed_scale = std::sqrt(static_cast<double>(config.hidden_size)),
                             .norm_weight_offset = kNormOffset}))),
      lm_head(add_module(std::make_unique<nn::Linear>("lm_head", config.hidden_size, config.vocab_size, false))) {
  const double cap = raw_number(config, "final_logit_softcapping", 0.0);
  TP_CHECK(cap >= 0 && std::isfinite(cap), "{}: 'final_logit_softcapping' must be a positive number or null, got {}",
           config.source, cap);
  final_logit_softcapping_ = cap;
  model.checkpointing = &checkpointing_;
  model.unit_hooks = &unit_hooks_;
}

// Transformers' Gemma3TextConfig.base_model_tp_plan is Llama's: q/k/v and gate/up
// colwise, o and down rowwise. Its q_norm / k_norm weights are replicated and see
// only this rank's heads (as Qwen3's), so the plan all-reduces their gradients.
parallel::Plan Gemma3ForCausalLM::shipped_plan() const {
  const parallel::Plan base =
      parallel::with_entries_after(llama_base_tp_plan(), "layers.*.self_attn.v_proj",
                                   {{"layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"},
                                    {"layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"}});
  return causal_lm_plan(config_, base);
}

// Llama's layout with the sandwich norms: every norm runs on sequence shards,
// the attention and the MLP gather the sequence on entry.
parallel::Plan Gemma3ForCausalLM::sequence_parallel_plan() const {
  parallel::Plan plan = {{"model.layers.*.input_layernorm", "sequence_parallel"},
                         {"model.layers.*.self_attn", "gather_sequence_input"},
                         {"model.layers.*.post_attention_layernorm", "sequence_parallel"},
                         {"model.layers.*.pre_feedforward_layernorm", "sequence_parallel"},
                         {"model.layers.*.mlp", "gather_sequence_input"},
                         {"model.layers.*.post_feedforward_layernorm", "sequence_parallel"},
                         {"model.norm", "sequence_parallel_gather_output"}};
  const parallel::Plan shipped = shipped_plan();
  if (std::none_of(shipped.begin(), shipped.end(), [](const auto& e) { return e.first == "model.embed_tokens"; }))
    plan.insert(plan.begin(), {"model.embed_tokens", "scatter_sequence_output"});
  return plan;
}

parallel::StyleOverrides Gemma3ForCausalLM::check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const {
  parallel::StyleOverrides overrides;
  auto style_of = [&](const std::string& module) {
    auto it = plan.module_style.find(module);
    return it == plan.module_style.end() ? std::string() : it->second;
  };
  for (const Gemma3DecoderLayer* layer : model.layers) {
    const Gemma3Attention& a = layer->self_attn;
    check_attention_heads(config_, {&a.q_proj, &a.k_proj, &a.v_proj}, style_of, tp_size, overrides);
    for (const nn::Linear* m : {&layer->mlp.gate_proj, &layer->mlp.up_proj})
      if (style_of(m->name()) == "colwise")
        TP_CHECK(config_.intermediate_size % tp_size == 0, "intermediate_size {} is not divisible by tp_size {} ('{}')",
                 config_.intermediate_size, tp_size, m->name());
  }
  return overrides;
}

KVState Gemma3ForCausalLM::make_kv_state(int64_t batch, int64_t max_len) const {
  std::vector<ops::KVCache::Layer> layers;
  for (const Gemma3DecoderLayer* layer : model.layers) {
    const nn::Linear& k_proj = layer->self_attn.k_proj;
    const int64_t rows = nn::local_shape(k_proj.weight)[0];
    layers.push_back({rows / config_.head_dim, k_proj.weight_dtype() == DType::BF16 ? DType::BF16 : DType::F32});
  }
  return KVState{ops::KVCache::for_layers(batch, max_len, config_.head_dim, layers)};
}

HiddenOutput Gemma3ForCausalLM::run_decoder(const Tensor& ids_in, const ForwardOptions& options) {
  Tensor ids = batch_of_ids(ids_in, options);
  DecoderArgs args = decoder_call(ids, options);
  HiddenOutput out;
  out.hidden = model(ids, &args);  // [B, T, H]
  return out;
}

}  // namespace tp
