#include "tp/models/deepseek_v2.h"

#include <algorithm>
#include <cmath>

#include "tp/models/rope_config.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/shape.h"
#include "tp/parallel/mla.h"

namespace tp {

// ---------------------------------------------------------------- rope and scale

MlaRope mla_rope(const ModelConfig& c, const DeepseekSizes& s) {
  const RopeScalingConfig& rs = c.rope_scaling;
  MlaRope r;
  // DeepSeek-V2: complex pairs (x[2i], x[2i+1]). V3 with rope_interleave moves
  // the pairs' halves apart before rotating, in q_pe and k_pe alike: the same dot
  // products, so the same attention; without it, rotate-half.
  r.options.layout = s.rope_interleave ? ops::RopeLayout::Interleaved : ops::RopeLayout::RotateHalf;
  r.scale = 1.0 / std::sqrt(static_cast<double>(s.qk_head_dim()));
  if (rs.rope_type == "default") {
    r.inv_freq = ops::rope_inv_freq(s.qk_rope_head_dim, c.rope_theta);
    return r;
  }
  TP_CHECK(rs.rope_type == "yarn", "{}: rope_scaling type '{}' is not supported for {} models; supported: default, yarn",
           c.source, rs.rope_type, c.model_type);
  // The softmax scale below uses rope_scaling's factor as written.
  ops::YarnRope yarn = yarn_rope_for(c, s.qk_rope_head_dim);
  r.inv_freq = std::move(yarn.inv_freq);
  r.options.attention_factor = static_cast<float>(yarn.attention_factor);
  if (rs.mscale_all_dim.value_or(0) != 0) {
    const double m = ops::yarn_mscale(rs.factor, *rs.mscale_all_dim);
    r.scale *= m * m;
  }
  return r;
}

// ---------------------------------------------------------------- attention

DeepseekV2Attention::DeepseekV2Attention(const std::string& name, const ModelConfig& c, const DeepseekSizes& s)
    : nn::Module(name), sizes_(s) {
  const int64_t H = c.hidden_size, heads = c.num_attention_heads, C = s.kv_lora_rank;
  auto linear = [&](const char* key, int64_t in, int64_t out, bool bias) {
    return &add_module(std::make_unique<nn::Linear>(child_name(key), in, out, bias));
  };
  // Registration order is checkpoint order.
  if (s.q_lora_rank > 0) {
    q_a_proj = linear("q_a_proj", H, s.q_lora_rank, c.attention_bias);
    // Transformers builds both latent norms with RMSNorm's default eps (1e-6), not rms_norm_eps.
    q_a_layernorm = &add_module(std::make_unique<nn::RMSNorm>(child_name("q_a_layernorm"), s.q_lora_rank, 1e-6));
    q_b_proj = linear("q_b_proj", s.q_lora_rank, heads * s.qk_head_dim(), false);
  } else {
    q_proj = linear("q_proj", H, heads * s.qk_head_dim(), false);
  }
  kv_a_proj_with_mqa = linear("kv_a_proj_with_mqa", H, C + s.qk_rope_head_dim, c.attention_bias);
  kv_a_layernorm = &add_module(std::make_unique<nn::RMSNorm>(child_name("kv_a_layernorm"), C, 1e-6));
  kv_b_proj = linear("kv_b_proj", C, heads * (s.qk_nope_head_dim + s.v_head_dim), false);
  o_proj = linear("o_proj", heads * s.v_head_dim, H, c.attention_bias);
}

namespace {

// x [..., D] padded with zeros to [..., width] (no gradient flows to the zeros).
Tensor pad_last(const Tensor& x, int64_t width) {
  const int64_t d = x.size(-1);
  if (d == width) return x;
  Shape zeros = x.shape();
  zeros.back() = width - d;
  return ops::cat({x, Tensor::zeros(zeros)}, -1);
}

}  // namespace

Tensor DeepseekV2Attention::forward(const std::vector<Tensor>& inputs) {
  fail("{}: attention runs inside its decoder layer, which hands it the positions (DecoderArgs)", name());
}

Tensor DeepseekV2Attention::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const DecoderArgs& context = decoder_args(args, *this);
  const Tensor& x = inputs.at(0);  // [B, T, H]
  const int64_t B = x.size(0), T = x.size(1), N = sizes_.qk_nope_head_dim, R = sizes_.qk_rope_head_dim,
                V = sizes_.v_head_dim, C = sizes_.kv_lora_rank;
  Tensor q = q_proj != nullptr ? (*q_proj)(x) : (*q_b_proj)((*q_a_layernorm)((*q_a_proj)(x)));
  q = ops::reshape(q, {B, T, -1, N + R});  // this rank's heads
  Tensor q_nope = ops::narrow(q, 3, 0, N);
  Tensor q_pe = ops::apply_rope(ops::narrow(q, 3, N, R), context.positions, rope->inv_freq, rope->options);

