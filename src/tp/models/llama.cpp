#include "tp/models/llama.h"

#include <cmath>
#include <initializer_list>

#include "tp/autograd/tape.h"
#include "tp/models/moe.h"
#include "tp/models/rope_config.h"
#include "tp/models/variants.h"
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/norm.h"
#include "tp/ops/rope.h"
#include "tp/ops/shape.h"
#include "tp/parallel/colwise.h"

namespace tp {

// ---------------------------------------------------------------- attention

LlamaAttention::LlamaAttention(const std::string& name, const ModelConfig& c, const LlamaVariant& v)
    : nn::Module(name),
      q_proj(add_module(std::make_unique<nn::Linear>(child_name("q_proj"), c.hidden_size,
                                                     c.num_attention_heads * c.head_dim,
                                                     v.qkv_bias.value_or(c.attention_bias)))),
      k_proj(add_module(std::make_unique<nn::Linear>(child_name("k_proj"), c.hidden_size,
                                                     c.num_key_value_heads * c.head_dim,
                                                     v.qkv_bias.value_or(c.attention_bias)))),
      v_proj(add_module(std::make_unique<nn::Linear>(child_name("v_proj"), c.hidden_size,
                                                     c.num_key_value_heads * c.head_dim,
                                                     v.qkv_bias.value_or(c.attention_bias)))),
      o_proj(add_module(std::make_unique<nn::Linear>(child_name("o_proj"), c.num_attention_heads * c.head_dim,
                                                     c.hidden_size, v.o_bias.value_or(c.attention_bias)))),
      layer_index(0),
      head_dim_(c.head_dim),
      scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
  if (v.qk_norm) {
    q_norm = &add_module(std::make_unique<nn::RMSNorm>(child_name("q_norm"), c.head_dim, c.rms_norm_eps));
    k_norm = &add_module(std::make_unique<nn::RMSNorm>(child_name("k_norm"), c.head_dim, c.rms_norm_eps));
  }
  if (v.attention_sinks) sinks = &add_parameter("sinks", {c.num_attention_heads});
}

bool LlamaAttention::takes_bf16_input() const {
  return q_proj.takes_bf16_input() && k_proj.takes_bf16_input() && v_proj.takes_bf16_input();
}

namespace {

// A projection may run inside a fused GEMM with its siblings when its style
// (if any) allows it: its forward there is the plain local product.
bool local_forward(const nn::Linear& l) { return l.style() == nullptr || l.style()->allows_fused_forward(); }

// The fused GEMM runs where the separate packed ones would: no gradient wanted.
bool fused_applies(const nn::FusedLinears& f, const Tensor& x, std::initializer_list<const nn::Linear*> parts) {
  if (!f.active() || autograd::needs_grad({x})) return false;
  for (const nn::Linear* p : parts)
    if (autograd::needs_grad({p->weight.data})) return false;
  return true;
}

}  // namespace

void LlamaAttention::finalize_weights(bool inference_only) {
  if (local_forward(q_proj) && local_forward(k_proj) && local_forward(v_proj)) qkv_.fuse({&q_proj, &k_proj, &v_proj});
}

Tensor LlamaAttention::forward(const std::vector<Tensor>& inputs) {
  fail("{}: attention runs inside its decoder layer, which hands it the positions (DecoderArgs)", name());
}

Tensor LlamaAttention::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const DecoderArgs& context = decoder_args(args, *this);
  const Tensor& x = inputs.at(0);  // [B, T, H]
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  // This rank's heads: [B, T, Hq, D] and [B, T, Hkv, D].
  Tensor q, k, v;
  if (fused_applies(qkv_, x, {&q_proj, &k_proj, &v_proj})) {
    std::vector<Tensor> qkv = qkv_.forward(x);
    q = ops::reshape(qkv[0], {B, T, -1, D});
    k = ops::reshape(qkv[1], {B, T, -1, D});
    v = ops::reshape(qkv[2], {B, T, -1, D});
  } else {
    q = ops::reshape(q_proj(x), {B, T, -1, D});
    k = ops::reshape(k_proj(x), {B, T, -1, D});
    v = ops::reshape(v_proj(x), {B, T, -1, D});
  }
  if (q_norm != nullptr) {  // Qwen3: per-head RMSNorm before RoPE
    q = (*q_norm)(q);
    k = (*k_norm)(k);
  }
  q = ops::apply_rope(q, context.positions, *context.inv_freq, context.rope);
  k = ops::apply_rope(k, context.positions, *context.inv_freq, context.rope);
  // The op takes f32 sinks (a bf16 checkpoint's are converted, differentiably).
  Tensor sink_logits;
  if (sinks != nullptr)
    sink_logits = sinks->data.dtype() == DType::F32 ? sinks->data : ops::to_dtype(sinks->data, DType::F32);

  Tensor out = decoder_attention(context, layer_index, q, k, v,
                                 {.scale = scale_, .sliding_window = sliding_window, .sinks = sink_logits});
  return o_proj(ops::reshape(out, {B, T, -1}));
}

