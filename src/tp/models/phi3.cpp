#include "tp/models/phi3.h"

#include <algorithm>
#include <cmath>

#include "tp/models/variants.h"
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/rope.h"
#include "tp/ops/shape.h"

namespace tp {

// ---------------------------------------------------------------- attention

Phi3Attention::Phi3Attention(const std::string& name, const ModelConfig& c, int64_t index, const Phi3Options& o)
    : nn::Module(name),
      qkv_proj(add_module(std::make_unique<nn::Linear>(
          child_name("qkv_proj"), c.hidden_size, (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
          false))),
      o_proj(add_module(std::make_unique<nn::Linear>(child_name("o_proj"), c.num_attention_heads * c.head_dim,
                                                     c.hidden_size, false))),
      layer_index(index),
      sliding_window(o.sliding_window),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {}

Tensor Phi3Attention::forward(const std::vector<Tensor>& inputs) {
  fail("{}: attention runs inside its decoder layer, which hands it the positions (DecoderArgs)", name());
}

Tensor Phi3Attention::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const DecoderArgs& context = decoder_args(args, *this);
  const Tensor& x = inputs.at(0);  // [B, T, H]
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  Tensor qkv = qkv_proj(x);  // [B, T, (Hq + 2 Hkv) D], whole on every rank (check_tp)
  TP_CHECK(qkv.size(2) == (heads_ + 2 * kv_heads_) * D,
           "{}: got {} features of the fused q|k|v, which needs all {} to cut it into heads", qkv_proj.name(),
           qkv.size(2), (heads_ + 2 * kv_heads_) * D);
  Tensor q = ops::reshape(ops::narrow(qkv, 2, 0, heads_ * D), {B, T, heads_, D});
  Tensor k = ops::reshape(ops::narrow(qkv, 2, heads_ * D, kv_heads_ * D), {B, T, kv_heads_, D});
  Tensor v = ops::reshape(ops::narrow(qkv, 2, (heads_ + kv_heads_) * D, kv_heads_ * D), {B, T, kv_heads_, D});
  // The first rotary_dim values of each head turn; the rest pass through.
  q = ops::apply_rope(q, context.positions, *context.inv_freq, context.rope);
  k = ops::apply_rope(k, context.positions, *context.inv_freq, context.rope);

  Tensor out = decoder_attention(context, layer_index, q, k, v, {.scale = scale_, .sliding_window = sliding_window});
  return o_proj(ops::reshape(out, {B, T, -1}));
}

// ---------------------------------------------------------------- MLP

Phi3MLP::Phi3MLP(const std::string& name, const ModelConfig& c)
    : nn::Module(name),
      gate_up_proj(add_module(
          std::make_unique<nn::Linear>(child_name("gate_up_proj"), c.hidden_size, 2 * c.intermediate_size, false))),
      down_proj(add_module(
          std::make_unique<nn::Linear>(child_name("down_proj"), c.intermediate_size, c.hidden_size, false))) {}

Tensor Phi3MLP::forward(const std::vector<Tensor>& inputs) {
  // [.., 2I'] with I' = I (gathered, Transformers' plan) or I / tp (packed_colwise: this rank's gate and up rows).
  Tensor gate_up = gate_up_proj(inputs.at(0));
  const int64_t last = gate_up.dim() - 1, half = gate_up.size(last) / 2;
  return down_proj(ops::swiglu(ops::narrow(gate_up, last, 0, half), ops::narrow(gate_up, last, half, half)));
}

// ---------------------------------------------------------------- decoder layer

Phi3DecoderLayer::Phi3DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c,
                                   const Phi3Options& o)
    : nn::Module(name),
      input_layernorm(
          add_module(std::make_unique<nn::RMSNorm>(child_name("input_layernorm"), c.hidden_size, c.rms_norm_eps))),
      self_attn(add_module(std::make_unique<Phi3Attention>(child_name("self_attn"), c, index, o))),
      post_attention_layernorm(add_module(
          std::make_unique<nn::RMSNorm>(child_name("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps))),
      mlp(add_module(std::make_unique<Phi3MLP>(child_name("mlp"), c))) {}

Tensor Phi3DecoderLayer::forward(const std::vector<Tensor>& inputs) {
  fail("{}: a decoder layer needs its model's DecoderArgs (positions, cache)", name());
}

// resid_pdrop, embd_pdrop and attention_dropout are Transformers' training-time
// dropout: inference ignores them as eval mode does, and the Trainer refuses them non-zero.
Tensor Phi3DecoderLayer::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const Tensor& x = inputs.at(0);
  Tensor h = ops::add(x, self_attn(input_layernorm(x), &args));  // self attention
  return ops::add(h, mlp(post_attention_layernorm(h), &args));   // fully connected
}

// ---------------------------------------------------------------- causal LM

namespace {

// config.json's partial_rotary_factor (Transformers 5 files may keep it in rope_parameters).
double partial_rotary_factor(const ModelConfig& c) {
  const nlohmann::json* value = nullptr;
  const char* where = "partial_rotary_factor";
  auto rp = c.raw.find("rope_parameters");
  if (rp != c.raw.end() && rp->is_object() && rp->contains("partial_rotary_factor")) {
    value = &(*rp)["partial_rotary_factor"];
    where = "rope_parameters.partial_rotary_factor";
  } else if (auto it = c.raw.find("partial_rotary_factor"); it != c.raw.end()) {
    value = &*it;
  }
  if (value == nullptr || value->is_null()) return 1.0;
  TP_CHECK(value->is_number() && value->get<double>() > 0 && value->get<double>() <= 1,
           "{}: '{}' must be a number in (0, 1], got {}", c.source, where, value->dump());
  return value->get<double>();
}

int64_t rotary_dim_for(const ModelConfig& c) {
  const double factor = partial_rotary_factor(c);
  const auto dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor);  // int() as Transformers
  TP_CHECK(dim >= 2 && dim % 2 == 0,
           "{}: head_dim {} x partial_rotary_factor {} gives {} rotary dims; RoPE needs a positive even number",
           c.source, c.head_dim, factor, dim);
  return dim;
}

Phi3Options phi3_options(const ModelConfig& c) { return {.sliding_window = sliding_window_key(c, 0)}; }

bool one_of(const std::string& style, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return style == n; });
}

}  // namespace