  Tensor compressed = (*kv_a_proj_with_mqa)(x);  // [B, T, C + R]
  Tensor latent = (*kv_a_layernorm)(ops::narrow(compressed, 2, 0, C));
  Tensor k_pe = ops::apply_rope(ops::reshape(ops::narrow(compressed, 2, C, R), {B, T, 1, R}), context.positions,
                                rope->inv_freq, rope->options);

  // Attention over the (cached) latent, expanded to each head's keys and values:
  // q [b, t, heads, N + R], latent [b, L, C], k_pe [b, L, 1, R] -> [b, t, heads, V].
  auto attend = [&](const Tensor& query_nope, const Tensor& query_pe, const Tensor& keys_latent,
                    const Tensor& key_pe, const ops::AttentionOptions& options) {
    const int64_t b = keys_latent.size(0), L = keys_latent.size(1);
    Tensor kv = ops::reshape((*kv_b_proj)(keys_latent), {b, L, -1, N + V});
    const int64_t heads = kv.size(2);
    Tensor key = ops::cat({ops::narrow(kv, 3, 0, N), ops::cat(std::vector<Tensor>(heads, key_pe), 2)}, 3);
    Tensor query = ops::cat({query_nope, query_pe}, 3);
    // The attention op takes one head dim: the shorter of q/k and v is zero-padded
    // (zeros change no dot product and add zero columns to the output).
    const int64_t width = std::max(N + R, V);
    Tensor out = ops::attention(pad_last(query, width), pad_last(key, width),
                                pad_last(ops::narrow(kv, 3, N, V), width), options);
    return width != V ? ops::narrow(out, 3, 0, V) : out;
  };
  Tensor out;
  if (context.cache == nullptr) {
    out = attend(q_nope, q_pe, latent, k_pe, {.scale = rope->scale});
  } else {
    // Cache the latent and k_pe, then attend over every cached token.
    out = with_layer_cache(
        context, layer_index, {q_nope, q_pe, ops::reshape(latent, {B, T, 1, C}), k_pe},
        [&](ops::KVCache& cache, const std::vector<int64_t>& counts, const std::vector<Tensor>& x) {
          ops::AttentionOptions options{.scale = rope->scale};
          options.q_offsets = cache.lengths();
          if (!counts.empty())
            cache.append(x[2], x[3], counts);
          else
            cache.append(x[2], x[3]);
          options.kv_lens = cache.lengths();
          const int64_t b = x[0].size(0);
          const int64_t used = *std::max_element(options.kv_lens.begin(), options.kv_lens.end());
          return attend(x[0], x[1], ops::reshape(cache.keys().narrow(1, 0, used).to(DType::F32), {b, used, C}),
                        cache.values().narrow(1, 0, used).to(DType::F32), options);
        });
  }
  return (*o_proj)(ops::reshape(out, {B, T, -1}));
}

// ---------------------------------------------------------------- decoder layer