// ---------------------------------------------------------------- MLP

LlamaMLP::LlamaMLP(const std::string& name, const ModelConfig& c, int64_t intermediate, bool bias)
    : LlamaMLP(name, c.hidden_size, intermediate < 0 ? c.intermediate_size : intermediate, bias) {}

LlamaMLP::LlamaMLP(const std::string& name, int64_t hidden, int64_t intermediate, bool bias)
    : nn::Module(name),
      gate_proj(add_module(std::make_unique<nn::Linear>(child_name("gate_proj"), hidden, intermediate, bias))),
      up_proj(add_module(std::make_unique<nn::Linear>(child_name("up_proj"), hidden, intermediate, bias))),
      down_proj(add_module(std::make_unique<nn::Linear>(child_name("down_proj"), intermediate, hidden, bias))) {}

void LlamaMLP::finalize_weights(bool inference_only) {
  if (local_forward(gate_proj) && local_forward(up_proj)) gate_up_.fuse({&gate_proj, &up_proj});
}

Tensor LlamaMLP::forward(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  if (fused_applies(gate_up_, x, {&gate_proj, &up_proj})) {
    std::vector<Tensor> gate_up = gate_up_.forward(x);
    return down_proj(ops::swiglu(gate_up[0], gate_up[1]));
  }
  return down_proj(ops::swiglu(gate_proj(x), up_proj(x)));
}

// ---------------------------------------------------------------- decoder layer