parallel::Plan phi3_base_tp_plan() {
  return {{"layers.*.self_attn.qkv_proj", "colwise_rep"},
          {"layers.*.self_attn.o_proj", "rowwise_rep"},
          {"layers.*.mlp.gate_up_proj", "colwise_rep"},
          {"layers.*.mlp.down_proj", "rowwise_rep"}};
}

Phi3ForCausalLM::Phi3ForCausalLM(const ModelConfig& config)
    : CausalLM(config),
      model(add_module(std::make_unique<Phi3Model>("model", config, phi3_options(config)))),
      lm_head(add_module(std::make_unique<nn::Linear>("lm_head", config.hidden_size, config.vocab_size, false))),
      rotary_dim_(rotary_dim_for(config)) {
  TP_CHECK(config.hidden_act == "silu", "{}: hidden_act '{}' is not supported for phi3; supported: silu",
           config.source, config.hidden_act);
  const std::string& type = config.rope_scaling.rope_type;
  if (type == "longrope") {
    longrope_ = longrope_for(config, rotary_dim_, 4096);  // Phi3Config's original_max_position_embeddings
    rope_options_.attention_factor = static_cast<float>(longrope_->attention_factor);
  } else {
    TP_CHECK(type == "default", "{}: rope_scaling type '{}' is not supported for phi3; supported: longrope (\"su\")",
             config.source, type);
    inv_freq_ = ops::rope_inv_freq(rotary_dim_, config.rope_theta);
  }
  model.checkpointing = &checkpointing_;
  model.unit_hooks = &unit_hooks_;
}

const std::vector<float>& Phi3ForCausalLM::inv_freq_for(int64_t seq_len) const {
  return longrope_ ? longrope_->inv_freq_for(seq_len) : inv_freq_;
}

parallel::Plan Phi3ForCausalLM::shipped_plan() const { return causal_lm_plan(config_, phi3_base_tp_plan()); }