DeepseekV2DecoderLayer::DeepseekV2DecoderLayer(const std::string& name, int64_t index, const ModelConfig& c,
                                               const DeepseekSizes& s)
    : nn::Module(name),
      input_layernorm(add_module(
          std::make_unique<nn::RMSNorm>(child_name("input_layernorm"), c.hidden_size, c.rms_norm_eps))),
      self_attn(add_module(std::make_unique<DeepseekV2Attention>(child_name("self_attn"), c, s))),
      post_attention_layernorm(add_module(
          std::make_unique<nn::RMSNorm>(child_name("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps))),
      mlp(s.is_moe_layer(index) ? add_module(std::make_unique<SparseMoeBlock>(child_name("mlp"), c, deepseek_moe_config(c, s)))
                                : static_cast<nn::Module&>(add_module(std::make_unique<LlamaMLP>(child_name("mlp"), c)))) {
  self_attn.layer_index = index;
  dense = dynamic_cast<LlamaMLP*>(&mlp);
  moe = dynamic_cast<SparseMoeBlock*>(&mlp);
}

Tensor DeepseekV2DecoderLayer::forward(const std::vector<Tensor>& inputs) {
  fail("{}: a decoder layer needs its model's DecoderArgs (positions, cache)", name());
}

Tensor DeepseekV2DecoderLayer::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  const Tensor& x = inputs.at(0);
  Tensor h = ops::add(x, self_attn(input_layernorm(x), &args));  // self attention
  return ops::add(h, mlp(post_attention_layernorm(h), &args));   // fully connected
}

// ---------------------------------------------------------------- causal LM

parallel::Plan deepseek_base_tp_plan(const DeepseekSizes& s) {
  parallel::Plan plan;
  if (!s.v3)
    plan = {{s.q_lora_rank > 0 ? "layers.*.self_attn.q_b_proj" : "layers.*.self_attn.q_proj", "colwise"},
            {"layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj"},
            {"layers.*.self_attn.kv_b_proj", "colwise"},
            {"layers.*.self_attn.o_proj", "rowwise"}};
  for (const char* mlp : {"layers.*.mlp.", "layers.*.mlp.shared_experts."}) {
    plan.emplace_back(std::string(mlp) + "gate_proj", "colwise");
    plan.emplace_back(std::string(mlp) + "up_proj", "colwise");
    plan.emplace_back(std::string(mlp) + "down_proj", "rowwise");
  }
  for (auto& entry : moe_experts_tp_plan()) plan.push_back(entry);
  return plan;
}

parallel::Plan deepseek_base_ep_plan() {
  return {{"layers.*.mlp.gate", "ep_router"},
          {"layers.*.mlp.experts.gate_up_proj", "grouped_gemm"},
          {"layers.*.mlp.experts.down_proj", "grouped_gemm"},
          {"layers.*.mlp.experts", "moe_tp_experts"}};
}

DeepseekV2ForCausalLM::DeepseekV2ForCausalLM(const ModelConfig& config)
    : CausalLM(config),
      model(add_module(std::make_unique<DeepseekV2Model>("model", config, deepseek_sizes(config)))),
      lm_head(add_module(std::make_unique<nn::Linear>("lm_head", config.hidden_size, config.vocab_size, false))),
      sizes_(deepseek_sizes(config)),
      rope_(mla_rope(config, sizes_)) {
  TP_CHECK(config.hidden_act == "silu", "{}: hidden_act '{}' is not supported; supported: silu", config.model_type,
           config.hidden_act);
  for (DeepseekV2DecoderLayer* layer : model.layers) {
    layer->self_attn.rope = &rope_;
  }
  model.checkpointing = &checkpointing_;
  model.unit_hooks = &unit_hooks_;
}

parallel::Plan DeepseekV2ForCausalLM::shipped_plan() const {
  return causal_lm_plan(config_, deepseek_base_tp_plan(sizes_));
}

parallel::Plan DeepseekV2ForCausalLM::shipped_ep_plan() const {
  return causal_lm_ep_plan(config_, deepseek_base_ep_plan());
}

parallel::StyleOverrides DeepseekV2ForCausalLM::check_tp(const parallel::ResolvedPlan& plan, int64_t tp_size) const {
  parallel::StyleOverrides overrides;
  auto style_of = [&](const nn::Module* m) {
    auto it = m == nullptr ? plan.module_style.end() : plan.module_style.find(m->name());
    return it == plan.module_style.end() ? std::string() : it->second;
  };
  const ModelConfig& c = config_;
  for (const DeepseekV2DecoderLayer* layer : model.layers) {
    const DeepseekV2Attention& a = layer->self_attn;
    for (const nn::Linear* per_head : {a.q_proj, a.q_b_proj, a.kv_b_proj})
      if (style_of(per_head) == "colwise")
        TP_CHECK(c.num_attention_heads % tp_size == 0,
                 "num_attention_heads {} is not divisible by tp_size {} ('{}' is colwise: each rank needs whole heads)",
                 c.num_attention_heads, tp_size, per_head->name());
    // The style needs the rope width, which only the config knows.
    if (style_of(a.kv_a_proj_with_mqa) == "mla_kv_a_proj")
      overrides[a.kv_a_proj_with_mqa->name()] = std::make_shared<parallel::MlaKvAProjParallel>(
          parallel::MlaKvAProjParallel::Options{.qk_rope_head_dim = sizes_.qk_rope_head_dim});
    const LlamaMLP* mlp = layer->dense != nullptr ? layer->dense : layer->moe->shared_experts;
    if (mlp != nullptr)
      for (const nn::Linear* m : {&mlp->gate_proj, &mlp->up_proj})
        if (style_of(m) == "colwise")
          TP_CHECK(m->weight.global_shape[0] % tp_size == 0, "{} {} is not divisible by tp_size {} ('{}')",
                   layer->dense != nullptr ? "intermediate_size" : "moe_intermediate_size x n_shared_experts",
                   m->weight.global_shape[0], tp_size, m->name());
  }
  return overrides;
}

std::map<std::string, std::string> DeepseekV2ForCausalLM::tied_parameters() const { return tied_lm_head(config_); }

KVState DeepseekV2ForCausalLM::make_kv_state(int64_t batch, int64_t max_len) const {
  // One "head" of the latent (keys) and of k_pe (values) per layer, on every rank.
  std::vector<ops::KVCache::Layer> layers;
  for (const DeepseekV2DecoderLayer* layer : model.layers) {
    const DType dtype = layer->self_attn.kv_b_proj->weight_dtype() == DType::BF16 ? DType::BF16 : DType::F32;
    layers.push_back({1, dtype, sizes_.kv_lora_rank, sizes_.qk_rope_head_dim});
  }
  return KVState{ops::KVCache::for_layers(batch, max_len, sizes_.kv_lora_rank, layers)};
}

HiddenOutput DeepseekV2ForCausalLM::run_decoder(const Tensor& ids_in, const ForwardOptions& options) {
  Tensor ids = batch_of_ids(ids_in, options);
  HiddenOutput out;
  DecoderArgs args = decoder_call(ids, options);  // MLA's rope is the attention's own (rope_)
  if (options.output_router_logits) args.router_logits = &out.router_logits;
  out.hidden = model(ids, &args);  // [B, T, H]
  return out;
}

}  // namespace tp