namespace {

// The variant's block for this layer (a sparse MoE block), else the dense MLP.
std::unique_ptr<nn::Module> feed_forward(const std::string& name, int64_t index, const ModelConfig& c,
                                         const LlamaVariant& v) {
  if (v.make_mlp)
    if (std::unique_ptr<nn::Module> block = v.make_mlp(name, index, c)) return block;
  return std::make_unique<LlamaMLP>(name, c, -1, v.mlp_bias);
}

// Layer i's attention window: the variant's (none on its first full_attention_layers), or,
// when config.json lists layer_types, the window on "sliding_attention" layers and none on
// "full_attention" ones.
int64_t layer_window(const ModelConfig& c, const LlamaVariant& v, int64_t i) {
  auto it = c.raw.find("layer_types");
  if (it == c.raw.end() || it->is_null()) return i < v.full_attention_layers ? 0 : v.sliding_window;
  TP_CHECK(it->is_array() && static_cast<int64_t>(it->size()) == c.num_hidden_layers,
           "{}: 'layer_types' must list one type per layer ({} layers), got {}", c.source, c.num_hidden_layers,
           it->dump());
  const nlohmann::json& type = (*it)[static_cast<size_t>(i)];
  if (type == "full_attention") return 0;
  TP_CHECK(type == "sliding_attention",
           "{}: layer_types[{}] is {}; supported: \"sliding_attention\", \"full_attention\"", c.source, i, type.dump());
  TP_CHECK(v.sliding_window > 0, "{}: layer_types[{}] is \"sliding_attention\" but 'sliding_window' is not set",
           c.source, i);
  return v.sliding_window;
}

}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const std::string& name, int64_t index, const ModelConfig& c,
                                     const LlamaVariant& v)
    : nn::Module(name),
      input_layernorm(
          add_module(std::make_unique<nn::RMSNorm>(child_name("input_layernorm"), c.hidden_size, c.rms_norm_eps))),
      self_attn(add_module(std::make_unique<LlamaAttention>(child_name("self_attn"), c, v))),
      post_attention_layernorm(add_module(
          std::make_unique<nn::RMSNorm>(child_name("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps))),
      mlp(add_module(feed_forward(child_name("mlp"), index, c, v))) {
  self_attn.layer_index = index;
  self_attn.sliding_window = layer_window(c, v, index);
}

// Anything in the layer needs a gradient: the input, or a parameter (an
// adapter's, under a frozen base). Generation runs without gradients: no walk.
bool LlamaDecoderLayer::differentiable(const Tensor& x) {
  if (!autograd::is_grad_enabled()) return false;
  if (x.requires_grad()) return true;
  for (nn::Parameter* p : parameters())
    if (p->data.defined() && p->data.requires_grad()) return true;
  return false;
}

Tensor LlamaDecoderLayer::forward(const std::vector<Tensor>& inputs) {
  fail("{}: a decoder layer needs its model's DecoderArgs (positions, cache)", name());
}

Tensor LlamaDecoderLayer::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const Tensor& x = inputs.at(0);
  const Tensor& w1 = input_layernorm.weight.data;
  const Tensor& w2 = post_attention_layernorm.weight.data;
  if (differentiable(x) || input_layernorm.style() != nullptr || post_attention_layernorm.style() != nullptr) {
    Tensor h = ops::add(x, self_attn(input_layernorm(x), &args));  // self attention
    return ops::add(h, mlp(post_attention_layernorm(h), &args));   // fully connected
  }
  // Inference, the same numbers in fewer passes over the activations (which
  // every rank repeats at tp > 1): the norms write bf16 straight for bf16
  // projections, and the residual add after attention is fused with the next norm.
  auto dtype_for = [](bool bf16_in) { return bf16_in ? DType::BF16 : DType::F32; };
  const auto* dense = dynamic_cast<const LlamaMLP*>(&mlp);
  Tensor a = ops::rms_norm(x, w1, input_layernorm.eps, dtype_for(self_attn.takes_bf16_input()));
  ops::AddRmsNorm h = ops::add_rms_norm(x, self_attn(a, &args), w2, post_attention_layernorm.eps,
                                        dtype_for(dense != nullptr && dense->takes_bf16_input()));
  return ops::add(h.sum, mlp(h.normed, &args));
}

// ---------------------------------------------------------------- causal LM

namespace {

std::vector<float> inv_freq_for(const ModelConfig& c) {
  const RopeScalingConfig& s = c.rope_scaling;
  if (s.rope_type == "default") return ops::rope_inv_freq(c.head_dim, c.rope_theta);
  if (s.rope_type == "yarn") return yarn_rope_for(c, c.head_dim).inv_freq;
  if (s.rope_type == "llama3")
    return ops::rope_inv_freq(c.head_dim, c.rope_theta,
                              {.rope_type = "llama3",
                               .factor = s.factor,
                               .low_freq_factor = s.low_freq_factor,
                               .high_freq_factor = s.high_freq_factor,
                               .original_max_position_embeddings = s.original_max_position_embeddings});
  if (s.rope_type == "linear") {  // positions / factor, i.e. every frequency / factor
    std::vector<float> f = ops::rope_inv_freq(c.head_dim, c.rope_theta);
    for (float& x : f) x = static_cast<float>(x / s.factor);
    return f;
  }
  fail("rope_scaling type '{}' is not supported for {} models yet; supported: default, linear, llama3, yarn",
       s.rope_type, c.model_type);
}

// Yarn scales cos and sin by its attention factor; the other types do not.
ops::RopeOptions rope_options_for(const ModelConfig& c) {
  if (c.rope_scaling.rope_type != "yarn") return {};
  return {.attention_factor = static_cast<float>(yarn_rope_for(c, c.head_dim).attention_factor)};
}

}  // namespace

parallel::Plan llama_base_tp_plan() {
  return {{"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
          {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
          {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
          {"layers.*.mlp.down_proj", "rowwise"}};
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& config, LlamaVariant variant)
    : CausalLM(config),
      model(add_module(std::make_unique<LlamaModel>("model", config, variant))),
      lm_head(add_module(std::make_unique<nn::Linear>("lm_head", config.hidden_size, config.vocab_size, false))),
      variant_(std::move(variant)),
      inv_freq_(inv_freq_for(config)),
      rope_options_(rope_options_for(config)) {
  TP_CHECK(config.hidden_act == "silu", "{}: hidden_act '{}' is not supported; supported: silu", config.model_type,
           config.hidden_act);
  model.checkpointing = &checkpointing_;
  model.unit_hooks = &unit_hooks_;
}

parallel::Plan LlamaForCausalLM::shipped_ep_plan() const {
  return causal_lm_ep_plan(config_, variant_.default_ep_plan);
}

parallel::Plan LlamaForCausalLM::shipped_plan() const { return causal_lm_plan(config_, variant_.default_plan); }

// Megatron's layout (torch's plan for it): norms and residual adds on sequence
// shards; the attention and MLP blocks gather the sequence once on entry (their
// projections keep their styles, which turn into their sequence-parallel forms);
// the final norm gathers it for lm_head. A replicated embedding keeps its tokens'
// rows; a vocab-parallel one (its style's form) reduce-scatters.
parallel::Plan LlamaForCausalLM::sequence_parallel_plan() const {
  parallel::Plan plan = {{"model.layers.*.input_layernorm", "sequence_parallel"},
                         {"model.layers.*.self_attn", "gather_sequence_input"},
                         {"model.layers.*.post_attention_layernorm", "sequence_parallel"},
                         {"model.layers.*.mlp", "gather_sequence_input"},
                         {"model.norm", "sequence_parallel_gather_output"}};
  const parallel::Plan shipped = shipped_plan();
  if (std::none_of(shipped.begin(), shipped.end(), [](const auto& e) { return e.first == "model.embed_tokens"; }))
    plan.insert(plan.begin(), {"model.embed_tokens", "scatter_sequence_output"});
  return plan;
}

void check_attention_heads(const ModelConfig& c, const AttentionProjections& qkv,
                           const std::function<std::string(const std::string&)>& style_of, int64_t tp_size,
                           parallel::StyleOverrides& overrides) {
  if (style_of(qkv.q->name()) == "colwise")
    TP_CHECK(c.num_attention_heads % tp_size == 0,
             "num_attention_heads {} is not divisible by tp_size {} ('{}' is colwise: each rank needs whole heads)",
             c.num_attention_heads, tp_size, qkv.q->name());
  for (const nn::Linear* kv : {qkv.k, qkv.v}) {
    if (style_of(kv->name()) != "colwise" || c.num_key_value_heads % tp_size == 0) continue;
    TP_CHECK(tp_size % c.num_key_value_heads == 0,
             "num_key_value_heads {} is not divisible by tp_size {}, and tp_size is not a multiple of it either, so "
             "'{}' cannot be split into whole heads (use a tp_size that divides {} or is a multiple of it)",
             c.num_key_value_heads, tp_size, kv->name(), c.num_key_value_heads);
    // tp_size > kv heads: each KV head is held by tp_size / kv consecutive ranks.
    overrides[kv->name()] = std::make_shared<parallel::ColwiseParallel>(
        parallel::ColwiseParallel::Options{.kv_replicas = tp_size / c.num_key_value_heads});
  }
}

parallel::StyleOverrides LlamaForCausalLM::check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const {
  parallel::StyleOverrides overrides;
  auto style_of = [&](const std::string& module) {
    auto it = plan.module_style.find(module);
    return it == plan.module_style.end() ? std::string() : it->second;
  };
  const ModelConfig& c = config_;
  for (const LlamaDecoderLayer* layer : model.layers) {
    const LlamaAttention& a = layer->self_attn;
    check_attention_heads(c, {&a.q_proj, &a.k_proj, &a.v_proj}, style_of, tp_size, overrides);
    if (const auto* moe = dynamic_cast<const SparseMoeBlock*>(&layer->mlp)) {
      const nn::MoeExperts& ex = moe->experts;
      auto style = plan.param_style.find(ex.gate_up_proj.name);
      if (ex.layout().gpt_oss && style != plan.param_style.end() && style->second == "rowwise")
        TP_CHECK(ex.gate_up_proj.global_shape[2] / 2 % tp_size == 0,
                 "intermediate_size {} is not divisible by tp_size {} ('{}' [E, H, 2I] is cut on its last dim into "
                 "whole interleaved (gate, up) column pairs)",
                 ex.gate_up_proj.global_shape[2] / 2, tp_size, ex.gate_up_proj.name);
    }
    if (const auto* dense = dynamic_cast<const LlamaMLP*>(&layer->mlp))
      for (const nn::Linear* m : {&dense->gate_proj, &dense->up_proj})
        if (style_of(m->name()) == "colwise")
          TP_CHECK(c.intermediate_size % tp_size == 0, "intermediate_size {} is not divisible by tp_size {} ('{}')",
                   c.intermediate_size, tp_size, m->name());
  }
  return overrides;
}

std::map<std::string, std::string> LlamaForCausalLM::tied_parameters() const { return tied_lm_head(config_); }

KVState LlamaForCausalLM::make_kv_state(int64_t batch, int64_t max_len) const {
  std::vector<ops::KVCache::Layer> layers;
  for (const LlamaDecoderLayer* layer : model.layers) {
    const nn::Linear& k_proj = layer->self_attn.k_proj;
    int64_t rows = nn::local_shape(k_proj.weight)[0];
    // The cache keeps the model's dtype, as in Transformers: bf16 weights, bf16 keys and values.
    layers.push_back({rows / config_.head_dim, k_proj.weight_dtype() == DType::BF16 ? DType::BF16 : DType::F32});
  }
  return KVState{ops::KVCache::for_layers(batch, max_len, config_.head_dim, layers)};
}

HiddenOutput LlamaForCausalLM::run_decoder(const Tensor& ids_in, const ForwardOptions& options) {
  Tensor ids = batch_of_ids(ids_in, options);
  HiddenOutput out;
  DecoderArgs args = decoder_call(ids, options);
  args.inv_freq = &inv_freq_;
  args.rope = rope_options_;
  if (options.output_router_logits) args.router_logits = &out.router_logits;
  out.hidden = model(ids, &args);  // [B, T, H]
  return out;
}

}  // namespace tp

namespace tp {
LlamaVariant llama_variant(const ModelConfig& config) {
  return {.mlp_bias = config.raw_bool("mlp_bias", false),
          .default_plan = llama_base_tp_plan(),
          .lora_targets = {"q_proj", "v_proj"}};
}
}  // namespace tp