// The fused outputs are cut into heads (q|k|v) and halves (gate|up) after the
// projection, so each must reach that cut whole (a gathered output), or, for
// gate|up, as matching gate and up slices (packed_colwise); the projection after
// takes what came out: a replicated input split locally, or the slices (rowwise).
parallel::StyleOverrides Phi3ForCausalLM::check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const {
  auto style_of = [&](const nn::Module& m) {
    auto it = plan.module_style.find(m.name());
    return it == plan.module_style.end() ? std::string() : it->second;
  };
  auto require = [&](const nn::Module& m, const std::string& style, std::initializer_list<const char*> allowed,
                     const char* why) {
    if (style.empty() || one_of(style, allowed)) return;
    std::string names;
    for (const char* a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
    fail("'{}' has style '{}', which phi3 cannot run: {}; supported: {} (or none)", m.name(), style, why, names);
  };
  for (const Phi3DecoderLayer* layer : model.layers) {
    const Phi3Attention& a = layer->self_attn;
    const Phi3MLP& m = layer->mlp;
    require(a.qkv_proj, style_of(a.qkv_proj), {"colwise_gather_output", "colwise_rep"},
            "the fused q|k|v is cut into heads after the projection, so every rank needs all of it");
    require(a.o_proj, style_of(a.o_proj), {"rowwise_split_input", "rowwise_rep"},
            "its input (every head's attention) is whole on every rank");
    const std::string gate_up = style_of(m.gate_up_proj);
    require(m.gate_up_proj, gate_up, {"colwise_gather_output", "colwise_rep", "packed_colwise"},
            "gate and up are the two halves of its output");
    if (gate_up == "packed_colwise") {
      TP_CHECK(config_.intermediate_size % tp_size == 0,
               "intermediate_size {} is not divisible by tp_size {} ('{}' is packed_colwise)",
               config_.intermediate_size, tp_size, m.gate_up_proj.name());
      require(m.down_proj, style_of(m.down_proj), {"rowwise"},
              "its input is this rank's slice of the intermediate features (gate_up_proj is packed_colwise)");
      TP_CHECK(!style_of(m.down_proj).empty(), "'{}' needs style rowwise: '{}' is packed_colwise", m.down_proj.name(),
               m.gate_up_proj.name());
    } else {
      require(m.down_proj, style_of(m.down_proj), {"rowwise_split_input", "rowwise_rep"},
              "its input (silu(gate) * up) is whole on every rank");
    }
  }
  return {};
}

std::map<std::string, std::string> Phi3ForCausalLM::tied_parameters() const { return tied_lm_head(config_); }

KVState Phi3ForCausalLM::make_kv_state(int64_t batch, int64_t max_len) const {
  std::vector<ops::KVCache::Layer> layers;
  for (const Phi3DecoderLayer* layer : model.layers) {
    // Every rank keeps every KV head (the fused projection's output is gathered); the model's dtype, as Transformers.
    const nn::Linear& qkv = layer->self_attn.qkv_proj;
    layers.push_back({config_.num_key_value_heads, qkv.weight_dtype() == DType::BF16 ? DType::BF16 : DType::F32});
  }
  return KVState{ops::KVCache::for_layers(batch, max_len, config_.head_dim, layers)};
}

HiddenOutput Phi3ForCausalLM::run_decoder(const Tensor& ids_in, const ForwardOptions& options) {
  Tensor ids = batch_of_ids(ids_in, options);
  const int64_t B = ids.size(0), T = ids.size(1);
  // Transformers' longrope update: the call's largest position + 1 picks the
  // factors (a packed forward's: over its segments, as over a batch's rows).
  int64_t seq_len = 0;
  for (const PackedSegment& s : options.segments)
    seq_len = std::max(seq_len, options.cache->lengths()[static_cast<size_t>(s.row)] + s.tokens);
  for (int64_t b = 0; b < B && options.segments.empty(); ++b) {
    const int64_t cached = options.cache != nullptr ? options.cache->lengths()[b] : 0;
    const int64_t added = options.cache != nullptr && !options.counts.empty() ? options.counts.at(b) : T;
    seq_len = std::max(seq_len, cached + added);
  }
  HiddenOutput out;
  DecoderArgs args = decoder_call(ids, options);
  args.inv_freq = &inv_freq_for(seq_len);
  args.rope = rope_options_;
  out.hidden = model(ids, &args);  // [B, T, H]
  return out;
}

}  // namespace tp
